"""A cancel follows continue-as-new to the run that is current (issue 19, defect 5)."""

from __future__ import annotations

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.workflow import Registry, workflow_def
from runstream.schemas.records import Cancel

from .corehelp import Core


async def looper(ctx, n: int) -> str:
    if n > 0:
        ctx.continue_as_new(n - 1)
    return await ctx.wait_for_signal("go")


async def holder(ctx, n: int) -> str:
    return await ctx.child(looper, n)


async def launcher(ctx, n: int) -> str:
    await ctx.start_child(looper, n)
    return await ctx.wait_for_signal("stop")


def _core() -> Core:
    reg = Registry()
    for wf in (looper, holder, launcher):
        reg.add_workflow(workflow_def(wf))
    return Core(reg)


def pump(core: Core) -> None:
    while core.commands:
        core.command(core.commands.pop(0))


def test_cancelling_a_run_that_continued_as_new_cancels_the_current_one():
    core = _core()
    core.start("p/1", "looper", 2)
    pump(core)
    assert core.state("p/1~2").status == "running"
    core.cancel("p/1")
    pump(core)
    assert core.state("p/1").status == "completed"  # it ended as it did
    assert core.state("p/1~2").status == "cancelled"
    assert check_run(core.facts("p/1~2"), expect_finished=True) == []


def test_cancelling_a_parent_cancels_the_child_it_awaits_after_continue_as_new():
    core = _core()
    core.start("h", "holder", 1)
    pump(core)
    assert core.state("h/1~1").status == "running"
    core.cancel("h")
    pump(core)
    assert core.state("h/1~1").status == "cancelled"
    assert core.state("h").status == "cancelled"


def test_a_parent_ending_first_cancels_its_child_after_continue_as_new():
    core = _core()
    core.start("l", "launcher", 1)
    pump(core)
    assert core.state("l/1~1").status == "running"
    core.signal("l", "stop", "now")  # parent_close=request_cancel
    pump(core)
    assert core.state("l").status == "completed"
    assert core.state("l/1~1").status == "cancelled"


def test_a_child_that_continued_as_new_still_answers_its_parent():
    core = _core()
    core.start("h", "holder", 1)
    pump(core)
    core.signal("h/1~1", "go", "went")
    pump(core)
    assert core.state("h").status == "completed"
    assert payload.loads(core.state("h").output) == "went"
    assert core.dead == []


def test_a_cancel_of_a_finished_run_that_did_not_continue_changes_nothing():
    core = _core()
    core.start("q", "looper", 0)
    core.signal("q", "go", 1)
    core.command(Cancel("q"))
    assert core.commands == [] and core.state("q").status == "completed"
