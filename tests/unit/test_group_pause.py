"""A task group's pause on the pure core (`rules.taskgroups`): no remote attempt of a
paused group is sent; the held ones go out on unpause with their whole timeout; attempts
already sent finish; a cancel, the run timeout, a retry's backoff, a run pause, a crash
and duplicates, each while the group is paused."""

from __future__ import annotations

from runstream import App
from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.partitioner import task_group_id
from runstream.engine.reducer import fold
from runstream.engine.state import TaskGroupState
from runstream.schemas.records import (
    Pause,
    Reason,
    ReleaseTask,
    StartRun,
    StepHeld,
    StepStarted,
    Unpause,
)

from .corehelp import Core

app = App("unit")


@app.step(group="payments", retries=2, backoff=5, timeout="30s")
def charge(order: dict) -> dict:
    raise AssertionError("a remote step never runs in the engine")


@app.step(group="mail")
def notify(order: dict) -> None:
    raise AssertionError("a remote step never runs in the engine")


def local(x: int) -> int:
    return x + 1


@app.workflow
async def checkout(ctx, order: dict) -> dict:
    n = await ctx.step(local, 1)
    receipt = await ctx.step(charge, order)
    return {"n": n, **receipt}


@app.workflow
async def mailer(ctx, order: dict) -> None:
    await ctx.step(notify, order)


GROUP = task_group_id("payments", 0, 1)  # the Core has one partition


def pause(core: Core, group: str = GROUP, pid: str = "p1") -> None:
    core.command(Pause(group, "carrier down", by="ops@host", pause_id=pid))


def unpause(core: Core, group: str = GROUP, pid: str = "u1") -> None:
    core.command(Unpause(group, "back", by="ops@host", pause_id=pid))
    deliver_releases(core)


def deliver_releases(core: Core) -> None:
    """The ReleaseTask commands the unpause sent, delivered (as Kafka would)."""
    releases = [c for c in core.commands if isinstance(c, ReleaseTask)]
    core.commands = [c for c in core.commands if not isinstance(c, ReleaseTask)]
    for cmd in releases:
        core.command(cmd)


def group(core: Core) -> TaskGroupState:
    st = core.state(GROUP)
    assert isinstance(st, TaskGroupState)
    return st


def test_a_step_of_a_paused_group_is_held_not_sent_and_goes_out_on_unpause():
    core = Core(app.registry)
    pause(core)
    core.start("o1", "checkout", {"id": 7})
    assert not core.tasks  # nothing handed out
    [held] = core.facts("o1", "StepHeld")
    assert (held.seq, held.attempt, held.group) == (2, 1, "payments")
    [event] = [e for e in core.lifecycle if e.type == "step.held"]
    assert "task group 'payments' paused: carrier down" in (event.reason or "")
    assert group(core).held == [("o1", 2)]

    core.advance(3600)  # held: no clock of the step runs
    assert not core.tasks and core.state("o1").status == "running"

    unpause(core)
    [task] = core.tasks
    [started] = [f for f in core.facts("o1", "StepStarted") if f.remote]
    assert started.attempt == 1 and started.deadline_ms == core.now + 30_000  # its whole timeout
    core.answer(task, {"receipt": "r"})
    assert payload.loads(core.state("o1").output) == {"n": 2, "receipt": "r"}
    assert check_run(core.facts("o1"), expect_finished=True) == []


def test_an_attempt_sent_before_the_pause_finishes_and_is_recorded():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    [task] = core.tasks
    pause(core)
    core.answer(task, {"receipt": "r"})
    assert core.state("o1").status == "completed"


def test_only_the_paused_group_is_held():
    core = Core(app.registry)
    pause(core)
    core.start("m1", "mailer", {})
    [task] = core.tasks
    assert task.group == "mail" and not core.facts("m1", "StepHeld")


def test_a_retry_whose_backoff_ends_while_paused_is_held_then_sent_as_the_next_attempt():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    core.answer(core.tasks[0], error="busy")  # retried in 5 s
    pause(core)
    core.advance(5)
    assert len(core.tasks) == 1
    [held] = core.facts("o1", "StepHeld")
    assert held.attempt == 2
    unpause(core)
    assert [t.attempt for t in core.tasks] == [1, 2]
    core.answer(core.tasks[-1], {"receipt": "r"})
    assert core.state("o1").status == "completed"
    assert check_run(core.facts("o1"), expect_finished=True) == []


def test_a_run_cancelled_while_its_step_is_held_ends_and_the_unpause_sends_nothing():
    core = Core(app.registry)
    pause(core)
    core.start("o1", "checkout", {})
    core.cancel("o1", compensate=True)
    assert core.state("o1").status == "cancelled"
    facts = len(core.journal)
    unpause(core)
    assert not core.tasks
    assert [type(f).__name__ for f in core.journal[facts:]] == ["GroupUnpaused"]
    assert not core.dead


def test_the_run_timeout_ends_a_run_whose_step_is_held():
    core = Core(app.registry)
    pause(core)
    core.command(StartRun("o1", "checkout", input=b"{}", timeout_ms=60_000))
    core.advance(61)
    assert core.state("o1").status == "failed"
    unpause(core)
    assert not core.tasks and core.state("o1").status == "failed"


def test_a_paused_run_whose_group_is_unpaused_sends_its_step_on_its_own_unpause():
    core = Core(app.registry)
    pause(core)
    core.start("o1", "checkout", {})
    core.command(Pause("o1", "look", pause_id="r1"))
    unpause(core)  # the run is paused: its code does not go on
    assert not core.tasks
    core.command(Unpause("o1", "done", pause_id="r2"))
    [task] = core.tasks
    assert task.attempt == 1


def test_a_release_that_comes_after_a_new_pause_holds_the_step_again():
    core = Core(app.registry)
    pause(core)
    core.start("o1", "checkout", {})
    core.command(Unpause(GROUP, "back", pause_id="u1"))  # its ReleaseTask not delivered yet
    pause(core, pid="p2")
    deliver_releases(core)
    assert not core.tasks and group(core).held == [("o1", 2)]  # known again to the group
    unpause(core, pid="u2")
    assert len(core.tasks) == 1


def test_a_duplicate_pause_and_an_unpause_of_a_group_never_paused_change_nothing():
    core = Core(app.registry)
    unpause(core)  # never paused
    assert not core.journal and not core.dead
    pause(core)
    pause(core)  # the same command again
    pause(core, pid="p2")  # another pause of a paused group
    assert [type(f).__name__ for f in core.journal] == ["GroupPaused"]
    unpause(core)
    unpause(core)
    assert [type(f).__name__ for f in core.journal] == ["GroupPaused", "GroupUnpaused"]
    pause(core)  # the first pause's id, redelivered after the unpause
    assert len(core.journal) == 2 and group(core).paused is None


def test_a_pause_keyed_by_an_id_of_another_partition_is_refused():
    core = Core(app.registry)
    core.command(Pause("~taskgroup/payments/3.0", "x", pause_id="p"))
    [dead] = core.dead
    assert dead.code == Reason.BAD_RUN_ID and "not the id of a task group" in dead.reason


def test_a_release_for_a_step_not_held_changes_nothing():
    core = Core(app.registry)
    core.start("o1", "checkout", {})
    facts = len(core.journal)
    core.command(ReleaseTask("o1", 2, group="payments"))
    assert len(core.journal) == facts and len(core.tasks) == 1


def test_after_a_crash_the_pause_and_the_held_steps_are_restored_from_the_journal():
    core = Core(app.registry)
    pause(core)
    core.start("o1", "checkout", {})
    core.states = {}  # a new owner: the working states are gone ...
    for key in {f.run_id for f in core.journal}:  # ... and folded from the journal
        core.states[key] = fold(key, core.facts(key))
    core.recover("o1")
    core.start("o2", "checkout", {})
    assert not core.tasks
    assert group(core).held == [("o1", 2), ("o2", 2)]
    unpause(core)
    assert sorted(t.run_id for t in core.tasks) == ["o1", "o2"]


def test_a_held_step_is_not_in_flight_for_a_recovery_or_a_handover():
    core = Core(app.registry)
    pause(core)
    core.start("o1", "checkout", {})
    facts = len(core.journal)
    core.hand_over("o1")
    core.recover("o1")
    assert len(core.journal) == facts and not core.tasks
    assert isinstance(core.state("o1").pending[2], StepHeld)  # type: ignore[union-attr]
    unpause(core)
    assert [type(f) for f in core.journal[-1:]] == [StepStarted]


def test_a_decision_that_fails_after_holding_a_step_leaves_no_trace_on_the_group(monkeypatch):
    """The decision guard undoes every key the decision wrote to: the run's and the
    group's (its TaskHeld), not the run's alone."""
    from runstream.engine.rules import taskgroups

    real = taskgroups.holds

    def holds_then_breaks(*args, **kwargs):  # type: ignore[no-untyped-def]
        real(*args, **kwargs)
        raise RuntimeError("a bug after the hold")

    core = Core(app.registry)
    pause(core)
    monkeypatch.setattr(taskgroups, "holds", holds_then_breaks)
    core.start("o1", "checkout", {})
    [dead] = core.dead
    assert dead.code == Reason.INTERNAL
    assert group(core).held == [] and not core.facts(GROUP, "TaskHeld")
    assert not core.facts("o1", "StepHeld")  # the run undone too (as it always was)


def test_tasks_status_tells_a_paused_group_and_its_held_steps_from_the_journal():
    from runstream.cli.tasks_status import remote_attempts

    core = Core(app.registry)
    core.start("o0", "checkout", {})  # sent before the pause: in flight
    pause(core)
    core.start("o1", "checkout", {})
    core.start("o2", "checkout", {})
    core.cancel("o2")
    payments = remote_attempts(core.journal, 0)["payments"]
    assert (payments.in_flight, payments.held) == (1, 1)
    [paused] = payments.paused
    assert (paused.by, paused.reason) == ("ops@host", "carrier down")
    unpause(core)
    payments = remote_attempts(core.journal, 0)["payments"]
    assert (payments.in_flight, payments.held, payments.paused) == (2, 0, [])


def test_the_workflow_tester_pauses_a_task_group():
    from runstream.testing import WorkflowTester

    served: list[int] = []
    tester_app = App("tester")

    @tester_app.step(group="payments", timeout="30s")
    def pay(n: int) -> int:
        served.append(n)
        return n * 2

    @tester_app.workflow
    async def paying(ctx, n: int) -> int:
        return await ctx.step(pay, n)

    t = WorkflowTester(tester_app)
    t.pause_group("payments", reason="PSP maintenance")
    run = t.start(paying, 21, run_id="p-1")
    t.run_until_idle()
    assert run.status == "running" and served == []
    t.unpause_group("payments")
    assert run.status == "completed" and served == [21]


def test_a_run_that_timed_out_while_held_and_is_retried_is_held_again_then_sent():
    from runstream.schemas.records import Retry

    core = Core(app.registry)
    pause(core)
    core.command(StartRun("o1", "checkout", input=b"{}", timeout_ms=60_000))
    core.advance(61)
    assert core.state("o1").status == "failed"
    core.command(Retry("o1", "again", retry_id="r1"))
    assert core.state("o1").status == "running" and not core.tasks
    assert len(core.facts("o1", "StepHeld")) == 2
    unpause(core)
    [task] = core.tasks
    core.answer(task, {"receipt": "r"})
    assert core.state("o1").status == "completed"
    assert check_run(core.facts("o1"), expect_finished=True) == []


def test_the_dashboard_shows_a_held_step_as_what_the_run_waits_on():
    from runstream.ui.history import story

    core = Core(app.registry)
    pause(core)
    core.start("o1", "checkout", {})
    [wait] = story(core.facts("o1")).waits
    assert wait.kind == "held" and wait.label == "task group 'payments' paused (step charge #2)"
    unpause(core)
    s = story(core.facts("o1"))
    assert s.waits == [] and [sp.outcome for sp in s.spans if sp.kind == "held"] == ["sent"]


def test_where_takes_key_for_a_pause_only():
    import click
    import pytest

    from runstream.cli.runs_ops import parse_where

    assert parse_where("workflow=order,key=acme", keyed=True) == {
        "workflow": "order",
        "key": "acme",
    }
    with pytest.raises(click.BadParameter, match="use status=S, workflow=W, version=V or tag"):
        parse_where("key=acme")  # as runs cancel --where reads it
