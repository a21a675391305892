"""runstream.testing: workflows run in-process on the engine's core, with a fake clock."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points

import pytest

import runstream
from examples.testing import test_order_flow as example
from runstream.engine.reducer import fold
from runstream.schemas.records import StepFailed, TimerScheduled
from runstream.testing import EndlessTimers, RunNotFinished, WorkflowTester

app = runstream.App("kit")
bodies: list[str] = []  # real step bodies that ran


@app.step
def charge(amount: int) -> dict:
    bodies.append("charge")
    return {"paid": amount}


@app.step
def release(amount: int) -> None:
    bodies.append("release")


@app.step(retries=3, backoff=2.0)
def flaky(amount: int) -> int:
    bodies.append("flaky")
    return amount


@app.step
def decline(amount: int) -> None:
    raise runstream.TerminalStepError(f"card declined for {amount}")


@app.workflow
async def month_long(ctx: runstream.Context, amount: int) -> dict:
    receipt = await ctx.step(charge, amount, compensate=release)
    await ctx.sleep("30d")
    return {"receipt": receipt, "at": ctx.now().isoformat()}


@app.workflow
async def approval(ctx: runstream.Context, _: None) -> str:
    await ctx.sleep("1h")
    first = await ctx.wait_for_signal("approve")
    second = await ctx.wait_for_signal("approve")
    return f"{first['by']}+{second['by']}"


@app.workflow
async def retrying(ctx: runstream.Context, amount: int) -> int:
    return await ctx.step(flaky, amount)


@app.workflow
async def saga(ctx: runstream.Context, amount: int) -> None:
    await ctx.step(charge, amount, compensate=release)
    await ctx.step(flaky, amount, compensate=release)
    await ctx.step(decline, amount)


activations = 0


@app.workflow
async def fickle(ctx: runstream.Context, amount: int) -> int:
    global activations
    activations += 1
    if activations == 1:  # differs on the next replay: not deterministic
        await ctx.step(charge, amount)
    return await ctx.step(flaky, amount)


@app.workflow
async def counting(ctx: runstream.Context, n: int) -> int:
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


@app.workflow
async def forever(ctx: runstream.Context, _: None) -> None:
    while True:
        await ctx.sleep("1m")


@app.workflow
async def by_promise(ctx: runstream.Context, _: None) -> str:
    p = ctx.promise()
    try:
        return await p
    except runstream.PromiseRejected as exc:
        return f"no: {exc.message}"


def names(run) -> list[str]:
    return [type(f).__name__ for f in run.history]


def test_a_30_day_sleep_completes_at_once_on_the_fake_clock():
    began = time.perf_counter()
    t = WorkflowTester(app)
    run = t.start("month_long", 10, run_id="m-1")
    assert run.status == "running"
    t.run_until_idle()
    took = time.perf_counter() - began
    print(f"a 30-day sleep took {took * 1000:.1f} ms")  # measured, not asserted

    later = datetime(2025, 1, 31, tzinfo=UTC)
    assert run.result() == {"receipt": {"paid": 10}, "at": later.isoformat()}
    assert t.now == later
    timer = next(f for f in run.history if isinstance(f, TimerScheduled))
    assert timer.due_ms - timer.at_ms == 30 * 86_400_000
    assert names(run)[-4:] == ["TimerScheduled", "TimerFired", "ValueRecorded", "RunCompleted"]


def test_advance_fires_only_what_is_due_and_the_clock_starts_where_asked():
    start = datetime(2030, 6, 1, tzinfo=UTC)
    t = WorkflowTester(app, now=start)
    run = t.start(month_long, 1)  # by function too
    t.advance("29d")
    assert run.status == "running" and t.now == start + timedelta(days=29)
    t.advance(timedelta(days=1))
    assert run.status == "completed"


def test_signals_sent_before_the_wait_are_buffered_and_after_it_awaited():
    t = WorkflowTester(app)
    run = t.start("approval", run_id="a-1")
    t.signal("a-1", "approve", {"by": "ann"})  # the workflow still sleeps: buffered
    assert names(run)[-1] == "SignalBuffered"
    t.advance("1h")
    assert names(run)[-2:] == ["SignalReceived", "SignalAwaited"]  # now it waits
    t.signal("a-1", "approve", {"by": "bob"})
    assert run.result() == "ann+bob"
    assert names(run)[-2:] == ["SignalReceived", "RunCompleted"]


def test_a_signal_to_an_unknown_run_raises_run_not_found():
    t = WorkflowTester(app)
    with pytest.raises(runstream.RunNotFound):
        t.signal("nobody", "approve")
    with pytest.raises(runstream.RunNotFound):
        t.run("nobody")
    assert t.dead_letters[0].code == "unknown-run"


def test_a_fake_by_name_or_function_replaces_the_step_body_and_keeps_its_name():
    bodies.clear()
    calls = []

    def fake_charge(amount: int) -> dict:
        calls.append(amount)
        return {"paid": 0}

    async def fake_flaky(amount: int) -> int:
        return -amount

    t = WorkflowTester(app, steps={"charge": fake_charge, flaky: fake_flaky})
    run = t.start("month_long", 7)
    t.run_until_idle()
    assert run.result()["receipt"] == {"paid": 0}
    assert t.start("retrying", 3).result() == -3
    assert calls == [7] and bodies == []
    assert [(s.name, s.args, s.output) for s in run.steps] == [("charge", (7,), {"paid": 0})]


def test_a_failing_step_is_retried_with_backoff_on_the_fake_clock():
    failures = [ConnectionError("down"), ConnectionError("still down")]

    def flaky_twice(amount: int) -> int:
        if failures:
            raise failures.pop(0)
        return amount * 2

    t = WorkflowTester(app, steps={flaky: flaky_twice})
    run = t.start("retrying", 5)
    assert [s.attempt for s in run.steps] == [1]
    t.advance("1.9s")
    assert [s.attempt for s in run.steps] == [1]  # the first backoff is 2 s
    t.advance("0.1s")
    assert [s.attempt for s in run.steps] == [1, 2]
    t.run_until_idle()  # then 4 s
    assert run.result() == 10
    assert [(s.attempt, s.ok, s.error) for s in run.steps] == [
        (1, False, "ConnectionError: down"),
        (2, False, "ConnectionError: still down"),
        (3, True, None),
    ]
    retries = [f.retry_at_ms - f.at_ms for f in run.history if isinstance(f, StepFailed)]
    assert retries == [2000, 4000]


def test_a_non_deterministic_workflow_is_parked_with_the_reason_as_in_production():
    global activations
    activations = 0
    t = WorkflowTester(app)
    run = t.start("fickle", 1, run_id="f-1")
    assert run.status == "parked"
    assert run.reason == (
        "non-determinism: run 'f-1' at sequence 1: the history has 'step charge', "
        "the code now asks for 'step flaky'"
    )
    assert names(run)[-1] == "RunParked"
    with pytest.raises(RunNotFinished, match="it is parked: non-determinism"):
        run.result()


def test_a_failure_compensates_the_completed_steps_newest_first():
    bodies.clear()
    t = WorkflowTester(app)
    run = t.start("saga", 4)
    with pytest.raises(runstream.RunFailed, match="card declined for 4"):
        run.result()
    assert [(s.name, s.seq) for s in run.steps] == [
        ("charge", 1),
        ("flaky", 2),
        ("decline", 3),
        ("release", -2),
        ("release", -1),
    ]
    assert [s.compensation for s in run.steps] == [False, False, False, True, True]
    assert "CompensationStarted" in names(run) and names(run)[-1] == "RunFailed"


def test_cancel_with_compensation_undoes_the_completed_steps():
    t = WorkflowTester(app)
    run = t.start("month_long", 2)  # charged, now sleeping
    t.cancel(run.run_id, compensate=True, reason="changed my mind")
    with pytest.raises(runstream.RunCancelled, match="changed my mind"):
        run.result()
    assert [(s.name, s.seq) for s in run.steps] == [("charge", 1), ("release", -1)]
    t.run_until_idle()  # the sleep's timer went with the run
    assert names(run)[-1] == "RunCancelled"


def test_continue_as_new_is_followed_to_the_last_run():
    t = WorkflowTester(app)
    run = t.start("counting", 0, run_id="c")
    assert run.result() == 2
    assert t.run("c~2").status == "completed"


def test_an_unknown_workflow_is_rejected():
    t = WorkflowTester(app)
    with pytest.raises(runstream.RunRejected, match="unknown-workflow"):
        t.start("nope").result()


def test_the_journal_folds_into_the_state_the_tester_reports():
    t = WorkflowTester(app)
    run = t.start("approval", run_id="a-2")
    t.advance("1h")
    t.signal("a-2", "approve", {"by": "x"})
    assert fold("a-2", run.history) == run.state


def test_run_until_idle_stops_a_workflow_that_sleeps_forever():
    t = WorkflowTester(app)
    t.start("forever")
    with pytest.raises(EndlessTimers):
        t.run_until_idle(max_timers=50)


def test_promises_are_resolved_or_rejected_from_the_test():
    t = WorkflowTester(app)
    yes, no = t.start("by_promise"), t.start("by_promise")
    assert yes.promises == [f"{yes.run_id}/promise/1"] and yes.status == "running"
    t.resolve(yes.promises[0], "yes")
    t.reject(no.promises[0], "nope")
    assert (yes.result(), no.result()) == ("yes", "no: nope")
    t.resolve(yes.promises[0], "again")  # refused: a dead letter, as on <ns>.dlq
    assert [d.code for d in t.dead_letters] == ["promise-completed"]
    with pytest.raises(runstream.RunNotFound):
        t.resolve("ghost/promise/1")
    with pytest.raises(ValueError, match="is not a promise id"):
        t.resolve("ghost")


@pytest.mark.parametrize("name", sorted(n for n in vars(example) if n.startswith("test_")))
def test_the_example_test_file_passes(name):
    getattr(example, name)()


def test_the_pytest_plugin_is_registered_by_entry_point(pytestconfig):
    (ep,) = [ep for ep in entry_points(group="pytest11") if ep.name == "runstream"]
    assert ep.value == "runstream.pytest_plugin"
    plugin = pytestconfig.pluginmanager.get_plugin("runstream")
    assert plugin is not None and plugin.__name__ == "runstream.pytest_plugin"
