"""A workflow reads an entity's key (`EntityRef.read`), and call cycles through workflows
in between are refused (`CHAIN_HEADER`), on the pure core (no Kafka)."""

from __future__ import annotations

import pytest

import runstream
from runstream import App
from runstream.engine import payload
from runstream.engine.entities import call_input
from runstream.engine.reducer import fold
from runstream.errors import QueryFailed, QueryTimeout
from runstream.schemas.records import (
    TO_RUN,
    CompletePromise,
    LiveQuery,
    Pause,
    Retry,
    Signal,
    StartRun,
    Unpause,
    Update,
    entity_call_id,
    entity_lock_id,
    entity_workflow,
)

from .corehelp import Core

app = App("reads")
asked: list[str] = []  # the keys a shared handler was evaluated on


@app.entity("cart")
class Cart:
    @staticmethod
    async def add(ctx: runstream.EntityContext, item: str) -> int:
        items = [*ctx.state.get("items", []), item]
        ctx.state.set("items", items)
        return len(items)

    @staticmethod
    async def add_later(ctx: runstream.EntityContext, item: str) -> int:
        await ctx.sleep(60)
        items = [*ctx.state.get("items", []), item]
        ctx.state.set("items", items)
        return len(items)

    @staticmethod
    async def via_workflow(ctx: runstream.EntityContext, key: str) -> int:
        """Calls cart[key] through a child workflow: a cycle when key is its own."""
        return int(await ctx.child(adds_to, key))

    @staticmethod
    async def via_two(ctx: runstream.EntityContext, key: str) -> int:
        return int(await ctx.child(relays, key))

    @staticmethod
    async def via_started(ctx: runstream.EntityContext, key: str) -> str:
        handle = await ctx.start_child(adds_to, key, run_id=f"bg-{ctx.key}")
        await ctx.sleep(60)  # the child runs meanwhile
        return str(handle.run_id)

    @staticmethod
    async def via_abandoned(ctx: runstream.EntityContext, key: str) -> str:
        handle = await ctx.start_child(adds_to, key, run_id="free", parent_close="abandon")
        return str(handle.run_id)

    @staticmethod
    async def peek_self(ctx: runstream.EntityContext, _: None) -> int:
        """A shared read of its own key never waits for the lock: no cycle."""
        return int(await ctx.entity("cart", ctx.key).read("count"))

    @staticmethod
    @runstream.shared
    def count(ctx: runstream.SharedContext, _: None) -> int:
        asked.append(ctx.key)
        return len(ctx.state.get("items", []))

    @staticmethod
    @runstream.shared
    def broken(ctx: runstream.SharedContext, _: None) -> int:
        raise RuntimeError("cannot count")

    @staticmethod
    @runstream.shared
    def tenant(ctx: runstream.SharedContext, _: None) -> str | None:
        return ctx.headers.get("tenant")

    @staticmethod
    async def add_as(ctx: runstream.EntityContext, item: str) -> str | None:
        ctx.state.set("items", [*ctx.state.get("items", []), item])
        return ctx.headers.get("tenant")


@app.workflow()
async def adds_to(ctx: runstream.Context, key: str) -> int:
    return int(await ctx.entity("cart", key).call("add", "gift"))


@app.workflow()
async def relays(ctx: runstream.Context, key: str) -> int:
    return int(await ctx.child(adds_to, key))


@app.workflow()
async def counts(ctx: runstream.Context, key: str) -> list[int]:
    before = await ctx.entity("cart", key).read("count")
    await ctx.entity("cart", key).call("add", "apple")
    after = await ctx.entity("cart", key).read("count")
    return [before, after]


@app.workflow()
async def reads(ctx: runstream.Context, handler: str) -> object:
    try:
        return await ctx.entity("cart", "ann").read(handler)
    except QueryFailed as exc:
        return f"failed: {exc}"


@app.workflow()
async def reads_within(ctx: runstream.Context, seconds: float) -> object:
    try:
        return await ctx.entity("cart", "ann").read("count", timeout=seconds)
    except QueryTimeout as exc:
        return f"timed out: {exc}"


@app.workflow(timeout="30s")
async def reads_once(ctx: runstream.Context, _: None) -> int:
    return int(await ctx.entity("cart", "ann").read("count"))


@app.workflow()
async def peeks_then_goes_on(ctx: runstream.Context, n: int) -> int:
    async def peek(_: None) -> int:
        return int(await ctx.entity("cart", "ann").read("count"))

    ctx.update_handler("peek", peek)
    await ctx.wait_for_signal("go")
    if n == 0:
        ctx.continue_as_new(1)
    return n


@pytest.fixture(autouse=True)
def _fresh() -> None:
    asked.clear()


def pump(core: Core, keep: type | None = None) -> list:
    """Deliver the commands runs and entities sent each other; those of type ``keep``
    are held back (not delivered yet) and returned."""
    held = []
    while core.commands:
        cmd = core.commands.pop(0)
        if keep is not None and isinstance(cmd, keep):
            held.append(cmd)
        else:
            core.command(cmd)
    return held


def call(core: Core, key: str, call_id: str, handler: str, arg: object = None) -> str:
    run_id = entity_call_id("cart", key, call_id)
    core.start(run_id, entity_workflow("cart"), call_input(key, handler, arg))
    return run_id


def output(core: Core, run_id: str) -> object:
    st = core.state(run_id)
    assert st.status == "completed", (st.status, st.error)
    return payload.loads(st.output)


def test_a_workflows_read_is_asked_once_and_its_recorded_answer_replayed():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "pear")
    pump(core)
    core.start("w", "counts", "ann")
    pump(core)
    assert output(core, "w") == [1, 2]
    assert asked == ["ann", "ann"]
    answers = [payload.loads(f.value) for f in core.facts("w", "PromiseCompleted")]
    assert answers == [1, 2]
    core.states.pop("w")  # a new owner: everything from the journal, nothing asked again
    core.states["w"] = fold("w", core.facts("w"))
    core.recover("w")
    pump(core)
    assert asked == ["ann", "ann"] and output(core, "w") == [1, 2]


def test_a_read_never_waits_behind_an_exclusive_call_and_sees_the_committed_state():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "apple")
    pump(core)
    holder = call(core, "ann", "2", "add_later", "pear")  # holds the key, sleeping
    core.start("w", "reads", "count")
    pump(core)
    assert output(core, "w") == 1  # the state before the call in progress
    assert core.state(holder).status == "running"  # still holding the key


def test_a_read_of_a_key_never_written_reads_an_empty_state():
    core = Core(app.registry)
    core.start("w", "reads", "count")
    pump(core)
    assert output(core, "w") == 0
    assert not core.facts(entity_lock_id("cart", "ann"))  # a read records nothing there


def test_a_raising_or_unknown_shared_handler_raises_query_failed_in_the_workflow():
    core = Core(app.registry)
    core.start("w1", "reads", "broken")
    core.start("w2", "reads", "nope")
    pump(core)
    assert output(core, "w1") == "failed: RuntimeError: cannot count"
    assert "no shared handler 'nope'" in str(output(core, "w2"))
    assert not core.dead


def test_a_read_asked_during_a_handover_is_answered_by_the_next_owner():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "apple")
    pump(core)
    core.start("w", "reads", "count")
    held = pump(core, keep=LiveQuery)  # the ask is on the log; its partition changes owner
    assert [q.reply_to for q in held] == [TO_RUN] and core.state("w").status == "running"
    lock = entity_lock_id("cart", "ann")
    for run_id in ("w", lock):  # the next owner restores both from their journals
        core.states[run_id] = fold(run_id, core.facts(run_id))
    for q in held:
        core.command(q)
    pump(core)
    assert output(core, "w") == 1


def test_a_duplicate_answer_or_one_after_a_cancel_or_continue_as_new_is_dropped():
    core = Core(app.registry)
    core.start("w", "reads", "count")
    held = pump(core, keep=LiveQuery)
    core.cancel("w")
    pump(core)
    assert core.state("w").status == "cancelled"
    for q in held:
        core.command(q)
    pump(core)
    assert not core.dead and not core.facts("w", "PromiseCompleted")
    core.start("c", "peeks_then_goes_on", 0)
    core.command(Update("c", "peek", update_id="u1", arg=b"null", reply_to="me"))
    held = pump(core, keep=LiveQuery)
    assert len(held) == 1
    core.command(Signal("c", "go", payload=b"null", signal_id="s1"))
    pump(core)
    assert core.state("c").continued_as
    core.command(held[0])
    pump(core)
    assert not core.dead and not core.facts("c", "PromiseCompleted")
    core.start("d", "reads", "count")
    pump(core)
    done = core.facts("d", "PromiseCompleted")[0]
    again = CompletePromise("d", f"d/promise/{done.seq}", value=b"5", read=True)
    core.command(again)  # a redriven ask's second answer
    assert not core.dead and output(core, "d") == 0


def test_a_paused_runs_answer_is_kept_till_its_unpause_and_a_duplicate_start_asks_once():
    core = Core(app.registry)
    core.start("w", "reads", "count")
    core.start("w", "reads", "count")  # the same StartRun again
    held = pump(core, keep=LiveQuery)
    assert len(held) == 1
    core.command(Pause("w", "look", by="ops"))
    for q in held:
        core.command(q)
    pump(core)
    assert core.state("w").status == "paused" and core.facts("w", "PromiseCompleted")
    core.command(Unpause("w", "go", by="ops"))
    pump(core)
    assert output(core, "w") == 0 and asked == ["ann"]
    waits = [e.reason for e in core.lifecycle if e.run_id == "w" and e.reason]
    assert "waiting for the answer of 'count' of '~limit/entity:cart/ann'" in waits


def test_a_read_in_flight_when_its_run_times_out_is_kept_for_the_runs_retry():
    core = Core(app.registry)
    core.start("w", "reads_once")
    held = pump(core, keep=LiveQuery)
    core.advance(30)
    pump(core)
    assert core.state("w").status == "failed"
    for q in held:
        core.command(q)
    pump(core)
    assert not core.dead
    core.command(Retry("w", "again", retry_id="r1"))
    pump(core)
    assert output(core, "w") == 0 and asked == ["ann"]


def test_a_read_unanswered_by_its_timeout_raises_query_timeout_and_its_late_answer_is_dropped():
    core = Core(app.registry)
    core.start("w", "reads_within", 5)
    held = pump(core, keep=LiveQuery)  # its partition has no owner: nobody answers
    core.advance(5)
    pump(core)
    out = output(core, "w")
    assert isinstance(out, str) and out.startswith("timed out: ")
    assert "'count' of entity 'cart' key 'ann'" in out
    for q in held:  # the owner answers at last
        core.command(q)
    pump(core)
    assert not core.dead and output(core, "w") == out
    assert [f.timed_out for f in core.facts("w", "PromiseCompleted")] == [True]


def test_a_reads_timeout_armed_before_a_handover_fires_on_the_next_owner():
    core = Core(app.registry)
    core.start("w", "reads_within", 5)
    pump(core, keep=LiveQuery)  # asked; nobody answers
    core.states["w"] = fold("w", core.facts("w"))  # the next owner, from the journal
    assert core.state("w").timers()  # the read's timeout is armed there too
    core.advance(5)
    pump(core)
    assert str(output(core, "w")).startswith("timed out: ")


def test_a_read_answered_before_its_timeout_returns_and_its_timeout_never_fires():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "pear")
    pump(core)
    core.start("w", "reads_within", 5)
    pump(core)
    assert output(core, "w") == 1 and not core.state("w").timers()
    core.advance(10)
    pump(core)
    assert [f.timed_out for f in core.facts("w", "PromiseCompleted")] == [False]


def test_an_outbound_interceptor_sees_a_workflows_read_and_may_change_its_argument():
    seen: list[tuple[str, str, str, object, float | None, bool]] = []

    class Reads(runstream.interceptors.WorkflowOutbound):
        async def entity_read(self, input: runstream.interceptors.EntityReadInput) -> object:
            read = (input.entity, input.key, input.handler, input.arg, input.timeout)
            seen.append((*read, input.is_replaying))
            input.key = "bob"  # read another key than the code asked for
            return await self.next.entity_read(input)

    class Tracing(runstream.interceptors.Interceptor):
        def workflow_outbound(self, next: runstream.interceptors.WorkflowOutbound) -> Reads:
            return Reads(next)

    traced = App("reads-traced", interceptors=[Tracing()])
    traced.entity("cart")(Cart)
    traced.workflow()(reads_within)
    core = Core(traced.registry)
    call(core, "bob", "1", "add", "pear")
    pump(core)
    core.start("w", "reads_within", 5)
    pump(core)
    assert output(core, "w") == 1 and asked == ["bob"]  # bob's cart, not ann's
    assert seen[0] == ("cart", "ann", "count", None, 5.0, False)


def test_a_workflows_read_carries_its_outbound_headers_to_the_shared_handler():
    """The headers an outbound interceptor sees for a read (the run's, plus any it sets)
    travel with the ask to the key's owner: the shared handler reads them."""

    class Tags(runstream.interceptors.WorkflowOutbound):
        async def entity_read(self, input: runstream.interceptors.EntityReadInput) -> object:
            input.headers = {**input.headers, "tenant": "acme"}
            return await self.next.entity_read(input)

    class Tagging(runstream.interceptors.Interceptor):
        def workflow_outbound(self, next: runstream.interceptors.WorkflowOutbound) -> Tags:
            return Tags(next)

    tagged = App("reads-tagged", interceptors=[Tagging()])
    tagged.entity("cart")(Cart)
    tagged.workflow()(reads)
    core = Core(tagged.registry)
    start = StartRun("w", "reads", input=payload.dumps("tenant"), headers={"traceparent": "00-ab"})
    core.command(start)
    (ask,) = pump(core, keep=LiveQuery)
    assert ask.headers == {"traceparent": "00-ab", "tenant": "acme"}
    core.command(ask)
    pump(core)
    assert output(core, "w") == "acme"


def test_a_clients_read_and_call_carry_their_headers_to_the_handlers():
    from runstream.testing import WorkflowTester

    t = WorkflowTester(app)
    cart = t.entity("cart", "ann")
    assert cart.read("tenant", headers={"tenant": "acme"}) == "acme"
    assert cart.read("tenant") is None
    run = t.start(
        entity_workflow("cart"), call_input("ann", "add_as", "pear"), headers={"tenant": "zed"}
    )
    assert run.result()["result"] == "zed"


def test_the_workflow_tester_runs_a_workflows_read():
    from runstream.testing import WorkflowTester

    t = WorkflowTester(app)
    t.entity("cart", "ann").call("add", "apple")
    assert t.start(counts, "ann").result() == [1, 2]
    assert t.start(reads, "broken").result() == "failed: RuntimeError: cannot count"


# -- cycles through workflows in between ------------------------------------------------


def test_a_cycle_through_one_workflow_is_refused_at_its_start_as_a_direct_one():
    core = Core(app.registry)
    loop = call(core, "ann", "1", "via_workflow", "ann")
    pump(core)
    st = core.state(loop)
    assert st.status == "failed" and "call cycle: cart['ann'] -> cart['ann']" in st.error
    assert not core.state(entity_lock_id("cart", "ann")).held  # the key is free again
    after = call(core, "ann", "2", "add", "apple")
    pump(core)
    assert output(core, after)["result"] == 1


def test_a_cycle_through_two_levels_of_workflows_is_refused():
    core = Core(app.registry)
    loop = call(core, "ann", "1", "via_two", "ann")
    pump(core)
    assert "call cycle: cart['ann'] -> cart['ann']" in core.state(loop).error


def test_a_cycle_through_a_started_child_is_refused_but_not_through_an_abandoned_one():
    core = Core(app.registry)
    call(core, "ann", "1", "via_started", "ann")
    pump(core)
    child = core.state("bg-ann")
    assert child.status == "failed" and "call cycle" in child.error
    call(core, "ann", "2", "via_abandoned", "ann")  # may outlive the call: takes the key later
    pump(core)
    core.advance(60)  # the first call's sleep ends, then the second call's, then the child's
    pump(core)
    assert output(core, "free") == 1


def test_the_same_entity_with_another_key_through_workflows_is_no_cycle():
    core = Core(app.registry)
    one = call(core, "ann", "1", "via_workflow", "bob")
    two = call(core, "ann", "2", "via_two", "bob")
    pump(core)
    assert output(core, one)["result"] == 1 and output(core, two)["result"] == 2


def test_a_handler_reads_its_own_key_without_a_cycle():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "apple")
    peek = call(core, "ann", "2", "peek_self")
    pump(core)
    assert output(core, peek)["result"] == 1
