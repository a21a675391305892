"""A run's history has a warning size and a hard cap, in events and in payload bytes
(`Limits`, from `Settings.history_*`): past the warning the lifecycle stream says so once;
at the cap the run fails with the code ``history-too-large``, whose error says to continue
as new. Checked in the decision, before the run's code runs again."""

from __future__ import annotations

from typing import Any

from runstream import App
from runstream.engine.limits import Limits
from runstream.engine.reducer import fold
from runstream.errors import Failure, HistoryTooLarge, run_failed
from runstream.schemas.records import Kind, RunFailed

from .corehelp import Core

app = App("caps")


@app.step(retries=0)
def tick(n: int) -> int:
    return n


@app.step(retries=0)
def blob(n: int) -> str:
    return "x" * 1_000


@app.workflow
async def forever(ctx: Any, n: int) -> None:
    i = 0
    while True:
        await ctx.step(tick, i)
        i += 1


@app.workflow
async def big_outputs(ctx: Any, n: int) -> None:
    i = 0
    while True:
        await ctx.step(blob, i)
        i += 1


@app.workflow
async def rolling(ctx: Any, n: int) -> int:
    """A long loop done right: a few steps, then continue as new."""
    for i in range(5):
        await ctx.step(tick, i)
    if n < 8:
        ctx.continue_as_new(n + 1)
    return n


SMALL = Limits(history_events_warn=20, history_events_max=40)


def warnings(core: Core, run_id: str) -> list[Any]:
    return [e for e in core.lifecycle if e.type == Kind.RUN_HISTORY_LARGE and e.run_id == run_id]


def test_a_run_past_its_event_cap_fails_with_a_code_that_says_continue_as_new():
    core = Core(app.registry, limits=SMALL)
    core.start("r", "forever", 0)
    st = core.state("r")
    assert st.status == "failed" and st.code == Failure.HISTORY_TOO_LARGE
    assert "continue_as_new" in (st.error or "")
    assert 40 <= st.facts <= 42  # the cap, then the failure itself
    [failed] = core.facts("r", "RunFailed")
    assert isinstance(run_failed("r", failed.error, code=failed.code), HistoryTooLarge)


def test_the_warning_goes_on_the_lifecycle_stream_once():
    core = Core(app.registry, limits=SMALL)
    core.start("r", "forever", 0)
    [warned] = warnings(core, "r")
    assert "20" in (warned.reason or "")


def test_a_run_past_its_byte_cap_fails_too():
    core = Core(app.registry, limits=Limits(history_bytes_warn=5_000, history_bytes_max=10_000))
    core.start("r", "big_outputs", 0)
    st = core.state("r")
    assert st.code == Failure.HISTORY_TOO_LARGE
    assert "bytes" in (st.error or "")
    assert len(warnings(core, "r")) == 1


def test_a_loop_that_continues_as_new_stays_under_the_cap():
    core = Core(app.registry, limits=SMALL)
    core.start("r", "rolling", 0)
    while core.commands:  # the successors' starts
        core.command(core.commands.pop(0))
    ids = ["r"] + [f"r~{i}" for i in range(1, 9)]  # the chain: r, r~1, ..., r~8
    assert [core.state(i).status for i in ids] == ["completed"] * 9
    assert sum(core.state(i).steps for i in ids) == 45  # more than the cap of one history
    assert not any(warnings(core, i) for i in ids)


def test_the_history_size_folds_from_the_journal():
    """The byte count is state like any other: a new owner folds the same from the journal."""
    core = Core(app.registry, limits=Limits(history_bytes_warn=5_000, history_bytes_max=10_000))
    core.start("r", "big_outputs", 0)
    assert fold("r", core.facts("r")).history_bytes == core.state("r").history_bytes > 10_000
    assert core.facts("r", "RunFailed")[0].code == Failure.HISTORY_TOO_LARGE
    assert isinstance(core.facts("r")[-1], RunFailed)


def test_a_retried_run_past_its_cap_fails_again_and_a_cancel_still_ends_it():
    """Where the cap meets retry and cancel: a retry of a run that failed at its cap
    fails again at once with the same code (its history is no shorter; the README says
    so), and a cancel of a run at its warning size still cancels it."""
    from runstream.schemas.records import Cancel, Retry

    core = Core(app.registry, limits=SMALL)
    core.start("r", "forever", 0)
    core.command(Retry("r", "again", retry_id="t1"))
    fails = core.facts("r", "RunFailed")
    assert len(fails) == 2 and {f.code for f in fails} == {Failure.HISTORY_TOO_LARGE}
    assert core.names("r")[-2:] == ["RunRetried", "RunFailed"]  # no step ran between

    warned = Core(app.registry, limits=Limits(history_events_warn=4, history_events_max=10_000))
    warned.auto_run_steps = False
    warned.start("w", "forever", 0)
    for _ in range(3):
        warned.run_step(warned.queued.pop())
    assert warnings(warned, "w")
    warned.command(Cancel("w", False, reason="enough"))
    warned.run_step(warned.queued.pop())  # the step in flight ends; the cancel takes
    assert warned.state("w").status == "cancelled"
