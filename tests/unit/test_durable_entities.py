"""Durable entities (`App.entity`) on the pure core: exclusive calls one at a time per key
in arrival order, the key's state carried by its lock, shared reads, calls from workflows,
failures, cancels, duplicates, cycles and a restore (no Kafka)."""

from __future__ import annotations

import pytest

import runstream
from examples.testing import test_ledger_entity as example
from runstream import App
from runstream.engine import payload
from runstream.engine.entities import ENTITY_STATE_MAX_BYTES, SHOW, call_input
from runstream.engine.reducer import fold
from runstream.schemas.records import (
    LiveQuery,
    Pause,
    QueryAnswer,
    Retry,
    StartRun,
    Unpause,
    entity_call_id,
    entity_lock_id,
    entity_workflow,
)

from .corehelp import Core

app = App("unit")
bodies: list[tuple[str, str]] = []
out_of_stock: set[str] = set()


@app.step()
def reserve(item: str) -> str:
    bodies.append(("reserve", item))
    return f"reserved {item}"


@app.step(retries=0)
def take(item: str) -> str:
    if item in out_of_stock:
        raise RuntimeError(f"no {item}")
    return item


@app.entity("cart")
class Cart:
    async def take(ctx: runstream.EntityContext, item: str) -> int:
        items = ctx.state.get("items", [])
        items.append(await ctx.step(take, item))
        ctx.state.set("items", items)
        return len(items)

    async def add(ctx: runstream.EntityContext, item: str) -> int:
        items = ctx.state.get("items", [])
        await ctx.step(reserve, item)
        items.append(item)
        ctx.state.set("items", items)
        return len(items)

    async def add_later(ctx: runstream.EntityContext, item: str) -> int:
        await ctx.sleep(60)
        items = [*ctx.state.get("items", []), item]
        ctx.state.set("items", items)
        return len(items)

    async def broken(ctx: runstream.EntityContext, _: None) -> None:
        ctx.state.set("items", ["lost"])
        raise RuntimeError("out of stock")

    async def empty(ctx: runstream.EntityContext, _: None) -> None:
        ctx.state.clear()

    async def hoard(ctx: runstream.EntityContext, size: int) -> None:
        ctx.state.set("blob", "x" * size)

    async def call_self(ctx: runstream.EntityContext, _: None) -> int:
        return int(await ctx.entity("cart", ctx.key).call("add", "loop"))

    @runstream.shared
    def count(ctx: runstream.SharedContext, _: None) -> int:
        return len(ctx.state.get("items", []))

    @runstream.shared
    def clear_all(ctx: runstream.SharedContext, _: None) -> None:
        ctx.state.clear()


@app.workflow()
async def shopper(ctx: runstream.Context, key: str) -> list[int]:
    first = await ctx.entity("cart", key).call("add", "apple")
    second = await ctx.entity("cart", key).call("add", "pear")
    return [first, second]


@app.workflow(timeout="30s")
async def impatient(ctx: runstream.Context, key: str) -> int:
    return int(await ctx.entity("cart", key).call("add", "plum"))


@pytest.fixture(autouse=True)
def _fresh() -> None:
    bodies.clear()
    out_of_stock.clear()


def pump(core: Core) -> None:
    """Deliver the commands runs and entities sent each other, until none is left."""
    while core.commands:
        core.command(core.commands.pop(0))


def call(core: Core, key: str, call_id: str, handler: str, arg: object = None) -> str:
    run_id = entity_call_id("cart", key, call_id)
    core.start(run_id, entity_workflow("cart"), call_input(key, handler, arg))
    return run_id


def output(core: Core, run_id: str) -> dict:
    st = core.state(run_id)
    assert st.status == "completed", (st.status, st.error)
    return payload.loads(st.output)


def read(core: Core, key: str, handler: str, arg: object = None, entity: str = "cart"):
    asked = payload.dumps({"entity": entity, "key": key, "arg": arg})
    cmd = LiveQuery(entity_lock_id("cart", key), "q", reply_to="me", name=handler, arg=asked)
    core.command(cmd)
    answer = core.replies[-1][1]
    assert isinstance(answer, QueryAnswer)
    return answer


def test_exclusive_calls_of_one_key_run_one_at_a_time_in_arrival_order_and_keep_state():
    core = Core(app.registry)
    a = call(core, "ann", "1", "add_later", "apple")
    b = call(core, "ann", "2", "add", "pear")
    other = call(core, "bob", "1", "add", "fig")
    pump(core)
    assert core.state(other).status == "completed"  # another key never waits
    assert core.state(b).status == "running" and not core.facts(b, "StepStarted")
    lock = core.state(entity_lock_id("cart", "ann"))
    assert [h for h, _ in lock.held] == [a] and [q.holder for q in lock.queue] == [b]
    core.advance(60)
    pump(core)
    assert output(core, a) == {"result": 1, "state": {"items": ["apple"]}}
    assert output(core, b) == {"result": 2, "state": {"items": ["apple", "pear"]}}
    assert output(core, other)["state"] == {"items": ["fig"]}
    assert bodies == [("reserve", "fig"), ("reserve", "pear")]
    ann = core.state(entity_lock_id("cart", "ann"))
    assert payload.loads(ann.value) == {"items": ["apple", "pear"]} and not ann.held


def test_a_failed_call_changes_no_state_and_the_next_call_runs():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "apple")
    bad = call(core, "ann", "2", "broken")
    after = call(core, "ann", "3", "add", "pear")
    pump(core)
    assert core.state(bad).status == "failed" and "out of stock" in core.state(bad).error
    assert output(core, after)["state"] == {"items": ["apple", "pear"]}


def test_a_call_that_leaves_a_state_over_its_cap_fails_and_changes_no_state():
    """The state travels inline with the key's lock (Grant/Release), never as a large
    payload: past its cap the call fails, before any record could outgrow Kafka's limit."""
    core = Core(app.registry)
    call(core, "ann", "1", "add", "apple")
    big = call(core, "ann", "2", "hoard", ENTITY_STATE_MAX_BYTES)
    after = call(core, "ann", "3", "add", "pear")
    pump(core)
    assert core.state(big).status == "failed"
    assert "entity state" in core.state(big).error and "cap" in core.state(big).error
    assert output(core, after)["state"] == {"items": ["apple", "pear"]}


def test_a_cancelled_call_changes_no_state_and_a_queued_one_leaves_the_queue():
    core = Core(app.registry)
    running = call(core, "ann", "1", "add_later", "apple")
    queued = call(core, "ann", "2", "add", "pear")
    pump(core)
    core.cancel(queued)
    pump(core)
    lock = core.state(entity_lock_id("cart", "ann"))
    assert not lock.queue and [h for h, _ in lock.held] == [running]
    core.cancel(running)
    pump(core)
    lock = core.state(entity_lock_id("cart", "ann"))
    assert not lock.held and lock.value is None  # nothing committed: no state
    fig = call(core, "ann", "3", "add", "fig")
    pump(core)
    assert output(core, fig)["state"] == {"items": ["fig"]}


def test_a_duplicate_call_runs_once():
    core = Core(app.registry)
    first = call(core, "ann", "same", "add", "apple")
    again = call(core, "ann", "same", "add", "apple")
    pump(core)
    assert first == again and output(core, first)["result"] == 1
    assert bodies == [("reserve", "apple")]
    assert len(core.facts(first, "RunStarted")) == 1


def test_shared_reads_answer_from_the_committed_state_without_waiting():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "apple")
    call(core, "ann", "2", "add_later", "pear")  # holds the lock
    pump(core)
    assert payload.loads(read(core, "ann", "count").value) == 1  # not behind the call
    show = payload.loads(read(core, "ann", SHOW).value)
    assert show["state"] == {"items": ["apple"]} and show["queue"] == []
    assert show["in_progress"] == [entity_call_id("cart", "ann", "2")]
    assert show["waits_on"] == {entity_call_id("cart", "ann", "2"): ["sleep"]}
    refused = read(core, "ann", "clear_all")  # a shared handler cannot write
    assert "only an exclusive one changes it" in refused.error
    assert "no shared handler 'nope'" in read(core, "ann", "nope").error
    assert "no entity 'shop'" in read(core, "ann", "count", entity="shop").error
    facts = len(core.journal)
    read(core, "ann", "count")
    assert len(core.journal) == facts  # a read records nothing


def test_a_workflow_calls_an_entity_as_a_journaled_child_once():
    core = Core(app.registry)
    core.start("w", "shopper", "ann")
    pump(core)
    assert output(core, "w") == [1, 2]
    assert bodies == [("reserve", "apple"), ("reserve", "pear")]
    assert [f.status for f in core.facts("w", "ChildEnded")] == ["completed", "completed"]
    core.states.pop("w")  # a replay from the journal returns the recorded results
    core.recover("w")
    assert bodies == [("reserve", "apple"), ("reserve", "pear")]


def test_a_call_cycle_fails_at_once_instead_of_waiting_forever():
    core = Core(app.registry)
    loop = call(core, "ann", "1", "call_self")
    pump(core)
    st = core.state(loop)
    assert st.status == "failed" and "ChildFailed" in st.error
    assert "call cycle" in core.facts(loop, "ChildEnded")[0].error
    assert not core.state(entity_lock_id("cart", "ann")).held


def test_an_unknown_handler_or_a_malformed_call_is_refused_clearly():
    core = Core(app.registry)
    unknown = call(core, "ann", "1", "nope")
    pump(core)
    assert "no exclusive handler 'nope'" in core.state(unknown).error
    core.command(StartRun("x", entity_workflow("cart"), input=b'{"handler": "add"}'))
    assert core.dead[-1].code == "invalid-input" and "needs a text key" in core.dead[-1].reason


def test_a_restored_partition_keeps_the_state_the_queue_and_the_call_in_progress():
    core = Core(app.registry)
    call(core, "ann", "1", "add", "apple")
    a = call(core, "ann", "2", "add_later", "pear")
    b = call(core, "ann", "3", "add", "fig")
    pump(core)
    lock_id = entity_lock_id("cart", "ann")
    assert fold(lock_id, core.facts(lock_id)) == core.state(lock_id)
    for run_id in (a, b):  # as a new owner: everything from the journal
        core.states[run_id] = fold(run_id, core.facts(run_id))
    core.states[lock_id] = fold(lock_id, core.facts(lock_id))
    core.advance(60)
    pump(core)
    assert output(core, b)["state"] == {"items": ["apple", "pear", "fig"]}
    assert bodies == [("reserve", "apple"), ("reserve", "fig")]


def test_entities_are_declared_once_with_handlers():
    with pytest.raises(ValueError, match="registered twice"):
        app.entity("cart")(Cart)
    with pytest.raises(TypeError, match="no handlers"):
        app.entity("nothing")(type("Nothing", (), {}))


def test_the_workflow_tester_calls_reads_and_shows_an_entity():
    from runstream.testing import RunNotFinished, WorkflowTester

    t = WorkflowTester(app)
    ann = t.entity("cart", "ann")
    assert ann.call("add", "apple") == 1
    later = ann.start("add_later", "pear")
    queued = ann.start("add", "fig")
    with pytest.raises(RunNotFinished):
        queued.result()
    assert ann.read("count") == 1
    assert ann.show()["queue"] == [queued.run_id]
    t.run_until_idle()
    assert later.result()["result"] == 2 and queued.result()["result"] == 3
    assert t.start(shopper, "bob").result() == [1, 2]
    assert t.entity("cart", "bob").show()["state"] == {"items": ["apple", "pear"]}


def test_a_clients_call_ids_land_on_the_partition_of_the_keys_lock():
    from runstream.engine.partitioner import partition_for

    def part(run_id: str) -> int:
        return partition_for(run_id.encode(), 12)

    home = part(entity_lock_id("cart", "ann"))
    ids = {entity_call_id("cart", "ann", f"c{i}", part) for i in range(20)}
    assert len(ids) == 20 and {part(i) for i in ids} == {home}
    assert entity_call_id("cart", "ann", "c1", part) in ids  # the same call: the same id
    long_key = "k/" + "x" * 300
    assert len(entity_call_id("cart", long_key, "c", part).encode()) <= 255


def test_a_retried_failed_call_takes_the_key_again_and_reads_the_state_as_it_is_then():
    core = Core(app.registry)
    out_of_stock.add("kiwi")
    failed = call(core, "ann", "1", "take", "kiwi")
    pump(core)
    assert core.state(failed).status == "failed"
    call(core, "ann", "2", "add", "apple")  # runs meanwhile
    pump(core)
    out_of_stock.clear()
    core.command(Retry(failed, "restocked", retry_id="r1"))
    pump(core)
    assert output(core, failed) == {"result": 2, "state": {"items": ["apple", "kiwi"]}}


def test_a_paused_call_keeps_the_key_until_its_unpause():
    core = Core(app.registry)
    held = call(core, "ann", "1", "add_later", "apple")
    queued = call(core, "ann", "2", "add", "pear")
    pump(core)
    core.command(Pause(held, "look", by="ops"))
    core.advance(60)
    pump(core)
    assert core.state(queued).status == "running" and not core.facts(queued, "StepStarted")
    core.command(Unpause(held, "go", by="ops"))
    pump(core)
    assert output(core, queued)["state"] == {"items": ["apple", "pear"]}


def test_a_callers_run_timeout_withdraws_its_queued_call_and_changes_no_state():
    core = Core(app.registry)
    held = call(core, "ann", "1", "add_later", "apple")
    core.start("w", "impatient", "ann")
    pump(core)
    lock = core.state(entity_lock_id("cart", "ann"))
    assert len(lock.queue) == 1
    core.advance(30)  # the caller times out; its call, queued, is cancelled
    pump(core)
    assert core.state("w").status == "failed"
    lock = core.state(entity_lock_id("cart", "ann"))
    assert not lock.queue
    core.advance(60)
    pump(core)
    assert output(core, held)["state"] == {"items": ["apple"]}
    assert not core.state(entity_lock_id("cart", "ann")).held


@app.entity("counter")
class Counter:
    """Handlers as static methods, as type checkers like them."""

    @staticmethod
    async def bump(ctx: runstream.EntityContext, by: int) -> int:
        n = int(ctx.state.get("n", 0)) + by
        ctx.state.set("n", n)
        return n

    @staticmethod
    @runstream.shared
    def value(ctx: runstream.SharedContext, _: None) -> int:
        return int(ctx.state.get("n", 0))

    def _helper(self) -> None:  # private: not a handler
        raise AssertionError


def test_handlers_may_be_static_methods_and_private_names_are_no_handlers():
    from runstream.testing import WorkflowTester

    t = WorkflowTester(app)
    counter = t.entity("counter", "a")
    assert counter.call("bump", 2) == 2 and counter.read("value") == 2
    assert set(app.registry.entities["counter"].exclusive) == {"bump"}
    assert set(app.registry.entities["counter"].shared) == {"value"}


@pytest.mark.parametrize("name", sorted(n for n in vars(example) if n.startswith("test_")))
def test_the_example_test_file_passes(name):
    getattr(example, name)()
