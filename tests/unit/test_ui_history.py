"""The dashboard's reading of one run's journal (`runstream.ui.history`): pure, no broker."""

from __future__ import annotations

from runstream.operations import took
from runstream.schemas.records import (
    ChildEnded,
    ChildStarted,
    RunCompleted,
    RunStarted,
    SignalAwaited,
    StepCompleted,
    StepFailed,
    StepStarted,
    TimerFired,
    TimerScheduled,
)
from runstream.ui.history import family, story


def _start(parent: str | None = None) -> RunStarted:
    return RunStarted("r", 1000, workflow="w", version="1", input=b"{}", parent_run_id=parent)


def test_a_step_that_failed_and_waits_for_its_retry_is_pending_with_its_error() -> None:
    s = story([
        _start(),
        StepStarted("r", 1100, seq=1, name="charge", attempt=1),
        StepFailed("r", 1200, seq=1, name="charge", attempt=1, error="boom", traceback="tb",
                   retry_at_ms=5000),
    ])  # fmt: skip
    (p,) = s.pending
    assert (p.name, p.attempt, p.last_error, p.traceback, p.next_retry_ms) == (
        "charge", 1, "boom", "tb", 5000,
    )  # fmt: skip
    (span,) = s.spans
    assert (span.start_ms, span.end_ms, span.outcome) == (1100, 1200, "retrying")


def test_the_next_attempt_runs_and_keeps_the_last_error_until_it_completes() -> None:
    facts = [
        _start(),
        StepStarted("r", 1100, seq=1, name="charge", attempt=1),
        StepFailed("r", 1200, seq=1, name="charge", attempt=1, error="boom", traceback="tb",
                   retry_at_ms=1300),
        StepStarted("r", 1300, seq=1, name="charge", attempt=2),
    ]  # fmt: skip
    (p,) = story(facts).pending
    assert (p.attempt, p.since_ms, p.next_retry_ms, p.last_error) == (2, 1300, None, "boom")
    done = story([*facts, StepCompleted("r", 1400, seq=1, name="charge", output=b"1",
                                        attempt=2, duration_ms=100)])  # fmt: skip
    assert done.pending == []
    assert [sp.outcome for sp in done.spans] == ["retrying", "ok"]


def test_open_timers_and_signal_waits_are_what_the_run_waits_on() -> None:
    s = story([
        _start(),
        TimerScheduled("r", 1100, seq=1, due_ms=2000),
        TimerFired("r", 2000, seq=1),
        TimerScheduled("r", 2100, seq=2, due_ms=9000),
        SignalAwaited("r", 2100, seq=3, name="approve", timeout_at_ms=7000),
    ])  # fmt: skip
    assert [(w.kind, w.until_ms) for w in s.waits] == [("timer", 9000), ("signal", 7000)]
    assert [sp.outcome for sp in s.spans] == ["fired", "open", "open"]


def test_an_ended_run_waits_on_nothing_and_links_its_parent_and_children() -> None:
    s = story([
        _start(parent="p"),
        ChildStarted("r", 1100, seq=1, name="kid", child_run_id="r/1", awaited=True),
        ChildEnded("r", 1500, seq=1, name="kid", child_run_id="r/1", status="completed"),
        SignalAwaited("r", 1600, seq=2, name="approve"),
        RunCompleted("r", 1700, output=b"1", continued_as="r~1"),
    ])  # fmt: skip
    assert (s.parent, s.children, s.next_runs, s.ended_ms) == ("p", ["r/1"], ["r~1"], 1700)
    assert s.waits == [] and s.pending == []
    assert s.spans[0].link == "r/1" and s.spans[0].outcome == "completed"


def test_facts_fall_in_the_families_the_history_filters_by() -> None:
    assert family(_start()) == "run"
    assert family(TimerFired("r", 1, seq=1)) == "timer"
    assert family(StepStarted("r", 1, seq=1, name="s", attempt=1)) == "step"
    assert took(950) == "950ms" and took(61_000) == "1m01s" and took(None) == ""
