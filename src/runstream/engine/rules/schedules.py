"""Schedules: an entity ``~schedule/<name>`` per schedule, set, paused, resumed or
deleted by command, and fired by its timer (`timers.timer_due`)."""

from __future__ import annotations

from runstream.engine import cron
from runstream.engine.rules import core, runs
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import ScheduleState
from runstream.engine.work import Batch
from runstream.schemas.records import (
    Reason,
    ScheduleChanged,
    ScheduleCommand,
    ScheduleFired,
    ScheduleSet,
    StartRun,
    schedule_id,
)


def schedule(ctx: Rules, b: Batch, ent: ScheduleState, cmd: ScheduleCommand) -> None:
    """Set (create or replace), pause, resume or delete a schedule."""
    name = ent.run_id.removeprefix(schedule_id(""))
    now = b.now
    match cmd.op:
        case "set":
            problem = cron.problem(cmd.cron, cmd.tz)
            if problem:
                raise Rejected(Reason.INVALID_INPUT, f"schedule {name!r}: {problem}")
            data = b"null" if cmd.input is None else cmd.input
            runs.checked(ctx, cmd.workflow, None, data)
            first = cron.next_fire(cmd.cron, cmd.tz, now)
            fact = ScheduleSet(
                ent.run_id,
                now,
                name=name,
                workflow=cmd.workflow,
                input=data,
                cron=cmd.cron,
                tz=cmd.tz,
                next_fire_ms=first,
            )
            core.emit(b, ent, fact)
        case "pause" | "resume" | "delete" if ent.schedule is None:
            raise Rejected(Reason.UNKNOWN_RUN, f"no schedule {name!r}")
        case "pause" if not ent.paused:
            core.emit(b, ent, ScheduleChanged(ent.run_id, now, op="paused", next_fire_ms=None))
        case "resume" if ent.paused:
            assert ent.schedule is not None
            nxt = cron.next_fire(ent.schedule.cron, ent.schedule.tz, now)  # skip the missed
            core.emit(b, ent, ScheduleChanged(ent.run_id, now, op="resumed", next_fire_ms=nxt))
        case "delete":
            core.emit(b, ent, ScheduleChanged(ent.run_id, now, op="deleted", next_fire_ms=None))
        case "pause" | "resume":
            pass  # already so
        case _:
            raise Rejected(Reason.INVALID_INPUT, f"no schedule operation {cmd.op!r}")


def fire(b: Batch, ent: ScheduleState) -> None:
    """The schedule's next fire time came: start its workflow once, for the latest fire
    time due (fires missed while no engine ran are caught up once, not each), with a
    run id derived from that time, and arm the next."""
    s, due = ent.schedule, ent.next_fire_ms
    if s is None or ent.paused or due is None or due > b.now:
        return
    fire = max(due, cron.latest_fire(s.cron, s.tz, b.now))
    run_id = f"{s.name}@{cron.iso(fire)}"
    nxt = cron.next_fire(s.cron, s.tz, max(fire, b.now))
    core.emit(b, ent, ScheduleFired(ent.run_id, b.now, fire_ms=fire, run=run_id, next_fire_ms=nxt))
    start = StartRun(run_id, s.workflow, input=s.input, tags={"schedule": s.name}, sent_at_ms=b.now)
    b.effects.commands.append(start)
