"""Durable promises in the pure core: created before the code that sends the id runs,
completed once (a second completion, an unknown promise, an ended run: refused), kept
until awaited, timed out exactly once, the same after a retry and a redone decision."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.work import Batch, LogRecord
from runstream.engine.workflow import Registry, workflow_def
from runstream.errors import PromiseRejected, PromiseTimeout, TerminalStepError
from runstream.schemas.records import (
    CompletePromise,
    PromiseCompleted,
    PromiseCreated,
    Reason,
    Retry,
    StartRun,
    promise_id,
    promise_of,
)

from .corehelp import Core

sent: list[str] = []
flaky: Counter[str] = Counter()


def mail(pid: str) -> str:
    sent.append(pid)
    return pid


def fail_once(x: Any) -> Any:
    flaky["fail_once"] += 1
    if flaky["fail_once"] == 1:
        raise TerminalStepError("not yet")
    return x


async def approval(ctx) -> Any:
    p = ctx.promise()
    await ctx.step(mail, p.id)
    return await p


async def early(ctx) -> Any:
    p = ctx.promise()
    await ctx.sleep(10)
    return {"first": await p, "again": await p}


async def catching(ctx) -> str:
    p = ctx.promise(timeout="1m")
    try:
        return f"value {await p}"
    except PromiseRejected as exc:
        return f"rejected: {exc.message}"
    except PromiseTimeout:
        return "timed out"


async def then_flaky(ctx) -> Any:
    p = ctx.promise()
    value = await p
    return await ctx.step(fail_once, value)


async def continues(ctx, n: int) -> int:
    ctx.promise()
    if n == 0:
        ctx.continue_as_new(1)
    return n


@pytest.fixture(autouse=True)
def _reset() -> None:
    sent.clear()
    flaky.clear()


def core() -> Core:
    reg = Registry()
    for wf in (approval, early, catching, then_flaky, continues):
        reg.add_workflow(workflow_def(wf))
    return Core(reg)


def resolve(c: Core, pid: str, value: Any = None, run_id: str | None = None) -> Batch:
    run = run_id or pid.rpartition("/promise/")[0]
    return c.command(CompletePromise(run, pid, value=payload.dumps(value)))


def reject(c: Core, pid: str, error: str) -> Batch:
    return c.command(CompletePromise(pid.rpartition("/promise/")[0], pid, error=error))


def clean(c: Core, run_id: str) -> None:
    """The run's journal keeps the audit's rules and folds to its state."""
    assert check_run(c.facts(run_id)) == []
    assert fold(run_id, c.facts(run_id)) == c.state(run_id)


def test_the_promise_id_is_recorded_before_the_step_that_sends_it_runs():
    c = core()
    c.auto_run_steps = False
    b = c.start("r", "approval")
    names = [type(f).__name__ for f in b.effects.facts]
    assert names == ["RunStarted", "PromiseCreated", "StepStarted"]  # one transaction
    (created,) = c.facts("r", "PromiseCreated")
    assert created.promise_id == promise_id("r", 1) == "r/promise/1" and not sent
    c.run_step(c.queued.pop())
    assert sent == ["r/promise/1"] and c.state("r").status == "running"
    resolve(c, sent[0], {"ok": True})
    assert payload.loads(c.state("r").output) == {"ok": True}
    assert len(sent) == 1 and c.names("r")[-2:] == ["PromiseCompleted", "RunCompleted"]
    clean(c, "r")


def test_a_resolve_before_the_await_is_kept_until_the_workflow_awaits_it():
    c = core()
    c.start("r", "early")
    resolve(c, "r/promise/1", "yes")
    assert c.state("r").status == "running"  # still asleep; the value is a fact
    assert c.facts("r", "PromiseCompleted")[0].value == b'"yes"'
    c.advance(10)
    assert payload.loads(c.state("r").output) == {"first": "yes", "again": "yes"}
    clean(c, "r")


def test_a_resolve_delivered_twice_is_refused_the_second_time_with_no_new_fact():
    c = core()
    c.start("r", "early")
    resolve(c, "r/promise/1", "first")
    facts = len(c.journal)
    resolve(c, "r/promise/1", "first")  # the same again (a producer's retry)
    resolve(c, "r/promise/1", "second")  # or someone else's
    reject(c, "r/promise/1", "no")
    assert len(c.journal) == facts
    assert [d.code for d in c.dead] == [Reason.PROMISE_COMPLETED] * 3
    assert "'r/promise/1' was resolved already" in c.dead[0].reason
    c.advance(10)
    assert payload.loads(c.state("r").output) == {"first": "first", "again": "first"}
    clean(c, "r")


def test_a_rejection_raises_promise_rejected_with_the_rejecters_message():
    c = core()
    c.start("r", "catching")
    reject(c, "r/promise/1", "the manager said no")
    assert payload.loads(c.state("r").output) == "rejected: the manager said no"
    clean(c, "r")


def test_an_uncaught_rejection_fails_the_run_with_it():
    c = core()
    c.start("r", "approval")
    reject(c, sent[0], "no")
    st = c.state("r")
    assert st.status == "failed" and "PromiseRejected: promise 'r/promise/1' was rejected: no" in (
        st.error or ""
    )


@pytest.mark.parametrize(
    ("pid", "run_id", "code", "why"),
    [
        ("r/promise/7", None, Reason.UNKNOWN_PROMISE, "run 'r' has no promise 'r/promise/7'"),
        ("r/promise/2", None, Reason.UNKNOWN_PROMISE, "no promise"),  # seq 2 is the step
        ("r/promise/01", None, Reason.UNKNOWN_PROMISE, "is not a promise id"),
        ("r", "r", Reason.UNKNOWN_PROMISE, "is not a promise id"),
        ("other/promise/1", "r", Reason.UNKNOWN_PROMISE, "is of run 'other', not 'r'"),
        ("ghost/promise/1", None, Reason.UNKNOWN_RUN, "of unknown run 'ghost'"),
    ],
)
def test_a_completion_of_a_promise_the_run_does_not_have_is_refused(pid, run_id, code, why):
    c = core()
    c.start("r", "approval")
    facts = len(c.journal)
    resolve(c, pid, 1, run_id)
    assert len(c.journal) == facts and c.state("r").status == "running"
    assert [d.code for d in c.dead] == [code] and why in c.dead[0].reason


def test_a_value_that_is_not_json_is_refused():
    c = core()
    c.start("r", "approval")
    c.command(CompletePromise("r", "r/promise/1", value=b"{nope"))
    assert [d.code for d in c.dead] == [Reason.INVALID_INPUT]
    resolve(c, "r/promise/1", 2)  # the promise is still open
    assert payload.loads(c.state("r").output) == 2


def test_a_completion_after_the_run_ended_is_refused():
    c = core()
    c.start("done", "catching")
    resolve(c, "done/promise/1", 1)
    c.start("cancelled", "catching")
    c.cancel("cancelled")
    c.start("cont", "continues", 0)  # its promise is left open as it continues
    assert c.state("cont").continued_as == "cont~1"
    for pid in ("done/promise/1", "cancelled/promise/1", "cont/promise/1"):
        resolve(c, pid, 2)
    assert [d.code for d in c.dead] == [
        Reason.PROMISE_COMPLETED,
        Reason.RUN_ENDED,
        Reason.RUN_ENDED,
    ]
    assert "run 'cancelled' is cancelled: nothing awaits the promise" in c.dead[1].reason
    assert "run 'cont' continued as 'cont~1'" in c.dead[2].reason
    assert not c.facts("cancelled", "PromiseCompleted") and not c.facts("cont", "PromiseCompleted")
    for run_id in ("done", "cancelled", "cont"):
        clean(c, run_id)


@pytest.mark.parametrize("resolve_first", [True, False])
def test_a_timeout_and_a_resolve_at_the_same_time_give_exactly_one_outcome(resolve_first):
    c = core()
    c.start("r", "catching")
    c.advance(59.999)
    assert c.state("r").status == "running"
    c.now += 1  # the timeout is due, and a resolve arrives: whichever is decided first wins
    if resolve_first:
        resolve(c, "r/promise/1", 5)
        c.advance(0)
    else:
        c.advance(0)
        resolve(c, "r/promise/1", 5)
    (outcome,) = c.facts("r", "PromiseCompleted")
    assert outcome.timed_out is not resolve_first
    expected = "value 5" if resolve_first else "timed out"
    assert payload.loads(c.state("r").output) == expected
    assert [d.code for d in c.dead] == ([] if resolve_first else [Reason.PROMISE_COMPLETED])
    clean(c, "r")


def test_a_timed_out_promise_refuses_a_late_resolve_while_the_run_goes_on():
    async def wf(ctx) -> Any:
        p = ctx.promise(timeout=5)
        try:
            await p
        except PromiseTimeout as exc:
            await ctx.sleep(60)
            return str(exc)

    reg = Registry()
    reg.add_workflow(workflow_def(wf))
    c = Core(reg)
    c.start("r", "wf")
    c.advance(5)
    resolve(c, "r/promise/1", "late")
    assert [d.code for d in c.dead] == [Reason.PROMISE_COMPLETED]
    assert "'r/promise/1' timed out already" in c.dead[0].reason
    c.advance(60)
    assert "'r/promise/1' was not completed by its timeout" in payload.loads(c.state("r").output)
    clean(c, "r")


def test_a_retried_run_awaits_the_same_promise_and_gets_its_recorded_value():
    """Decided: a promise completes once. A retried run replays its creation (the same
    id) and its await gets the outcome recorded before the failure; nothing recorded
    runs or is recorded again."""
    c = core()
    c.start("r", "then_flaky")
    resolve(c, "r/promise/1", 41)
    assert c.state("r").status == "failed" and flaky["fail_once"] == 1
    c.command(Retry("r"))
    assert payload.loads(c.state("r").output) == 41 and flaky["fail_once"] == 2
    assert len(c.facts("r", "PromiseCreated")) == len(c.facts("r", "PromiseCompleted")) == 1
    clean(c, "r")


def test_a_run_that_failed_while_awaiting_refuses_the_completion_until_it_is_retried():
    """A failed run may be retried: the refusal says so, and the same record completes
    the promise once the run is retried (`dlq redrive`)."""
    c = core()
    c.command(StartRun("r", "approval", input=b"null", timeout_ms=1000))
    c.advance(1)
    assert c.state("r").status == "failed"
    resolve(c, "r/promise/1", "ok")
    assert [d.code for d in c.dead] == [Reason.RUN_ENDED]
    assert "retry it" in c.dead[0].reason and "dlq redrive" in c.dead[0].reason
    c.command(Retry("r"))
    assert c.state("r").status == "running" and c.state("r").promises
    resolve(c, "r/promise/1", "ok")
    assert payload.loads(c.state("r").output) == "ok" and len(sent) == 1
    clean(c, "r")


def test_the_redone_decision_of_a_creation_and_of_a_completion_is_the_same():
    c = core()

    def twice(rec: LogRecord) -> None:
        first = Batch(lambda _p, rid: c.state(rid), c.now)
        c.decider.handle(first, rec)
        c.decider.forget(first.runs)  # the transaction aborted: its coroutines go
        c.now += 7  # and it is redone a little later
        second = Batch(lambda _p, rid: c.state(rid), c.now)
        c.decider.handle(second, rec)
        strip = [(type(f).__name__, getattr(f, "seq", None)) for f in first.effects.facts]
        assert strip == [(type(f).__name__, getattr(f, "seq", None)) for f in second.effects.facts]
        for run_id, w in second.runs.items():
            c.states[run_id] = w.after
        c.journal += second.effects.facts
        c.queued += second.effects.steps

    c.auto_run_steps = False
    start = c.codec.encode(StartRun("r", "approval", input=b"null"))
    twice(LogRecord("t.commands", 0, 1, b"r", start))
    assert [f.promise_id for f in c.facts("r", "PromiseCreated")] == ["r/promise/1"]
    c.run_step(c.queued.pop())
    done = c.codec.encode(CompletePromise("r", "r/promise/1", value=b"3"))
    twice(LogRecord("t.commands", 0, 2, b"r", done))
    assert payload.loads(c.state("r").output) == 3
    assert len(c.facts("r", "PromiseCompleted")) == 1
    clean(c, "r")


def test_code_that_no_longer_creates_the_promise_parks_the_run():
    c = core()
    c.start("r", "early")

    async def early(ctx) -> Any:  # the new code sleeps where the promise was
        await ctx.sleep(10)

    reg = Registry()
    reg.add_workflow(workflow_def(early))
    c2 = Core(reg)
    c2.states = c.states
    c2.advance(10)
    st = c2.state("r")
    assert st.status == "parked" and "'promise'" in (st.reason or "")


def test_promise_ids_are_read_from_the_right():
    assert promise_of(promise_id("a/promise/3", 2)) == ("a/promise/3", 2)
    assert promise_of("order~1/promise/12") == ("order~1", 12)
    for bad in ("x/promise/", "/promise/1", "x/promise/0", "x/promise/-1", "x/promise/1a", "x"):
        assert promise_of(bad) is None


def test_the_facts_fold_the_same_from_scratch_with_an_open_promise():
    c = core()
    c.start("r", "catching")
    st = c.state("r")
    assert list(st.promises) == [1] and st.timers() == {(c.now + 60_000, 1)}
    assert isinstance(st.resolved[1], PromiseCreated)
    resolve(c, "r/promise/1", 1)
    assert isinstance(c.state("r").resolved[1], PromiseCompleted) and not c.state("r").promises
    clean(c, "r")


def test_a_parked_run_keeps_a_completion_and_takes_it_when_it_resumes():
    c = core()
    c.start("r", "early")
    elsewhere = Core(Registry())  # an instance without the workflow: the run parks there
    elsewhere.states, elsewhere.now = c.states, c.now
    elsewhere.advance(10)
    assert c.state("r").status == "parked"
    resolve(elsewhere, "r/promise/1", "kept")
    st = c.state("r")
    assert st.status == "parked" and isinstance(st.resolved[1], PromiseCompleted)
    c.journal += elsewhere.journal
    c.resume("r")  # code that has the workflow again
    assert payload.loads(c.state("r").output) == {"first": "kept", "again": "kept"}
    assert check_run(c.facts("r")) == []


def test_a_completion_while_the_sending_step_still_runs_starts_nothing_again():
    c = core()
    c.auto_run_steps = False
    c.start("r", "approval")
    resolve(c, "r/promise/1", "fast")  # the person answered before the step's outcome
    assert c.names("r") == ["RunStarted", "PromiseCreated", "StepStarted", "PromiseCompleted"]
    assert len(c.queued) == 1  # the step was not started a second time
    c.run_step(c.queued.pop())
    assert payload.loads(c.state("r").output) == "fast" and sent == ["r/promise/1"]
    clean(c, "r")


def test_a_run_awaiting_its_promise_says_so_on_the_lifecycle_stream():
    """An await records no fact, so nothing told the runs model, the dashboard or a
    benchmark that the run waits for its promise (a signal wait says so)."""
    c = core()
    c.start("r", "approval")
    suspended = [e for e in c.lifecycle if e.type == "run.suspended" and e.run_id == "r"]
    assert [e.reason for e in suspended] == ["waiting for promise 'r/promise/1'"]
    resolve(c, sent[0], {"ok": True})
    assert c.state("r").status == "completed"
