"""Each kind of id has its own state: a run, an event entity, a limit, a schedule (no Kafka)."""

from __future__ import annotations

import pytest

from runstream import App
from runstream.engine.reducer import UnknownFactError, apply, fold
from runstream.engine.state import EventEntityState, LimitState, RunState, ScheduleState
from runstream.schemas.records import (
    Acquire,
    LimitSet,
    PublishEvent,
    ScheduleCommand,
    Signal,
    correlation_id,
    limit_id,
    schedule_id,
)

from .corehelp import Core

app = App("unit")


@app.workflow()
async def waits(ctx, _: None) -> str:
    return await ctx.wait_for_signal("go")


def test_each_kind_of_id_folds_into_its_own_state():
    assert type(fold("r", [])) is RunState
    assert type(fold(correlation_id("paid", "o-1"), [])) is EventEntityState
    assert type(fold(limit_id("payments"), [])) is LimitState
    assert type(fold(schedule_id("nightly"), [])) is ScheduleState
    with pytest.raises(UnknownFactError):
        apply(RunState("r"), LimitSet("r", 1, concurrency=2, rate=None, burst=1, max_queued=None))


def test_a_command_for_another_kind_of_id_is_refused_and_records_nothing():
    core = Core(app.registry)
    core.start("r", "waits")
    before = list(core.journal)
    core.command(Acquire("r", "someone", seq=1, concurrency=1))  # a limit's command, to a run
    core.command(  # a run's, to a limit
        Signal(limit_id("payments"), "go", payload=b"1", signal_id="s1")
    )
    core.command(PublishEvent(schedule_id("nightly"), "paid", event_id="e1", payload=b"1"))
    core.command(ScheduleCommand(correlation_id("paid", ""), "pause"))
    assert [d.code for d in core.dead] == ["bad-run-id"] * 4
    assert core.journal == before and core.state("r").status == "running"


def test_a_query_for_an_entity_finds_no_run():
    core = Core(app.registry)
    info = core.query(limit_id("payments"))
    assert (info.run_id, info.found, info.status) == (limit_id("payments"), False, "")
