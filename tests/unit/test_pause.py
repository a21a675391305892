"""Pause and unpause on the pure core: a paused run runs no workflow code, what comes
meanwhile is recorded and reaches the code once on unpause; cancel and the run timeout
still end it; duplicates, ended runs, continue-as-new, retry, children and a crash."""

from __future__ import annotations

from collections import Counter
from typing import Any

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.state import DEADLINE_SEQ
from runstream.engine.work import TimerDue
from runstream.engine.workflow import Registry, step_def, workflow_def
from runstream.errors import TerminalStepError
from runstream.schemas.records import (
    Kind,
    Pause,
    Reason,
    Retry,
    RunPaused,
    RunUnpaused,
    StepStarted,
    Unpause,
)

from .corehelp import Core

ran: Counter[str] = Counter()


def work(x: Any) -> Any:
    ran["work"] += 1
    return x


def undo(x: Any) -> None:
    ran["undo"] += 1


def fragile(x: Any) -> Any:
    ran["fragile"] += 1
    if ran["fragile"] == 1:
        raise TerminalStepError("broken")
    return x


async def chain(ctx, n: int) -> list[Any]:
    """A step, a signal, a sleep, a step: each a point where code runs next."""
    a = await ctx.step(work, n, compensate=undo)
    s = await ctx.wait_for_signal("go")
    await ctx.sleep(60)
    b = await ctx.step(work, s)
    return [a, b]


async def looping(ctx, n: int) -> int:
    await ctx.wait_for_signal("next")
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


async def breaks(ctx) -> Any:
    return await ctx.step(fragile, 7)


async def timed(ctx, n: int) -> list[Any]:
    return await chain(ctx, n)


async def parent(ctx) -> Any:
    return await ctx.child("chain", 5, run_id="kid")


def _core() -> Core:
    reg = Registry()
    reg.add_workflow(workflow_def(chain))
    reg.add_workflow(workflow_def(looping))
    reg.add_workflow(workflow_def(breaks, timeout="10m"))
    reg.add_workflow(workflow_def(parent))
    reg.add_workflow(workflow_def(timed, timeout="10m"))
    for fn in (work, undo, fragile):
        reg.add_step(step_def(fn))
    ran.clear()
    return Core(reg)


def _pause(core: Core, run_id: str, reason: str = "investigating") -> None:
    core.command(Pause(run_id, reason, by="ops"))


def _unpause(core: Core, run_id: str) -> None:
    core.command(Unpause(run_id, "done", by="ops"))


def _sound(core: Core, run_id: str, finished: bool = True) -> None:
    facts = core.facts(run_id)
    assert check_run(facts, expect_finished=finished) == []
    assert fold(run_id, facts) == core.state(run_id)


def test_a_paused_run_records_what_comes_and_runs_its_code_only_after_unpause():
    core = _core()
    core.auto_run_steps = False
    core.start("r", "chain", 1)
    (job,) = core.queued  # the first step is in flight when the pause comes
    _pause(core, "r")
    st = core.state("r")
    assert st.status == "paused" and st.paused == RunPaused(
        "r", core.now, reason="investigating", by="ops"
    )
    core.queued.clear()
    core.run_step(job)  # the step in flight finishes and is recorded
    assert "StepCompleted" in core.names("r")
    assert core.names("r")[-1] == "StepCompleted"  # ... and no code ran after it
    core.signal("r", "go", 2, signal_id="s1")  # no wait open yet: kept for the code
    core.signal("r", "go", 3, signal_id="s1")  # a duplicate counts once
    core.advance(3600)
    assert core.state("r").status == "paused" and core.queued == []
    names = core.names("r")
    assert names[names.index("RunPaused") :] == ["RunPaused", "StepCompleted", "SignalBuffered"]
    _unpause(core, "r")
    core.auto_run_steps = True
    while core.queued:
        core.run_step(core.queued.pop(0))
    core.advance(60)
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == [1, 2]
    assert ran == {"work": 2}
    _sound(core, "r")


def test_a_sleep_and_a_signal_wait_due_while_paused_reach_the_code_once_on_unpause():
    core = _core()
    core.start("r", "chain", 1)
    assert core.state("r").pending  # waits for "go"
    _pause(core, "r")
    core.signal("r", "go", 9, signal_id="g")  # the open wait takes it; the code does not run
    assert core.names("r")[-1] == "SignalReceived" and core.state("r").status == "paused"
    _unpause(core, "r")  # the code goes on to its sleep
    _pause(core, "r")
    core.advance(60)  # the sleep fires while paused: recorded, not acted on
    assert core.names("r")[-2:] == ["RunPaused", "TimerFired"] and ran["work"] == 1
    _unpause(core, "r")
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == [1, 9]
    _sound(core, "r")


def test_pause_and_unpause_are_facts_on_the_lifecycle_stream_and_duplicates_change_nothing():
    core = _core()
    core.start("r", "chain", 1)
    _pause(core, "r")
    info = core.query("r")  # a query answers while paused, with who and why
    assert (info.status, info.reason) == ("paused", "paused by ops: investigating")
    _pause(core, "r", "again")
    _unpause(core, "r")
    _unpause(core, "r")
    assert [n for n in core.names("r") if "aused" in n] == ["RunPaused", "RunUnpaused"]
    kinds = [(e.type, e.status, e.reason) for e in core.lifecycle if "paused" in e.type]
    assert kinds == [
        (Kind.RUN_PAUSED, "paused", "paused by ops: investigating"),
        (Kind.RUN_UNPAUSED, "running", "unpaused by ops: done"),
    ]
    assert core.query("r").status == "running"
    assert core.dead == []


def test_pause_of_an_ended_run_changes_nothing_and_of_an_unknown_run_is_refused():
    core = _core()
    core.start("r", "breaks")  # fails its step for good: the run fails
    assert core.state("r").status == "failed"
    _pause(core, "r")
    _unpause(core, "r")
    assert core.state("r").status == "failed" and core.dead == []
    _pause(core, "nobody")
    assert [d.code for d in core.dead] == [Reason.UNKNOWN_RUN]
    assert "pause of unknown run 'nobody'" in core.dead[0].reason


def test_cancel_of_a_paused_run_cancels_it_and_compensates_when_asked():
    core = _core()
    core.start("r", "chain", 1)
    _pause(core, "r")
    core.cancel("r", compensate=True)
    st = core.state("r")
    assert st.status == "cancelled" and st.paused is None
    assert ran == {"work": 1, "undo": 1}
    _sound(core, "r")


def test_the_run_timeout_keeps_running_while_paused():
    core = _core()
    core.start("r", "timed", 1)
    _pause(core, "r")
    core.advance(599)
    assert core.state("r").status == "paused"
    core.advance(1)
    st = core.state("r")
    assert st.status == "failed" and st.code == "timed-out" and st.paused is None
    assert ran == {"work": 1, "undo": 1}  # compensated like any failure
    _sound(core, "r")


def test_a_run_that_failed_while_paused_is_retried_unpaused():
    core = _core()
    core.auto_run_steps = False
    core.start("r", "breaks")
    _pause(core, "r")
    (job,) = core.queued
    core.queued.clear()
    core.run_step(job)  # fails for good while paused: recorded, the code does not see it
    assert core.state("r").status == "paused" and core.names("r")[-1] == "StepFailed"
    core.advance(600)  # its timeout ends it, paused or not
    assert core.state("r").status == "failed" and core.state("r").paused is None
    core.auto_run_steps = True
    core.command(Retry("r", "fixed", retry_id="x"))
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == 7
    assert ran == {"fragile": 2}
    _sound(core, "r")


def test_a_pause_after_continue_as_new_follows_the_run_to_its_new_incarnation():
    core = _core()
    core.start("l", "looping", 0)
    core.signal("l", "next", None)
    for cmd in core.commands:  # the successor's start, as the shell would send it
        if cmd.run_id == "l~1":
            core.command(cmd)
    assert core.state("l").continued_as == "l~1"
    _pause(core, "l")  # for the run that carries it on now
    for cmd in core.commands[-1:]:
        core.command(cmd)
    assert core.state("l~1").status == "paused"
    core.signal("l~1", "next", None)
    assert core.state("l~1").status == "paused" and not core.state("l~1").continued_as
    _unpause(core, "l~1")
    assert core.state("l~1").continued_as == "l~2"  # its code ran on, once
    _sound(core, "l~1")


def test_a_paused_parent_gets_its_childs_result_and_goes_on_after_unpause():
    core = _core()
    core.start("p", "parent")
    kid = next(c for c in core.commands if c.run_id == "kid")
    _pause(core, "p")
    core.command(kid)  # the child is not paused: it runs
    core.signal("kid", "go", 6)
    core.advance(60)
    assert core.state("kid").status == "completed"
    for cmd in core.commands:
        if cmd.run_id == "p" and type(cmd).__name__ == "ChildResult":
            core.command(cmd)
    assert core.state("p").status == "paused" and core.names("p")[-1] == "ChildEnded"
    _unpause(core, "p")
    st = core.state("p")
    assert st.status == "completed" and payload.loads(st.output) == [5, 6]
    _sound(core, "p")


def test_a_step_in_flight_when_the_owner_died_while_paused_runs_again_and_nothing_else():
    core = _core()
    core.auto_run_steps = False
    core.start("r", "chain", 1)
    _pause(core, "r")
    core.recover("r")  # a new owner after a crash: the step started is run again
    started = [f for f in core.facts("r") if isinstance(f, StepStarted)]
    assert [(f.seq, f.attempt) for f in started] == [(1, 1), (1, 2)]
    assert [(j.seq, j.attempt) for j in core.queued] == [(1, 2)]
    core.run_step(core.queued.pop())
    assert core.state("r").status == "paused" and core.queued == []
    assert ran == {"work": 1}
    core.auto_run_steps = True
    _unpause(core, "r")
    core.signal("r", "go", 4)
    core.advance(60)
    assert payload.loads(core.state("r").output) == [1, 4]
    _sound(core, "r")


def test_a_compensating_run_paused_and_handed_over_finishes_its_step_then_waits_to_compensate():
    core = _core()
    core.auto_run_steps = False
    core.start("r", "timed", 1)
    core.now += 600_000  # timed out with its step in flight: the compensation waits for it
    core.handle(TimerDue(0, "r", DEADLINE_SEQ))
    assert core.state("r").status == "compensating"
    _pause(core, "r")
    core.hand_over("r")  # a graceful stop while paused: the next owner starts it again
    core.recover("r")
    assert [(j.seq, j.attempt) for j in core.queued] == [(1, 1)]
    core.run_step(core.queued.pop())
    assert core.state("r").status == "paused" and core.queued == []  # undo waits
    core.auto_run_steps = True
    _unpause(core, "r")
    st = core.state("r")
    assert st.status == "failed" and st.code == "timed-out"
    assert ran == {"work": 1, "undo": 1}
    _sound(core, "r")


def test_an_oversized_or_undecodable_pause_is_a_dead_letter_and_the_partition_goes_on():
    core = _core()
    core.start("r", "chain", 1)
    core.command(Pause("r", "x" * 2_000_000, by="ops"))
    good = core.codec.encode(Pause("r", "ok"))
    core.record(good[: len(good) // 2], b"r")  # a foreign producer's torn record
    assert [d.code for d in core.dead] == [Reason.OVERSIZE, Reason.UNDECODABLE]
    assert core.state("r").status == "running"
    _pause(core, "r")
    assert core.state("r").status == "paused"


def test_the_audit_names_code_that_ran_while_the_run_was_paused():
    core = _core()
    core.start("r", "chain", 1)
    facts = core.facts("r")
    paused = RunPaused("r", core.now, reason="x", by="")
    bad = [*facts[:1], paused, *facts[1:]]  # its first step started after the pause
    problems = check_run(bad, expect_finished=False)
    assert any("is a new operation while the run is paused" in p for p in map(str, problems))
    ok = [*facts[:1], paused, RunUnpaused("r", core.now, reason="", by=""), *facts[1:]]
    assert check_run(ok, expect_finished=False) == []


def test_a_pause_sent_again_after_a_timeout_ended_it_changes_nothing():
    """The duplicate (a client's retry, the same pause id) of a pause the run's timeout has
    ended meanwhile must not pause the compensating run again; a new pause does."""
    core = _core()
    core.start("r", "timed", 1)
    pause = Pause("r", "hold", by="ops", pause_id="p1")
    core.command(pause)
    core.auto_run_steps = False  # the compensation's step stays in flight
    core.now += 600_000
    core.handle(TimerDue(0, "r", DEADLINE_SEQ))  # the run timeout ends the pause
    st = core.state("r")
    assert st.paused is None and st.status == "compensating"
    facts = len(core.journal)
    core.command(pause)
    assert len(core.journal) == facts, core.names("r")[-2:]
    core.command(Pause("r", "hold", by="ops", pause_id="p2"))  # a new pause still does
    assert core.state("r").paused is not None
