"""Schedules on the pure core: fire times, catch-up once, pause, resume, delete."""

from __future__ import annotations

from datetime import UTC, datetime

from runstream.audit import check_run
from runstream.engine import cron
from runstream.engine.workflow import Registry, workflow_def
from runstream.schemas.records import ScheduleCommand, schedule_id

from .corehelp import Core

T0 = int(datetime(2026, 3, 1, 2, 59, 30, tzinfo=UTC).timestamp() * 1000)


async def report(ctx, day: str) -> str:
    return f"report {day}"


def _core() -> Core:
    reg = Registry()
    reg.add_workflow(workflow_def(report))
    core = Core(reg)
    core.now = T0
    return core


def pump(core: Core) -> None:
    while core.commands:
        core.command(core.commands.pop(0))


def runs(core: Core) -> list[str]:
    return sorted(r for r in core.states if r.startswith("nightly@"))


def test_a_schedule_fires_on_time_and_each_start_is_a_run_named_by_its_fire_time():
    core = _core()
    core.command(
        ScheduleCommand(
            schedule_id("nightly"), "set", workflow="report", input=b'"d"', cron="0 3 * * *"
        )
    )
    core.advance(29)
    assert runs(core) == []
    core.advance(1)  # 03:00:00
    pump(core)
    assert runs(core) == ["nightly@2026-03-01T03:00:00Z"]
    assert core.state("nightly@2026-03-01T03:00:00Z").status == "completed"
    assert core.state("nightly@2026-03-01T03:00:00Z").tags == {"schedule": "nightly"}
    core.advance(86_400)
    pump(core)
    assert runs(core)[-1] == "nightly@2026-03-02T03:00:00Z"
    assert check_run(core.facts(schedule_id("nightly"))) == []


def test_fires_missed_while_down_are_caught_up_once_then_on_time_again():
    core = _core()
    core.command(
        ScheduleCommand(
            schedule_id("nightly"), "set", workflow="report", input=b'"d"', cron="0 3 * * *"
        )
    )
    core.now += 2 * 86_400 * 1000 + 3600_000  # down across two fire times (and then some)
    core.advance(0)
    pump(core)
    assert runs(core) == ["nightly@2026-03-03T03:00:00Z"]  # the latest due, once
    core.advance(86_400)
    pump(core)
    assert runs(core) == ["nightly@2026-03-03T03:00:00Z", "nightly@2026-03-04T03:00:00Z"]


def test_pause_resume_and_delete():
    core = _core()
    sid = schedule_id("nightly")
    core.command(ScheduleCommand(sid, "set", workflow="report", input=b'"d"', cron="0 3 * * *"))
    core.command(ScheduleCommand(sid, "pause"))
    core.advance(2 * 86_400)
    pump(core)
    assert runs(core) == []
    core.command(ScheduleCommand(sid, "resume"))  # the fires missed while paused: none
    assert core.state(sid).next_fire_ms == cron.next_fire("0 3 * * *", "UTC", core.now)
    core.advance(86_400)
    pump(core)
    assert len(runs(core)) == 1
    core.command(ScheduleCommand(sid, "delete"))
    core.advance(7 * 86_400)
    pump(core)
    assert len(runs(core)) == 1 and core.state(sid).timers() == set()


def test_a_bad_cron_a_bad_zone_an_unknown_workflow_or_schedule_are_dead_lettered():
    core = _core()
    sid = schedule_id("x")
    core.command(ScheduleCommand(sid, "set", workflow="report", input=b'"d"', cron="every day"))
    core.command(
        ScheduleCommand(
            sid, "set", workflow="report", input=b'"d"', cron="0 3 * * *", tz="Mars/Base"
        )
    )
    core.command(ScheduleCommand(sid, "set", workflow="nope", input=b'"d"', cron="0 3 * * *"))
    core.command(ScheduleCommand(schedule_id("never"), "pause"))
    assert [d.code for d in core.dead] == [
        "invalid-input",
        "invalid-input",
        "unknown-workflow",
        "unknown-run",
    ]
    assert "not a cron expression" in core.dead[0].reason


def test_a_cron_is_read_in_its_time_zone():
    # 03:00 in Paris on 1 March 2026 (UTC+1) is 02:00 UTC
    first = cron.next_fire("0 3 * * *", "Europe/Paris", T0 - 3600_000)
    assert cron.iso(first) == "2026-03-01T02:00:00Z"


def test_the_testing_kit_runs_a_schedule_on_its_fake_clock():
    import runstream
    from runstream.testing import WorkflowTester

    app = runstream.App("kit")

    @app.workflow
    async def ping(ctx) -> str:
        return "pong"

    t = WorkflowTester(app, now=datetime(2026, 3, 1, tzinfo=UTC))
    t.schedule("hourly", "ping", cron="0 * * * *")
    t.advance("3h")
    for hour in (1, 2, 3):
        assert t.run(f"hourly@2026-03-01T0{hour}:00:00Z").result() == "pong"
