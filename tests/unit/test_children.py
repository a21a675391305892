"""Child workflows on the pure core: the parent's start, the child's end, cancels."""

from __future__ import annotations

from collections import Counter

import pytest

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.workflow import Registry, StepPolicy, step_def, workflow_def
from runstream.errors import ChildFailed
from runstream.schemas.records import Cancel, ChildResult, StartRun

from .corehelp import Core

ran: Counter[str] = Counter()


def charge(amount: int) -> dict:
    ran["charge"] += 1
    if amount < 0:
        raise ValueError("a negative amount")
    return {"charged": amount}


async def pay(ctx, amount: int) -> dict:
    return await ctx.step(charge, amount)


async def waiter(ctx) -> str:
    return await ctx.wait_for_signal("go")


async def order(ctx, amounts: list[int]) -> list:
    out = []
    for amount in amounts:
        try:
            out.append(await ctx.child(pay, amount))
        except ChildFailed as exc:  # the parent may catch a child's failure
            out.append(f"{exc.status}: {exc.error}")
    return out


async def fan_out(ctx, n: int) -> list[str]:
    handles = [await ctx.start_child("waiter") for _ in range(n)]
    return [h.run_id for h in handles]


async def holder(ctx) -> str:
    return await ctx.child("waiter")


async def bad_child(ctx) -> str:
    try:
        return await ctx.child("nope", 1)
    except ChildFailed as exc:
        return f"caught {exc.status}"


def _core() -> Core:
    reg = Registry()
    for wf in (pay, waiter, order, fan_out, holder, bad_child):
        reg.add_workflow(workflow_def(wf))
    reg.add_step(step_def(charge, StepPolicy(retries=0)))
    ran.clear()
    return Core(reg)


def pump(core: Core) -> None:
    """Deliver the commands runs sent each other, as the commands topic would."""
    while core.commands:
        core.command(core.commands.pop(0))


def test_a_parent_awaits_its_children_and_catches_a_failed_one():
    core = _core()
    core.start("o", "order", [5, -1, 7])
    (start,) = core.commands  # one child at a time: the parent awaits each
    assert (start.run_id, start.parent_run_id, start.parent_seq) == ("o/1", "o", 1)
    pump(core)
    st = core.state("o")
    assert st.status == "completed"
    first, second, third = payload.loads(st.output)
    assert first == {"charged": 5} and third == {"charged": 7}
    assert second.startswith("failed: ") and "a negative amount" in second
    assert [core.state(f"o/{i}").status for i in (1, 2, 3)] == ["completed", "failed", "completed"]
    for run_id in ("o", "o/1", "o/2", "o/3"):
        assert check_run(core.facts(run_id), expect_finished=True) == [], run_id
    assert fold("o", core.facts("o")) == st


def test_a_replayed_parent_never_starts_a_second_child():
    core = _core()
    core.start("o", "order", [1])
    first = list(core.commands)
    core.recover("o")  # a restart replays the parent from its journal
    assert core.commands == first  # nothing new: the child's start is recorded
    pump(core)
    assert core.state("o").status == "completed" and ran["charge"] == 1


def test_a_child_of_an_unknown_workflow_fails_at_once_in_the_parent():
    core = _core()
    core.start("p", "bad_child")
    assert core.commands == []  # no StartRun was sent
    assert payload.loads(core.state("p").output) == "caught rejected"
    assert check_run(core.facts("p"), expect_finished=True) == []


def test_cancelling_a_parent_cancels_its_children_unless_they_are_abandoned():
    core = _core()
    core.start("h", "holder")
    pump(core)
    assert core.state("h/1").status == "running"
    core.cancel("h")
    (cancel,) = core.commands
    assert isinstance(cancel, Cancel) and cancel.run_id == "h/1"
    pump(core)
    assert core.state("h/1").status == "cancelled"
    assert core.state("h").status == "cancelled"  # the child's late end changes nothing
    core.start("k", "holder")
    pump(core)
    core.command(Cancel("k", abandon_children=True))
    assert core.commands == [] and core.state("k/1").status == "running"


def test_fire_and_forget_children_are_cancelled_when_the_parent_ends_first():
    core = _core()
    core.start("f", "fan_out", 3)
    assert core.state("f").status == "completed"
    assert payload.loads(core.state("f").output) == ["f/1", "f/2", "f/3"]
    starts = [c for c in core.commands if isinstance(c, StartRun)]
    assert [s.parent_seq for s in starts] == [None, None, None]  # nobody awaits them
    cancels = [c for c in core.commands if isinstance(c, Cancel)]
    assert sorted(c.run_id for c in cancels) == ["f/1", "f/2", "f/3"]  # request_cancel
    pump(core)
    assert {core.state(f"f/{i}").status for i in (1, 2, 3)} == {"cancelled"}
    assert check_run(core.facts("f"), expect_finished=True) == []


def test_a_child_result_nobody_awaits_is_dead_lettered():
    core = _core()
    core.start("w", "waiter")
    core.command(ChildResult("w", 7, child_run_id="w/7", status="completed", output=b"1"))
    assert [d.code for d in core.dead] == ["unexpected-step-result"]


@pytest.mark.parametrize("bad", ["request", "terminate"])
def test_start_child_checks_parent_close(bad):
    async def wf(ctx) -> None:
        await ctx.start_child("waiter", parent_close=bad)

    reg = Registry()
    reg.add_workflow(workflow_def(wf))
    reg.add_workflow(workflow_def(waiter))
    core = Core(reg)
    core.start("x", "wf")
    if bad == "terminate":
        assert core.state("x").status == "completed"
        (cancel,) = [c for c in core.commands if isinstance(c, Cancel)]
        assert cancel.compensate is False
    else:
        assert core.state("x").status == "failed" and "parent_close" in core.state("x").error


def test_the_testing_kit_runs_a_parent_with_its_children():
    import runstream
    from runstream.testing import WorkflowTester

    app = runstream.App("kit")

    @app.workflow
    async def kid(ctx, n: int) -> int:
        await ctx.sleep("1d")
        return n * n

    @app.workflow
    async def family(ctx, n: int) -> list[int]:
        return [await ctx.child(kid, i) for i in range(n)]

    t = WorkflowTester(app)
    run = t.start("family", 3, run_id="fam")
    t.run_until_idle()
    assert run.result() == [0, 1, 4]
    assert t.run("fam/2").status == "completed"
