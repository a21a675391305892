"""The journal audit's rules (runstream.audit.check_run), on fact lists, without a broker.

Journals the pure core writes must pass; hand-broken ones must name what broke."""

from __future__ import annotations

import dataclasses

import pytest

from runstream.audit import RunCheck, check_run
from runstream.engine.workflow import StepPolicy, step_def
from runstream.errors import TerminalStepError
from runstream.schemas.records import RECORDS

from .corehelp import Core
from .test_core import add_one, approval, registry, three_steps


def facts_of(core: Core, run_id: str) -> list:
    return core.facts(run_id)


_BLANK = {str: "", int: 0, bytes: b"", bool: False}


def fact(kind: str, **fields):
    """A journal fact of run "r"; required fields not given are blank."""
    cls = RECORDS[kind]
    values = {"run_id": "r", "at_ms": 0, **fields}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in values and required:
            values[f.name] = _BLANK[{"str": str, "int": int, "bytes": bytes, "bool": bool}[f.type]]
    return cls(**values)


def started():
    return fact("RunStarted", workflow="wf", version="1")


def step(seq: int, attempt: int = 1, name: str = "s") -> list:
    return [
        fact("StepStarted", seq=seq, name=name, attempt=attempt),
        fact("StepCompleted", seq=seq, name=name, attempt=attempt, output=b"1"),
    ]


def completed():
    return fact("RunCompleted", output=b"null", continued_as=None)


# -- journals the engine writes pass ---------------------------------------------------------


def _saga(ctx_step_fails: bool):
    def reserve(x):
        return x

    def release(x):
        return None

    def ship(x):
        if ctx_step_fails:
            raise TerminalStepError("no")
        return x

    async def saga(ctx, x: int) -> int:
        await ctx.step(reserve, x, compensate=release)
        await ctx.sleep(1)
        got = await ctx.wait_for_signal("go", timeout=5)
        ctx.uuid()
        await ctx.step(ship, x)
        return got

    return saga


def test_engine_journals_pass():
    flaky_calls = []

    def flaky(x: int) -> int:
        flaky_calls.append(x)
        if len(flaky_calls) < 3:
            raise RuntimeError("boom")
        return x

    async def retrying(ctx, x: int) -> int:
        return await ctx.step(flaky, x)

    saga = _saga(ctx_step_fails=True)
    reg = registry(
        three_steps,
        approval,
        retrying,
        saga,
        steps=[step_def(flaky, StepPolicy(retries=3, backoff=1))],
    )
    core = Core(reg)
    core.start("three", "three_steps", 1)
    core.start("signals", "approval")
    core.signal("signals", "approve", "a")
    core.signal("signals", "approve", "b")
    core.start("retry", "retrying", 1)
    core.start("saga", "saga", 1)
    core.signal("saga", "go", 2)  # buffered while the timer runs
    core.advance(1)
    core.advance(1)
    core.advance(2)
    core.start("timeout", "saga", 2)
    core.advance(1)
    core.advance(5)  # the signal wait times out: the saga fails and compensates
    for run in ("three", "signals", "retry", "saga", "timeout"):
        assert core.state(run).terminal, run
        assert check_run(facts_of(core, run), expect_finished=True) == [], run
    assert core.state("saga").status == "failed"  # compensated: seq -1 ran
    assert any(getattr(f, "seq", None) == -1 for f in core.facts("saga"))


def test_recovered_and_dead_runs_pass():
    async def wf(ctx) -> int:
        return await ctx.step(add_one, 1)

    core = Core(registry(wf), max_recovery_attempts=2)
    core.auto_run_steps = False
    core.start("ok", "wf")
    core.start("dead", "wf")
    core.recover("ok")
    core.run_step(core.queued.pop())
    for _ in range(5):  # beside others, then alone: free, free, charged 1, 2, dead
        core.recover("dead")
    assert core.state("dead").status == "dead"
    assert check_run(facts_of(core, "ok"), expect_finished=True) == []
    assert check_run(facts_of(core, "dead"), expect_finished=True, dead_lettered=True) == []
    assert check_run(facts_of(core, "dead")) == [
        "the run is dead but the dlq has no run-dead record of it @10"
    ]


def test_suspended_runs_pass_unless_they_must_have_finished():
    core = Core(registry(approval))
    core.start("r", "approval")
    facts = facts_of(core, "r")
    assert check_run(facts) == []
    check = RunCheck("r")
    for i, f in enumerate(facts):
        check.add(f, i)
    assert check.finish() == "suspended: open signal wait"
    assert check_run(facts, expect_finished=True) == ["the run has not finished (open signal wait)"]


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        (step(1)[:1], "step in flight"),
        (
            [
                step(1)[0],
                fact(
                    "StepFailed", seq=1, name="s", attempt=1, error="e", traceback="", retry_at_ms=5
                ),
            ],
            "retry scheduled",
        ),
        ([fact("TimerScheduled", seq=1, due_ms=5)], "open timer"),
        (
            [
                fact("RunParked", reason="version gone"),
                fact("SignalBuffered", name="x", payload=b"1", signal_id="i"),
            ],
            "parked",
        ),
    ],
)
def test_each_reason_to_wait(tail, why):
    check = RunCheck("r")
    for i, f in enumerate([started(), *tail]):
        check.add(f, i)
    assert check.finish() == f"suspended: {why}" and check.problems == []


# -- broken journals are named -----------------------------------------------------------------


def test_a_duplicate_step_completed():
    facts = [started(), *step(1), step(1)[1], completed()]
    assert check_run(facts) == [
        "StepCompleted seq 1 settles it a second time (first: StepCompleted) @2,3"
    ]


def test_a_step_started_again_after_it_completed():
    facts = [started(), *step(1), fact("StepStarted", seq=1, name="s", attempt=2), completed()]
    (problem,) = check_run(facts)
    assert "a settled step ran again" in problem and problem.endswith("@2,3")


def test_a_handover_restarts_the_same_attempt_and_nothing_else():
    s1 = fact("StepStarted", seq=1, name="s", attempt=1)
    handed = fact("StepHandedOver", seq=1, name="s", attempt=1, ran=True)
    assert check_run([started(), s1, handed, *step(1), completed()]) == []
    (problem,) = check_run([started(), s1, handed, *step(1, attempt=2), completed()])
    assert "attempt 2 follows attempt 1" in problem
    stray = fact("StepHandedOver", seq=1, name="s", attempt=3, ran=False)
    (problem,) = check_run([started(), s1, stray, completed()])
    assert problem == "StepHandedOver seq 1 attempt 3 but no such attempt is running @2"


def test_a_second_start_and_a_first_fact_that_is_not_a_start():
    assert check_run([started(), started(), completed()]) == ["a second RunStarted @1"]
    assert check_run([*step(1), completed()])[0] == "first fact is StepStarted, not RunStarted @0"


def test_sequence_gaps_and_compensations_of_steps_that_never_completed():
    facts = [
        started(),
        *step(1),
        *step(3),
        fact("CompensationStarted", error="e", traceback="", cancelled=False),
        *step(-3),
        *step(-2),
        fact("RunFailed", error="e", traceback=""),
    ]
    assert check_run(facts) == [
        "compensation seq -2 but step 2 never completed @8",
        "sequence numbers skip [2] (highest used: 3)",
    ]


def test_a_rejected_start_then_a_valid_one_passes():
    rejected = fact("RunRejected", workflow="wf", code="unknown-workflow", reason="no")
    assert check_run([rejected]) == []
    assert check_run([rejected, started(), *step(1), completed()], expect_finished=True) == []
    assert check_run([started(), rejected, completed()]) == ["RunRejected after the run started @1"]


def test_outcomes_must_answer_the_running_attempt():
    facts = [
        started(),
        fact("StepStarted", seq=1, name="s", attempt=1),
        fact("StepCompleted", seq=1, name="s", attempt=2, output=b"1"),
        completed(),
    ]
    assert check_run(facts) == [
        "StepCompleted seq 1 attempt 2 answers no StepStarted of that attempt "
        "(open: StepStarted attempt 1) @1,2"
    ]
    orphan = [
        started(),
        fact("StepCompleted", seq=1, name="s", attempt=1, output=b"1"),
        completed(),
    ]
    assert "answers no StepStarted" in check_run(orphan)[0]


def test_a_restart_of_a_running_step_needs_a_recovery():
    again = fact("StepStarted", seq=1, name="s", attempt=2)
    done = fact("StepCompleted", seq=1, name="s", attempt=2, output=b"1")
    bad = [started(), step(1)[0], again, done, completed()]
    assert check_run(bad) == [
        "StepStarted seq 1 attempt 2 while attempt 1 runs, with no RunRecovered @1,2"
    ]
    good = [
        started(),
        step(1)[0],
        fact("RunRecovered", seq=1, recoveries=1),
        again,
        done,
        completed(),
    ]
    assert check_run(good, expect_finished=True) == []


def test_timers_and_signals_settle_what_was_opened():
    assert check_run([started(), fact("TimerFired", seq=1), completed()]) == [
        "TimerFired seq 1 with no open TimerScheduled @1"
    ]
    fired_twice = [
        started(),
        fact("TimerScheduled", seq=1, due_ms=1),
        fact("TimerFired", seq=1),
        fact("TimerFired", seq=1),
        completed(),
    ]
    assert check_run(fired_twice) == [
        "TimerFired seq 1 settles it a second time (first: TimerFired) @2,3"
    ]
    wrong = [
        started(),
        fact("TimerScheduled", seq=1, due_ms=1),
        fact("SignalTimedOut", seq=1, name="x"),
        completed(),
    ]
    assert check_run(wrong) == ["SignalTimedOut seq 1 settles an open TimerScheduled @1,2"]


def test_terminal_facts_end_the_run():
    facts = [started(), *step(1), completed(), fact("RunFailed", error="e", traceback=""), *step(2)]
    assert check_run(facts) == [
        "3 facts after the terminal one: RunFailed@4, StepStarted@5, StepCompleted@6 @3,4,5,6"
    ]


def test_a_run_that_waits_for_nothing_is_stuck():
    assert check_run([started(), *step(1)]) == [
        "the run has not finished and waits for nothing (stuck)"
    ]


# -- permits and limits ------------------------------------------------------------------


def test_the_audit_follows_permits_through_a_limit_and_its_runs():
    from .test_limits_core import app as limited
    from .test_limits_core import pump

    core = Core(limited.registry)
    for i in range(3):
        core.start(f"o{i}", "pay", f"order-{i}")
    pump(core)
    assert check_run(facts_of(core, "o2")) == []  # waits for a permit: not stuck
    run = RunCheck("o2")
    for i, f in enumerate(facts_of(core, "o2")):
        run.add(f, i)
    assert run.finish() == "suspended: waiting for a permit"
    core.answer(core.tasks[0], "paid")
    pump(core)
    for run_id in ("o0", "o1", "o2", "~limit/payments"):
        assert check_run(facts_of(core, run_id)) == [], run_id


def test_the_audit_sees_a_limit_holding_more_permits_than_it_may():
    limit = [
        fact("LimitSet", run_id="~limit/q", concurrency=1),
        fact("PermitGranted", run_id="~limit/q", holder="a", seq=1),
        fact("PermitGranted", run_id="~limit/q", holder="b", seq=1),
    ]
    assert check_run(limit) == ["2 permits held, over its concurrency 1 @2"]
    twice = [*limit[:2], fact("PermitReleased", run_id="~limit/q", holder="a", seq=1)]
    twice += [limit[1], limit[1]]
    assert check_run(twice) == ["permit of 'a' seq 1 granted twice @4"]


def test_the_audit_refuses_a_permit_nobody_asked_for():
    facts = [started(), fact("PermitReceived", seq=1, limit="~limit/q"), completed()]
    assert check_run(facts) == ["PermitReceived at seq 1 with no PermitRequested @1"]
