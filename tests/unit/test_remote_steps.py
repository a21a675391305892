"""Remote steps in the pure core: dispatch, results, liveness and heartbeats (no Kafka)."""

from __future__ import annotations

from runstream import App
from runstream.engine import payload
from runstream.engine.work import TimerDue
from runstream.schemas.records import Heartbeat, StepStarted

from .corehelp import Core

app = App("unit")


@app.step(group="payments", retries=2, backoff=1, timeout="30s", heartbeat="10s")
def charge(order: dict) -> dict:
    raise AssertionError("a remote step never runs in the engine")


def local(x: int) -> int:
    return x + 1


@app.workflow
async def checkout(ctx, order: dict) -> dict:
    n = await ctx.step(local, 1)
    receipt = await ctx.step(charge, order)
    return {"n": n, **receipt}


def started(core: Core, run_id: str) -> list[StepStarted]:
    return core.facts(run_id, "StepStarted")


def test_a_remote_step_is_recorded_and_dispatched_in_one_decision():
    core = Core(app.registry)
    core.start("o1", "checkout", {"id": 7})
    local_start, remote_start = started(core, "o1")
    assert not local_start.remote and remote_start.remote
    assert remote_start.group == "payments" and remote_start.attempt_id
    assert remote_start.deadline_ms == remote_start.at_ms + 30_000
    assert remote_start.heartbeat_ms == 10_000
    [task] = core.tasks
    assert (task.run_id, task.seq, task.attempt, task.name) == ("o1", 2, 1, "charge")
    assert task.group == "payments" and task.attempt_id == remote_start.attempt_id
    assert payload.loads(task.args) == [{"id": 7}]
    assert not core.queued  # the engine does not run it

    core.answer(task, {"receipt": "r-1"})
    assert core.state("o1").status == "completed"
    assert payload.loads(core.state("o1").output) == {"n": 2, "receipt": "r-1"}


def test_a_result_for_another_attempt_changes_nothing_and_is_told():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    [first] = core.tasks
    core.answer(first, error="boom")  # retried after 1 s
    core.advance(1)
    second = core.tasks[-1]
    assert second.attempt == 2 and second.attempt_id != first.attempt_id
    facts = len(core.journal)
    core.answer(first, {"receipt": "late"})  # a duplicate of the failed attempt's
    assert len(core.journal) == facts and core.state("o1").status == "running"
    [ignored] = [e for e in core.lifecycle if e.type == "step.result_ignored"]
    assert ignored.seq == 2 and f"{second.attempt_id!r} is the open one" in (ignored.reason or "")
    core.answer(second, {"receipt": "r-2"})
    core.answer(second, {"receipt": "again"})  # redelivered: the step is settled
    assert payload.loads(core.state("o1").output)["receipt"] == "r-2"
    assert len([e for e in core.lifecycle if e.type == "step.result_ignored"]) == 2
    assert not core.dead


def test_a_non_retryable_failure_ends_the_step_with_retries_left():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    core.answer(core.tasks[0], error="no step 'charge' here", retryable=False)
    [failed] = core.facts("o1", "StepFailed")
    assert failed.retry_at_ms is None and core.state("o1").status == "failed"


def test_an_attempt_without_a_result_by_its_timeout_is_retried():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    for _ in range(3):  # heartbeats keep it alive, but not past its timeout
        core.advance(9)
        task = core.tasks[-1]
        core.command(Heartbeat("o1", task.seq, attempt_id=task.attempt_id, details=b'{"done": 1}'))
    core.advance(3)  # 30 s after its start
    [failed] = core.facts("o1", "StepFailed")
    assert failed.error.startswith("StepTimeout: remote step 'charge' (task group 'payments')")
    assert "within its timeout of 30s" in failed.error and '{"done": 1}' in failed.error
    assert failed.retry_at_ms is not None
    core.advance(1)
    assert [t.attempt for t in core.tasks] == [1, 2]


def test_an_attempt_silent_for_its_heartbeat_interval_times_out():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    core.advance(9.9)
    assert not core.facts("o1", "StepFailed")
    core.advance(0.1)
    [failed] = core.facts("o1", "StepFailed")
    assert "sent no heartbeat for 10s" in failed.error


def test_a_heartbeat_moves_the_liveness_deadline_and_is_no_fact():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    task = core.tasks[0]
    facts = len(core.journal)
    core.advance(8)
    core.command(Heartbeat("o1", task.seq, attempt_id=task.attempt_id, details=b'{"done": 5}'))
    assert len(core.journal) == facts  # no journal fact per heartbeat
    assert core.state("o1").beats[task.seq] == (core.now, b'{"done": 5}')
    core.advance(9)  # 17 s after the start, 9 after the heartbeat
    assert not core.facts("o1", "StepFailed")
    core.command(  # not the open attempt
        Heartbeat("o1", task.seq, attempt_id="someone-else", details=None)
    )
    core.advance(1)
    assert core.facts("o1", "StepFailed")


def test_a_new_owner_gives_an_attempt_one_full_interval_from_the_takeover():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    core.advance(5)
    core.since = core.now  # another instance takes the partition over: no beats seen
    core.advance(5)  # 10 s after the start, 5 after the takeover
    assert not core.facts("o1", "StepFailed")
    core.advance(5)
    assert core.facts("o1", "StepFailed")


def test_a_new_owners_grace_has_no_fact_but_is_a_change_the_shell_keeps():
    """The grace moves the attempt's liveness timer; the batch has nothing to commit, so
    the shell must keep it as a change (`Batch.changed`), or the attempt never times out."""
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    core.advance(5)
    core.since = core.now  # another instance takes the partition over
    core.now += 5_000  # 10 s after the start: its timer is due
    b = core.handle(TimerDue(0, "o1", 2))
    assert not b.effects.facts and b.empty
    assert b.changed
    assert (core.since + 10_000, 2) in core.state("o1").timers()


def test_recovery_and_handover_leave_remote_attempts_to_their_workers():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    core.recover("o1")
    core.hand_over("o1")
    assert core.names("o1") == ["RunStarted", "StepStarted", "StepCompleted", "StepStarted"]
    assert len(core.tasks) == 1 and not core.queued
    core.answer(core.tasks[0], {"receipt": "r"})
    assert core.state("o1").status == "completed"


def test_a_cancel_with_compensation_waits_for_the_remote_attempt():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    core.cancel("o1", compensate=True)
    assert core.state("o1").status == "compensating"
    core.answer(core.tasks[0], {"receipt": "r"})
    assert core.state("o1").status == "cancelled"


def test_arguments_that_are_not_json_fail_the_step_for_good():
    @app.workflow(name="bad_args")
    async def bad_args(ctx) -> None:
        await ctx.step(charge, object())

    core = Core(app.registry)
    core.start("o1", "bad_args")
    [failed] = core.facts("o1", "StepFailed")
    assert "are not JSON" in failed.error and failed.retry_at_ms is None
    assert not core.tasks
