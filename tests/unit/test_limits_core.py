"""Flow control in the pure core: permits owned by a limit entity (no Kafka).

Commands between runs and limit entities are delivered by `pump`, as Kafka would.
"""

from __future__ import annotations

import itertools

import pytest

from runstream import App
from runstream.audit.rules import check_run
from runstream.engine import payload
from runstream.engine.rules import limits
from runstream.engine.state import RunState
from runstream.engine.work import Batch, StepJob, StepOutcome
from runstream.schemas.records import (
    RUN_PERMIT_SEQ,
    Acquire,
    Grant,
    Release,
    Retry,
    limit_id,
)

from .corehelp import Core

app = App("unit")
app.limit("payments", concurrency=2)
app.limit("mail", rate=10, burst=1)  # one grant per 100 ms, none ahead
app.limit("export", concurrency=1)
calls: list[str] = []


@app.step(group="payments")
def charge(order: str) -> str:
    raise AssertionError("remote")


@app.step(queue="mail", retries=0)
def send(to: str) -> str:
    calls.append(to)
    return to


@app.step(queue="export", retries=1, backoff=1)
def export(tenant: str, n: int) -> str:
    calls.append(f"{tenant}{n}")
    return tenant


@app.workflow
async def pay(ctx, order: str) -> str:
    return await ctx.step(charge, order)


@app.workflow
async def mail(ctx, to: str) -> str:
    return await ctx.step(send, to)


@app.workflow
async def exports(ctx, job: dict) -> str:
    return await ctx.step(export, job["tenant"], job["n"], **job.get("opts", {}))


@app.workflow(concurrency_key=lambda order: order["customer"], limit=1, max_queued=1)
async def checkout(ctx, order: dict) -> str:
    await ctx.wait_for_signal("go")
    return order["id"]


@app.step(retries=0)
def flaky(n: int) -> int:
    if n in calls:
        return n
    calls.append(n)
    raise RuntimeError("not yet")


@app.workflow(concurrency_key=lambda job: job["key"])
async def once(ctx, job: dict) -> int:
    if job.get("hold"):
        await ctx.wait_for_signal("go")
    return await ctx.step(flaky, job["n"])


def pump(core: Core) -> None:
    """Deliver the commands runs and entities sent each other, until none is left."""
    while core.commands:
        core.command(core.commands.pop(0))


@pytest.fixture(autouse=True)
def _fresh() -> None:
    calls.clear()


def test_a_concurrency_limit_holds_across_runs_and_grants_on_release():
    core = Core(app.registry)
    for i in range(4):
        core.start(f"o{i}", "pay", f"order-{i}")
    pump(core)
    assert [t.run_id for t in core.tasks] == ["o0", "o1"]  # two permits, two attempts
    ent = core.state(limit_id("payments"))
    assert len(ent.held) == 2 and [q.holder for q in ent.queue] == ["o2", "o3"]
    core.answer(core.tasks[0], "paid")
    pump(core)  # the release grants the next waiting run
    assert [t.run_id for t in core.tasks] == ["o0", "o1", "o2"]
    assert core.state("o0").status == "completed"
    assert core.names("o2")[:3] == ["RunStarted", "PermitRequested", "PermitReceived"]


def test_a_rate_limit_spaces_the_grants():
    core = Core(app.registry)
    for i in range(5):
        core.start(f"m{i}", "mail", f"to-{i}")
    pump(core)
    assert calls == ["to-0"]
    for expected in range(2, 6):
        core.advance(0.1)
        pump(core)
        assert len(calls) == expected
    grants = core.facts(limit_id("mail"), "PermitGranted")
    times = [g.at_ms for g in grants]
    assert [b - a for a, b in itertools.pairwise(times)] == [100] * 4


def test_a_rate_limit_lets_its_burst_through_at_once_after_idling():
    bursty = App("unit")
    bursty.limit("mail", rate=10, burst=3)
    bursty.registry.add_workflow(app.registry.latest("mail"))
    bursty.registry.add_step(app.registry.step(send))
    core = Core(bursty.registry)
    for i in range(5):
        core.start(f"m{i}", "mail", f"to-{i}")
    pump(core)
    assert calls == ["to-0", "to-1", "to-2"]
    core.advance(0.1)
    pump(core)
    assert len(calls) == 4


def test_waiting_requests_go_by_priority_then_round_robin_between_fairness_keys():
    core = Core(app.registry)
    core.start("first", "exports", {"tenant": "a", "n": 0})  # takes the one permit
    for n in range(3):
        core.start(f"a{n}", "exports", {"tenant": "a", "n": n, "opts": {"fairness": "a"}})
    core.start("b0", "exports", {"tenant": "b", "n": 0, "opts": {"fairness": "b"}})
    core.start("urgent", "exports", {"tenant": "c", "n": 9, "opts": {"priority": 5}})
    core.auto_run_steps = False
    pump(core)
    order = []
    for _ in range(6):
        job = core.queued.pop(0)
        order.append(job.run_id)
        core.run_step(job)
        pump(core)
    assert order == ["first", "urgent", "a0", "b0", "a1", "a2"]


def test_a_failed_attempt_gives_its_permit_back_and_its_retry_asks_again():
    core = Core(app.registry)
    core.auto_run_steps = False
    core.start("x", "exports", {"tenant": "t", "n": 1})
    core.start("y", "exports", {"tenant": "t", "n": 2})
    pump(core)
    job = core.queued.pop(0)
    core.handle(_failed(job))
    pump(core)  # x's permit went back: y gets it while x waits for its retry
    assert [j.run_id for j in core.queued] == ["y"]
    core.advance(1)
    pump(core)
    assert [q.holder for q in core.state(limit_id("export")).queue] == ["x"]
    core.run_step(core.queued.pop(0))
    pump(core)
    assert [j.run_id for j in core.queued] == ["x"] and core.queued[0].attempt == 2


def _failed(job: StepJob) -> StepOutcome:
    return StepOutcome(job.partition, job.run_id, job.seq, job.attempt, False, error="boom")


def test_a_run_that_ends_gives_back_its_permits_and_withdraws_its_requests():
    core = Core(app.registry)
    core.start("o0", "pay", "a")
    core.start("o1", "pay", "b")
    core.start("o2", "pay", "c")
    pump(core)
    core.cancel("o0")  # holds a permit
    core.cancel("o2")  # waits for one
    releases = [c for c in core.commands if isinstance(c, Release)]
    assert sorted(r.holder for r in releases) == ["o0", "o2"]
    pump(core)
    ent = core.state(limit_id("payments"))
    assert set(ent.held) == {("o1", 1)} and not ent.queue
    core.answer(core.tasks[0], "late")  # o0's worker answers after the cancel
    pump(core)
    assert set(core.state(limit_id("payments")).held) == {("o1", 1)}


def test_a_workflow_concurrency_key_runs_one_per_key_and_refuses_past_max_queued():
    core = Core(app.registry)
    core.start("c1", "checkout", {"id": "c1", "customer": "ann"})
    core.start("c2", "checkout", {"id": "c2", "customer": "ann"})
    core.start("c3", "checkout", {"id": "c3", "customer": "ann"})
    core.start("d1", "checkout", {"id": "d1", "customer": "bob"})
    pump(core)
    assert core.facts("c1", "SignalAwaited") and core.facts("d1", "SignalAwaited")
    assert not core.facts("c2", "SignalAwaited")  # waits for c1 to end, no code ran
    assert core.state("c3").status == "failed"
    assert core.state("c3").error.startswith("QueueFull: 1 runs wait for ~limit/checkout/ann")
    assert core.facts("c3", "RunFailed")[-1].code == core.query("c3").code == "queue-full"
    core.signal("c1", "go", None)
    pump(core)
    assert core.state("c1").status == "completed"
    assert core.facts("c2", "SignalAwaited")


def test_a_grant_is_never_doubled_and_a_request_counts_once():
    core = Core(app.registry)
    core.start("o0", "pay", "a")
    acquire = next(c for c in core.commands if isinstance(c, Acquire))
    pump(core)
    core.command(acquire)  # delivered again (a redone transaction's copy)
    pump(core)
    assert len(core.facts(limit_id("payments"), "PermitGranted")) == 1
    assert len(core.tasks) == 1
    assert payload.loads(core.tasks[0].args) == ["a"]


def test_a_retried_run_asks_its_concurrency_key_for_a_permit_again():
    core = Core(app.registry)
    core.start("j1", "once", {"key": "k", "n": 1})
    pump(core)
    assert core.state("j1").status == "failed"  # and its permit went back
    core.start("j2", "once", {"key": "k", "n": 2, "hold": True})  # takes the one permit
    pump(core)
    core.command(Retry("j1"))
    pump(core)
    assert core.state("j1").status == "running"  # waits for j2, running no code
    assert [q.holder for q in core.state(limit_id("once", "k")).queue] == ["j1"]
    core.signal("j2", "go", None)
    pump(core)
    assert core.state("j2").status == "failed"  # its step fails once too: j1 goes on
    assert core.state("j1").status == "completed"
    assert core.names("j1").count("PermitRequested") == 2
    assert all(check_run(core.facts(r)) == [] for r in ("j1", "j2", limit_id("once", "k")))


@app.workflow(concurrency_key=lambda job: job["key"], limit=1, timeout="1m")
async def turn(ctx, job: dict) -> str:
    await ctx.wait_for_signal("go")
    return job["key"]


def test_a_stale_grant_after_a_timeout_and_a_quick_retry_is_given_back_not_taken():
    """w waits for the permit h holds; h ends, and w times out before the limit's grant
    reaches it; w is retried at once and asks again. The grant of its first request is
    stale: w gives that one back and takes the grant of its second, so the limit holds."""
    core = Core(app.registry)
    core.start("h", "turn", {"key": "k"})
    pump(core)
    core.advance(30)
    core.start("w", "turn", {"key": "k"})
    pump(core)
    core.signal("h", "go", None)  # h ends: its Release is on its way to the limit...
    core.advance(60)  # ...when w times out (its request withdrawn)...
    core.command(Retry("w"))  # ...and is retried at once: it asks again
    pump(core)  # the limit grants w's first request, then its second
    assert core.state("h").status == "completed"
    assert core.state("w").status == "running" and core.facts("w", "SignalAwaited")
    ent = core.state(limit_id("turn", "k"))
    assert set(ent.held) == {("w", RUN_PERMIT_SEQ)}  # the permit w runs with is held
    core.start("x", "turn", {"key": "k"})
    pump(core)
    assert not core.facts("x", "SignalAwaited")  # one run of the key at a time
    assert [q.holder for q in core.state(limit_id("turn", "k")).queue] == ["x"]
    core.signal("w", "go", None)
    pump(core)
    assert core.facts("x", "SignalAwaited")
    for run_id in ("h", "w", "x", limit_id("turn", "k")):
        assert check_run(core.facts(run_id)) == []


def test_two_requests_at_one_seq_and_attempt_within_one_millisecond_have_two_ids():
    """A request withdrawn and asked again at the same seq and attempt in the same
    millisecond has another id (the fact's index, not the time), so the grant of the
    first is told from the grant of the second, and each Release names its own."""
    b = Batch(lambda _p, run_id: RunState(run_id), now=1_000)
    st = b.state(0, "r")
    assert isinstance(st, RunState)
    ask = Acquire(limit_id("q"), "r", seq=3)
    limits.request(b, st, ask)
    first = st.permits[3]
    limits.request(b, st, ask)
    second = st.permits[3]
    assert first.request_id != second.request_id
    sent = [c.request_id for c in b.effects.commands if isinstance(c, Acquire)]
    assert sent == [first.request_id, second.request_id]
    assert limits.release_of(b, st, first).request_id == first.request_id


def test_a_grant_by_an_engine_before_grants_named_their_request_is_taken():
    """A Grant written by an older engine names no request: it answers the one the run
    waits for, as it did then."""
    core = Core(app.registry)
    core.start("g", "turn", {"key": "old"})
    (ask,) = core.commands
    core.commands.clear()  # the limit entity was an older engine's
    assert isinstance(ask, Acquire) and ask.request_id
    core.command(Grant(ask.holder, RUN_PERMIT_SEQ, limit=ask.run_id))  # no request_id
    assert core.facts("g", "SignalAwaited")
