"""One run's journal facts read for people: a waterfall of spans (steps, timers, waits,
children, permits), the steps still retrying or running, what the run waits on now, and
the runs it links to. Pure: facts in, plain data out (the pages render it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runstream.engine import payload
from runstream.schemas.records import (
    LIMIT_PREFIX,
    ChildEnded,
    ChildStarted,
    CompensationStarted,
    EventAwaited,
    EventReceived,
    EventTimedOut,
    PermitReceived,
    PermitRequested,
    Record,
    RetriedAsNew,
    RunCancelled,
    RunCompleted,
    RunDead,
    RunFailed,
    RunParked,
    RunPaused,
    RunRetried,
    RunStarted,
    RunUnpaused,
    SignalAwaited,
    SignalReceived,
    SignalTimedOut,
    StepCompleted,
    StepFailed,
    StepHandedOver,
    StepHeld,
    StepStarted,
    TimerFired,
    TimerScheduled,
)

#: The families a history page filters facts by, and the fact types in each.
FAMILIES = {
    "run": ("Run", "Compensation", "RetriedAsNew"),
    "step": ("Step",),
    "timer": ("Timer",),
    "signal": ("Signal",),
    "event": ("Event",),
    "child": ("Child",),
    "permit": ("Permit",),
}
_ENDS = (RunCompleted, RunFailed, RunCancelled, RunDead)


def family(fact: Record) -> str:
    """The filter family of a fact (``other`` for values, recoveries and the like)."""
    name = fact.AVRO.rsplit(".", 1)[-1]
    for fam, prefixes in FAMILIES.items():
        if name.startswith(prefixes):
            return fam
    return "other"


@dataclass
class Span:
    """One bar of the waterfall: ``end_ms`` None while it is still open."""

    kind: str  # step, timer, signal, event, child, permit, held
    label: str
    start_ms: int
    end_ms: int | None = None
    outcome: str = "open"  # ok, failed, retrying, fired, received, timed-out, handed-over
    detail: str = ""
    link: str | None = None  # a child run's id
    until_ms: int | None = None  # a timer's due time, a wait's timeout


@dataclass
class Pending:
    """A step not done: running now, or failed and waiting for its next attempt."""

    seq: int
    name: str
    attempt: int
    since_ms: int
    last_error: str | None = None
    traceback: str | None = None
    next_retry_ms: int | None = None


@dataclass
class Story:
    """What the page shows about a run beside its facts."""

    spans: list[Span] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    waits: list[Span] = field(default_factory=list)  # open timers, signals, events, ...
    parent: str | None = None
    children: list[str] = field(default_factory=list)
    next_runs: list[str] = field(default_factory=list)  # continued or retried as
    parked: str | None = None
    paused: str | None = None  # by whom and why, while paused
    ended_ms: int | None = None
    first_ms: int = 0
    last_ms: int = 0


def story(facts: list[Record]) -> Story:
    """Fold ``facts`` (one run's journal, in order) into its `Story`."""
    s = Story()
    opened: dict[tuple[str, int], Span] = {}  # (kind, seq) -> its open span
    steps: dict[int, Pending] = {}
    for fact in facts:
        at = getattr(fact, "at_ms", 0)
        s.first_ms = s.first_ms or at
        s.last_ms = max(s.last_ms, at)
        match fact:
            case RunStarted():
                s.parent = fact.parent_run_id
            case StepHeld():  # its task group is paused: a wait, until it is sent
                label = f"task group {fact.group!r} paused (step {fact.name} #{fact.seq})"
                if ("held", fact.seq) not in opened:
                    _open(s, opened, ("held", fact.seq), Span("held", label, at))
            case StepStarted():
                _close(opened, ("held", fact.seq), at, "sent")
                span = Span(
                    "step", f"{fact.name} #{fact.seq}", at, detail=f"attempt {fact.attempt}"
                )
                if fact.group:
                    span.detail += f", task group {fact.group}"
                _open(s, opened, ("step", fact.seq), span)
                p = steps.setdefault(fact.seq, Pending(fact.seq, fact.name, fact.attempt, at))
                p.attempt, p.since_ms, p.next_retry_ms = fact.attempt, at, None
            case StepCompleted():
                _close(opened, ("step", fact.seq), at, "ok")
                steps.pop(fact.seq, None)
            case StepFailed():
                retrying = fact.retry_at_ms is not None
                _close(
                    opened, ("step", fact.seq), at, "retrying" if retrying else "failed", fact.error
                )
                if retrying:
                    p = steps.setdefault(fact.seq, Pending(fact.seq, fact.name, fact.attempt, at))
                    p.last_error, p.traceback = fact.error, fact.traceback
                    p.next_retry_ms, p.since_ms = fact.retry_at_ms, at
                else:
                    steps.pop(fact.seq, None)
            case StepHandedOver():
                _close(opened, ("step", fact.seq), at, "handed-over")
            case TimerScheduled():
                span = Span("timer", f"timer #{fact.seq}", at, until_ms=fact.due_ms)
                _open(s, opened, ("timer", fact.seq), span)
            case TimerFired():
                _close(opened, ("timer", fact.seq), at, "fired")
            case SignalAwaited():
                span = Span("signal", f"signal {fact.name!r}", at, until_ms=fact.timeout_at_ms)
                _open(s, opened, ("signal", fact.seq), span)
            case SignalReceived():
                _close(opened, ("signal", fact.seq), at, "received")
            case SignalTimedOut():
                _close(opened, ("signal", fact.seq), at, "timed-out")
            case EventAwaited():
                label = f"event {fact.name!r}" + (f" key {fact.key!r}" if fact.key else "")
                span = Span("event", label, at, until_ms=fact.timeout_at_ms)
                _open(s, opened, ("event", fact.seq), span)
            case EventReceived():
                _close(opened, ("event", fact.seq), at, "received")
            case EventTimedOut():
                _close(opened, ("event", fact.seq), at, "timed-out")
            case ChildStarted():
                span = Span(
                    "child", f"child {fact.name} {fact.child_run_id}", at, link=fact.child_run_id
                )
                _open(s, opened, ("child", fact.seq), span)
                s.children.append(fact.child_run_id)
            case ChildEnded():
                _close(opened, ("child", fact.seq), at, fact.status, fact.error or "")
            case PermitRequested():
                _open(
                    s,
                    opened,
                    ("permit", fact.seq),
                    Span("permit", f"permit {fact.limit.removeprefix(LIMIT_PREFIX)}", at),
                )
            case PermitReceived():
                outcome = "received" if fact.granted else "refused"
                _close(opened, ("permit", fact.seq), at, outcome, fact.reason)
            case RunParked():
                s.parked = fact.reason
            case RunPaused():
                s.paused = f"by {fact.by or 'someone'}: {fact.reason}"
            case RunUnpaused() | CompensationStarted():  # a cancel ends a pause
                s.paused = None
            case RunRetried():
                s.ended_ms, s.parked = None, None
            case RetriedAsNew():
                s.next_runs.append(fact.new_run_id)
            case _ if isinstance(fact, _ENDS):
                s.ended_ms = at
                if isinstance(fact, RunCompleted) and fact.continued_as:
                    s.next_runs.append(fact.continued_as)
    if s.ended_ms is None:
        s.pending = sorted(steps.values(), key=lambda p: p.seq)
        s.waits = [sp for sp in opened.values() if sp.kind != "step"]
    return s


def _open(s: Story, opened: dict[tuple[str, int], Span], key: tuple[str, int], span: Span) -> None:
    opened[key] = span
    s.spans.append(span)


def _close(
    opened: dict[tuple[str, int], Span],
    key: tuple[str, int],
    at: int,
    outcome: str,
    detail: str = "",
) -> None:
    span = opened.pop(key, None)
    if span is not None:
        span.end_ms, span.outcome = at, outcome
        if detail:
            span.detail = f"{span.detail}; {detail}" if span.detail else detail


def fields(fact: Record) -> dict[str, Any]:
    """A fact's fields, ``type`` first, payload bytes as the JSON values they hold."""
    out: dict[str, Any] = {"type": fact.AVRO}
    for f in dataclasses.fields(fact):  # type: ignore[arg-type]
        value = getattr(fact, f.name)
        if isinstance(value, bytes):
            try:
                value = payload.shown(value)
            except ValueError:
                value = value.decode(errors="replace")
        out[f.name] = value
    return out


def when(at_ms: int | None) -> str:
    """Epoch ms as local time, to the millisecond."""
    if not at_ms:
        return ""
    return datetime.fromtimestamp(at_ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
