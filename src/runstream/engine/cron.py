"""Fire times of a schedule's cron expression, in its time zone (croniter does the cron).

Around daylight saving time changes we follow Vixie cron:

- a **fixed-time** expression (its minute and hour fields do not start with ``*``, e.g.
  ``30 2 * * *``) is a set of wall times: one that occurs twice (fall-back) fires once, at
  its first occurrence; one that does not exist (spring-forward) fires once, at the moment
  the clock jumps (several such times fire together, once);
- an **interval** expression (``0 * * * *``, ``*/15 2 * * *``) follows the real clock: it
  fires in both passes of a repeated hour, and the times of a skipped hour fire once, at
  the jump.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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
    zone = ZoneInfo(tz)
    start = _local(after_ms, zone)
    if _interval(cron):
        return _ms(croniter(cron, start).get_next(datetime))
    it = croniter(cron, start.replace(tzinfo=None))
    while True:  # a start in the second pass of a repeated hour skips that hour's times
        fire = _instant(it.get_next(datetime), zone)
        if fire > after_ms:
            return fire


def latest_fire(cron: str, tz: str, at_ms: int) -> int:
    """The last fire time at or before ``at_ms``."""
    zone = ZoneInfo(tz)
    start = _local(at_ms + 1, zone)
    if _interval(cron):
        return _ms(croniter(cron, start).get_prev(datetime))
    # in the second pass of a repeated hour, that hour's later wall times fired already
    ahead = start.replace(fold=0).utcoffset() or timedelta()
    ahead -= start.utcoffset() or timedelta()
    it = croniter(cron, start.replace(tzinfo=None) + ahead)
    while True:
        fire = _instant(it.get_prev(datetime), zone)
        if fire <= at_ms:
            return fire


def iso(ms: int) -> str:
    """A fire time as run ids name it: UTC, to the second (or the millisecond)."""
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    return dt.isoformat(timespec="milliseconds" if ms % 1000 else "seconds").replace("+00:00", "Z")


def _interval(cron: str) -> bool:
    """Vixie cron's "wildcard job": its minute or hour field starts with ``*``."""
    fields = cron.split()
    if len(fields) < 2:  # an alias: @daily is fixed-time, @hourly an interval
        fields = [str(values[0]) for values in croniter.expand(cron)[0][:2]]
    return fields[0].startswith("*") or fields[1].startswith("*")


def _instant(wall: datetime, zone: ZoneInfo) -> int:
    """When a wall time of ``zone`` fires: its first occurrence, or, if the clock skips
    it, the moment of the jump."""
    early = _ms(wall.replace(tzinfo=zone, fold=0))
    if _local(early, zone).replace(tzinfo=None) == wall:
        return early
    # skipped: the jump lies between the two readings of ``wall`` (fold=1 takes the
    # offset after the change, the earlier instant); find its second
    lo, hi = _ms(wall.replace(tzinfo=zone, fold=1)), early
    before = _local(lo, zone).utcoffset()
    while hi - lo > 1000:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _local(mid, zone).utcoffset() == before else (lo, mid)
    return hi - hi % 1000


def _local(ms: int, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone(zone)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)
