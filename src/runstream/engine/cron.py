"""Fire times of a schedule's cron expression, in its time zone (croniter does the cron)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter


def problem(cron: str, tz: str) -> str | None:
    """Why ``cron`` in ``tz`` cannot be a schedule, or None if it can."""
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {tz!r} (use an IANA name such as 'Europe/Paris' or 'UTC')"
    if not croniter.is_valid(cron):
        return f"not a cron expression: {cron!r} (5 fields, or 6 with seconds last)"
    return None


def next_fire(cron: str, tz: str, after_ms: int) -> int:
    """The first fire time strictly after ``after_ms`` (ms since the epoch)."""
    start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(ZoneInfo(tz))
    return int(croniter(cron, start).get_next(datetime).timestamp() * 1000)


def latest_fire(cron: str, tz: str, at_ms: int) -> int:
    """The last fire time at or before ``at_ms``."""
    start = datetime.fromtimestamp((at_ms + 1) / 1000, UTC).astimezone(ZoneInfo(tz))
    return int(croniter(cron, start).get_prev(datetime).timestamp() * 1000)


def iso(ms: int) -> str:
    """A fire time as run ids name it: UTC, to the second (or the millisecond)."""
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    return dt.isoformat(timespec="milliseconds" if ms % 1000 else "seconds").replace("+00:00", "Z")
