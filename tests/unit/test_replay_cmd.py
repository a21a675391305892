"""`runstream replay`'s check, on histories the pure core records (no Kafka)."""

from __future__ import annotations

from runstream.cli.replay_cmd import OPEN, check, selected
from runstream.engine.reducer import fold
from runstream.engine.state import RunState
from runstream.engine.workflow import Registry, workflow_def

from .corehelp import Core

executed: list[str] = []


def reserve(order: str) -> str:
    executed.append("reserve")
    return f"r-{order}"


def charge(order: str) -> str:
    executed.append("charge")
    return f"c-{order}"


def ship(order: str) -> str:
    executed.append("ship")
    return f"s-{order}"


async def order(ctx, order_id: str) -> list:
    done = [await ctx.step(reserve, order_id), await ctx.step(charge, order_id)]
    await ctx.wait_for_signal("approve")
    return done


async def order_reordered(ctx, order_id: str) -> list:
    return [await ctx.step(charge, order_id), await ctx.step(reserve, order_id)]


async def order_then_ship(ctx, order_id: str) -> list:
    done = await order(ctx, order_id)
    return [*done, await ctx.step(ship, order_id)]


async def order_without_approval(ctx, order_id: str) -> list:
    return [await ctx.step(reserve, order_id), await ctx.step(charge, order_id)]


def code(fn, version: str = "1") -> Registry:
    reg = Registry()
    reg.add_workflow(workflow_def(fn, name="order", version=version))
    return reg


def recorded(*, approve: bool) -> RunState:
    """A run of `order` as the engine recorded it, rebuilt from its facts."""
    core = Core(code(order))
    core.start("o1", "order", "A")
    if approve:
        core.signal("o1", "approve", "ann")
    executed.clear()
    return fold("o1", core.facts("o1"))


def test_the_code_that_recorded_a_run_fits_it_without_executing_a_step():
    for approve in (False, True):
        state = recorded(approve=approve)
        verdict = check(state, code(order), now_ms=0)
        assert verdict.fits and verdict.problem is None, verdict
        assert (verdict.run_id, verdict.workflow, verdict.version) == ("o1", "order", "1")
    assert executed == []


def test_changed_step_order_names_the_seq_and_both_operations():
    verdict = check(recorded(approve=True), code(order_reordered), now_ms=0)
    assert not verdict.fits
    assert (verdict.seq, verdict.recorded, verdict.requested) == (1, "step reserve", "step charge")
    assert "at seq 1 the history has 'step reserve', the code asks for 'step charge'" in (
        verdict.line()
    )
    assert executed == []


def test_code_that_asks_for_more_after_a_completed_run_does_not_fit():
    verdict = check(recorded(approve=True), code(order_then_ship), now_ms=0)
    assert (verdict.seq, verdict.recorded, verdict.requested) == (4, "the end", "step ship")


def test_an_open_run_may_wait_for_more_than_its_history_has():
    assert check(recorded(approve=False), code(order_then_ship), now_ms=0).fits


def test_code_that_ends_before_the_recorded_operations_does_not_fit():
    verdict = check(recorded(approve=True), code(order_without_approval), now_ms=0)
    assert (verdict.seq, verdict.recorded, verdict.requested) == (3, "signal approve", "the end")


def test_a_run_whose_version_the_code_lacks_does_not_fit():
    verdict = check(recorded(approve=False), code(order, version="2"), now_ms=0)
    assert not verdict.fits and verdict.seq is None
    assert verdict.problem == "the code has no workflow 'order' version '1'"


def test_a_handed_over_step_replays_as_the_step_it_was():
    core = Core(code(order))
    core.auto_run_steps = False
    core.start("o1", "order", "A")
    core.hand_over("o1", began=frozenset({1}))
    state = fold("o1", core.facts("o1"))
    assert state.handed_over_steps() == [1]
    assert check(state, code(order), now_ms=0).fits
    verdict = check(state, code(order_reordered), now_ms=0)
    assert (verdict.seq, verdict.recorded, verdict.requested) == (1, "step reserve", "step charge")


def test_status_selection_takes_open_runs_of_the_workflow_only():
    waiting, done = recorded(approve=False), recorded(approve=True)
    assert selected(waiting, "order", (OPEN,)) and not selected(done, "order", (OPEN,))
    assert selected(waiting, "order", ("running",)) and selected(done, "order", ("completed",))
    assert not selected(waiting, "other", (OPEN,))
    assert not selected(RunState("never-started"), "", (OPEN,))
