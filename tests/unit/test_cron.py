"""Fire times around daylight saving time changes (Europe/Paris, 2026).

The rule is Vixie cron's. A fixed-time expression: a wall time that occurs twice
(fall-back) fires once, at its first occurrence; a wall time that does not exist
(spring-forward) fires once, at the moment the clock jumps. An interval expression (its
minute or hour field starts with ``*``) follows the real clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

from runstream.engine.cron import latest_fire, next_fire

PARIS = "Europe/Paris"


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def iso(t: int) -> str:
    return datetime.fromtimestamp(t / 1000, UTC).strftime("%Y-%m-%dT%H:%M")


def fires(cron: str, start: str, n: int) -> list[str]:
    """``n`` fire times after ``start`` (UTC), each the next_fire of the one before."""
    out, t = [], ms(start)
    for _ in range(n):
        t = next_fire(cron, PARIS, t)
        out.append(iso(t))
    return out


def latest_each(cron: str, start: str, end: str, step_min: int = 10) -> list[str]:
    """The distinct latest_fire values seen at every ``step_min`` minutes in [start, end]."""
    seen: list[str] = []
    for t in range(ms(start), ms(end) + 1, step_min * 60_000):
        fire = iso(latest_fire(cron, PARIS, t))
        if not seen or seen[-1] != fire:
            seen.append(fire)
    return seen


def test_a_daily_time_fires_once_on_the_fall_back_day_at_its_first_occurrence() -> None:
    # 2026-10-25: 03:00 CEST becomes 02:00 CET at 01:00Z; 02:30 happens at 00:30Z and 01:30Z
    assert fires("30 2 * * *", "2026-10-23T12:00", 4) == [
        "2026-10-24T00:30",
        "2026-10-25T00:30",
        "2026-10-26T01:30",
        "2026-10-27T01:30",
    ]
    # from inside the repeated hour (its second pass) the next fire is the next day's
    assert next_fire("30 2 * * *", PARIS, ms("2026-10-25T01:10")) == ms("2026-10-26T01:30")
    assert next_fire("30 2 * * *", PARIS, ms("2026-10-25T01:30")) == ms("2026-10-26T01:30")


def test_latest_fire_on_the_fall_back_days_sees_each_fire_once() -> None:
    assert latest_each("30 2 * * *", "2026-10-24T12:00", "2026-10-26T12:00") == [
        "2026-10-24T00:30",
        "2026-10-25T00:30",
        "2026-10-26T01:30",
    ]
    # during the second pass of the repeated hour the latest fire is still the first 02:30
    assert latest_fire("30 2 * * *", PARIS, ms("2026-10-25T01:45")) == ms("2026-10-25T00:30")


def test_a_daily_time_the_spring_forward_skips_fires_once_when_the_clock_jumps() -> None:
    # 2026-03-29: 02:00 CET becomes 03:00 CEST at 01:00Z; 02:30 does not exist that day
    assert fires("30 2 * * *", "2026-03-27T12:00", 4) == [
        "2026-03-28T01:30",
        "2026-03-29T01:00",
        "2026-03-30T00:30",
        "2026-03-31T00:30",
    ]
    assert latest_each("30 2 * * *", "2026-03-28T12:00", "2026-03-30T12:00") == [
        "2026-03-28T01:30",
        "2026-03-29T01:00",
        "2026-03-30T00:30",
    ]


def test_several_fixed_times_in_the_skipped_hour_fire_once_together() -> None:
    assert fires("0,20,40 2 * * *", "2026-03-28T12:00", 4) == [
        "2026-03-29T01:00",
        "2026-03-30T00:00",
        "2026-03-30T00:20",
        "2026-03-30T00:40",
    ]


def test_an_hourly_schedule_follows_the_real_clock_across_both_changes() -> None:
    # spring: 02:00 does not exist, it fires with 03:00 at the jump (once)
    assert fires("0 * * * *", "2026-03-28T23:30", 4) == [
        "2026-03-29T00:00",
        "2026-03-29T01:00",
        "2026-03-29T02:00",
        "2026-03-29T03:00",
    ]
    # fall-back: every real hour fires, 02:00 in both passes
    assert fires("0 * * * *", "2026-10-24T22:30", 4) == [
        "2026-10-24T23:00",
        "2026-10-25T00:00",
        "2026-10-25T01:00",
        "2026-10-25T02:00",
    ]
    assert latest_each("0 * * * *", "2026-10-24T23:30", "2026-10-25T02:30", 30) == [
        "2026-10-24T23:00",
        "2026-10-25T00:00",
        "2026-10-25T01:00",
        "2026-10-25T02:00",
    ]


def test_an_interval_within_the_changing_hour() -> None:
    # fall-back: both passes of 02:xx fire; spring-forward: the skipped 02:xx fire once
    assert fires("*/30 2 * * *", "2026-10-24T12:00", 5) == [
        "2026-10-25T00:00",
        "2026-10-25T00:30",
        "2026-10-25T01:00",
        "2026-10-25T01:30",
        "2026-10-26T01:00",
    ]
    assert fires("*/30 2 * * *", "2026-03-28T12:00", 3) == [
        "2026-03-29T01:00",
        "2026-03-30T00:00",
        "2026-03-30T00:30",
    ]


def test_times_far_from_a_change_are_plain_local_times() -> None:
    assert fires("0 3 * * *", "2026-07-01T00:00", 2) == ["2026-07-01T01:00", "2026-07-02T01:00"]
    assert latest_fire("0 3 * * *", PARIS, ms("2026-07-01T01:00")) == ms("2026-07-01T01:00")
    assert latest_fire("0 3 * * *", "UTC", ms("2026-07-01T02:59")) == ms("2026-06-30T03:00")


def test_aliases_are_read_as_the_expressions_they_stand_for() -> None:
    assert fires("@daily", "2026-10-24T12:00", 2) == ["2026-10-24T22:00", "2026-10-25T23:00"]
    assert fires("@hourly", "2026-10-24T23:30", 3) == [
        "2026-10-25T00:00",
        "2026-10-25T01:00",  # 02:00 CET, the second pass: an interval fires in both
        "2026-10-25T02:00",
    ]
