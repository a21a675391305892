"""Retry: a failed or dead run goes on from its last completed step (pure core)."""

from __future__ import annotations

from collections import Counter

import pytest

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.workflow import Registry, StepPolicy, step_def, workflow_def
from runstream.errors import StepError
from runstream.schemas.records import RetriedAsNew, Retry, RunRetried, StepFailed

from .corehelp import Core

bodies: Counter[str] = Counter()
broken = {"third": True}


def first(x: int) -> int:
    bodies["first"] += 1
    return x + 1


def second(x: int) -> int:
    bodies["second"] += 1
    return x + 1


def third(x: int) -> int:
    bodies["third"] += 1
    if broken["third"]:
        raise RuntimeError("the payment provider is down")
    return x + 1


async def three(ctx, x: int) -> int:
    x = await ctx.step(first, x)
    x = await ctx.step(second, x)
    return await ctx.step(third, x)


def _core(max_recovery_attempts: int = 3) -> Core:
    reg = Registry()
    reg.add_workflow(workflow_def(three))
    reg.add_step(step_def(third, StepPolicy(retries=1, backoff=0)))
    return Core(reg, max_recovery_attempts=max_recovery_attempts)


def _failed_in_its_third_step() -> Core:
    bodies.clear()
    broken["third"] = True
    core = _core()
    core.start("r", "three", 1)
    core.advance(1)  # the second attempt of the third step fails too
    assert core.state("r").status == "failed"
    assert bodies == {"first": 1, "second": 1, "third": 2}
    return core


def test_a_run_that_failed_in_its_third_step_retried_reruns_only_that_step():
    core = _failed_in_its_third_step()
    broken["third"] = False
    core.command(Retry("r", "provider is back"))
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == 4
    assert bodies == {"first": 1, "second": 1, "third": 3}
    retried = core.facts("r", "RunRetried")
    assert retried == [RunRetried("r", core.now, seqs=[3], reason="provider is back")]
    # the step's next attempt continues its numbering
    assert [f.attempt for f in core.facts("r", "StepStarted") if f.seq == 3] == [1, 2, 3]
    assert [e.type for e in core.lifecycle if e.run_id == "r"][-2:] == [
        "step.completed",
        "run.completed",
    ]
    assert "run.retried" in [e.type for e in core.lifecycle]
    assert check_run(core.facts("r"), expect_finished=True) == []
    assert fold("r", core.facts("r")) == core.state("r")


def test_a_retried_run_that_fails_again_fails_after_one_more_attempt():
    core = _failed_in_its_third_step()
    core.command(Retry("r"))
    assert core.state("r").status == "failed"
    assert bodies["third"] == 3  # attempts beyond the policy: one try, no new budget
    core.command(Retry("r"))  # and it may be retried again
    assert core.state("r").status == "failed" and bodies["third"] == 4
    assert check_run(core.facts("r"), expect_finished=True) == []


def test_retry_of_a_running_or_completed_run_changes_nothing():
    core = _failed_in_its_third_step()
    broken["third"] = False
    core.command(Retry("r"))
    facts = len(core.journal)
    core.command(Retry("r"))  # a repeated retry reaches a completed run
    assert len(core.journal) == facts and core.dead == []


def test_retry_of_an_unknown_run_is_dead_lettered():
    core = _core()
    core.command(Retry("nobody"))
    assert [d.code for d in core.dead] == ["unknown-run"]


def test_a_dead_run_retried_runs_its_crashed_step_again():
    bodies.clear()
    broken["third"] = False
    core = _core(max_recovery_attempts=0)
    core.auto_run_steps = False
    core.start("d", "three", 1)
    core.run_step(core.queued.pop(0))  # first completes; second is started, then a crash
    core.recover("d")  # beside others: free, but its recovery is a recovery
    core.recover("d")  # which died too: alone now
    core.recover("d")  # running alone: charged, past 0 recoveries -> dead
    assert core.state("d").status == "dead"
    core.auto_run_steps = True
    core.queued.clear()
    core.command(Retry("d"))
    st = core.state("d")
    assert st.status == "completed" and payload.loads(st.output) == 4
    assert bodies == {"first": 1, "second": 1, "third": 1}
    assert check_run(core.facts("d"), expect_finished=True, dead_lettered=True) == []


def test_the_audit_refuses_a_retry_that_reopens_a_completed_step():
    core = _failed_in_its_third_step()
    facts = core.facts("r")
    bad = RunRetried("r", core.now, seqs=[1])
    assert any("did not fail for good" in p for p in check_run([*facts, bad]))
    assert any("not finished" in p for p in check_run([*facts[:3], bad]))


def test_the_reopened_step_is_a_retry_due_at_once():
    core = _failed_in_its_third_step()
    state = fold("r", [*core.facts("r"), RunRetried("r", core.now + 5, seqs=[3])])
    reopened = state.pending[3]
    assert isinstance(reopened, StepFailed) and reopened.retry_at_ms == core.now + 5
    assert state.status == "running" and 3 not in state.resolved


def test_a_failed_run_retried_with_new_input_starts_a_linked_new_run():
    core = _failed_in_its_third_step()
    broken["third"] = False
    core.command(Retry("r", "input fixed", input=payload.dumps(10)))
    assert core.state("r").status == "failed"  # the old run stays as it ended
    assert core.state("r").retried_as == "r~1"
    assert [type(f).__name__ for f in core.facts("r")][-1] == "RetriedAsNew"
    (start,) = core.commands  # produced in the same transaction as the link
    assert (start.run_id, start.continued_from, start.tags) == ("r~1", "r", {"retry_of": "r"})
    core.command(start)  # the engine reads it back from the commands topic
    new = core.state("r~1")
    assert new.status == "completed" and payload.loads(new.output) == 13
    assert new.tags == {"retry_of": "r"}
    lifecycle = [e for e in core.lifecycle if e.run_id == "r" and e.type == "run.retried"]
    assert lifecycle[-1].continued_as == "r~1"
    assert check_run(core.facts("r"), expect_finished=True) == []
    assert fold("r", core.facts("r")) == core.state("r")


def test_retry_with_new_input_is_refused_for_a_running_run_a_bad_input_and_a_second_time():
    core = _failed_in_its_third_step()
    core.command(Retry("r", input=payload.dumps("not a number")))
    core.command(Retry("r", input=b"{not json"))
    assert [d.code for d in core.dead] == ["invalid-input", "invalid-input"]
    core.command(Retry("r", input=payload.dumps(5)))
    core.command(Retry("r", input=payload.dumps(6)))  # it already carries on as r~1
    assert core.dead[-1].code == "not-retryable" and "r~1" in core.dead[-1].reason
    assert [c.run_id for c in core.commands] == ["r~1"]
    core.command(core.commands[0])  # r~1 runs: its third step waits for its retry
    core.command(Retry("r~1", input=payload.dumps(7)))
    assert core.dead[-1].code == "not-retryable" and "it is running" in core.dead[-1].reason
    core.advance(1)  # and fails again: now it can be retried as new in turn
    assert core.state("r~1").status == "failed"
    core.command(Retry("r~1", input=payload.dumps(7)))
    assert core.state("r~1").retried_as == "r~2"


def test_the_audit_refuses_a_retried_as_new_of_an_open_run_or_twice():
    core = _failed_in_its_third_step()
    facts = core.facts("r")
    link = RetriedAsNew("r", core.now, new_run_id="r~1")
    assert check_run([*facts, link]) == []
    assert any("a second RetriedAsNew" in p for p in check_run([*facts, link, link]))
    assert any("has not ended" in p for p in check_run([*facts[:3], link]))


async def guarded(ctx, x: int) -> str:
    """Catches its step's final failure, then waits for a signal: a run timeout (1 min)
    ends it while it waits."""
    try:
        got = str(await ctx.step(third, x))
    except StepError:
        got = "failed"
    await ctx.wait_for_signal("go")
    return got


def _timed_out_after_a_caught_failure() -> Core:
    bodies.clear()
    broken["third"] = True
    reg = Registry()
    reg.add_workflow(workflow_def(guarded, timeout="1m"))
    reg.add_step(step_def(third, StepPolicy(retries=0)))
    core = Core(reg)
    core.start("g", "guarded", 1)
    core.advance(60)
    st = core.state("g")
    assert st.status == "failed" and st.error.startswith("RunTimedOut: ")
    return core


def test_a_run_that_timed_out_retried_gets_a_fresh_timeout_from_the_retry():
    core = _timed_out_after_a_caught_failure()
    core.advance(3600)  # retried an hour later
    core.command(Retry("g"))
    st = core.state("g")
    assert st.status == "running"  # not failed again at once by its expired deadline
    assert st.deadline_ms == core.now + 60_000
    core.advance(59)
    assert core.state("g").status == "running"
    core.advance(1)
    assert core.state("g").error.endswith("did not end within its timeout of 60s")
    core.command(Retry("g"))  # and again: a minute from this retry
    assert core.state("g").deadline_ms == core.now + 60_000
    assert fold("g", core.facts("g")) == core.state("g")
    assert check_run(core.facts("g")) == []


@pytest.mark.parametrize("cache_miss", [False, True])
def test_a_retried_run_goes_on_alike_whether_its_coroutine_was_cached_or_not(cache_miss):
    """Its coroutine, suspended at the signal, had caught the step's failure; the retry
    reopens that step, so the run must replay from the start, as after a cache miss."""
    core = _timed_out_after_a_caught_failure()
    broken["third"] = False
    if cache_miss:
        core.decider.forget(["g"])
    core.command(Retry("g"))
    core.signal("g", "go", None)
    st = core.state("g")
    assert st.status == "completed" and payload.loads(st.output) == "2"
    assert bodies == {"third": 2}
    assert check_run(core.facts("g"), expect_finished=True) == []


def test_a_retry_delivered_twice_retries_the_run_once():
    """A client that resends a Retry (its first send raised, yet reached Kafka) while the
    run failed again in between: the same retry id counts once (found by the model test)."""
    core = _failed_in_its_third_step()
    retry = Retry("r", "again", retry_id="retry-1")
    core.command(retry)
    assert core.state("r").status == "failed" and bodies["third"] == 3
    core.command(retry)  # the same command, delivered again
    assert bodies["third"] == 3 and len(core.facts("r", "RunRetried")) == 1
    core.command(Retry("r", "once more", retry_id="retry-2"))  # another retry still counts
    assert bodies["third"] == 4 and len(core.facts("r", "RunRetried")) == 2
    assert fold("r", core.facts("r")) == core.state("r")
