"""The public lifecycle stream: one event per fact worth telling the outside world.

Documented in docs/reference/codes.md as a contract; the record is LifecycleEvent.avsc.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from runstream.engine.state import RunState
from runstream.schemas.records import (
    EventAwaited,
    Fact,
    Kind,
    LifecycleEvent,
    RetriedAsNew,
    RunCancelled,
    RunCompleted,
    RunDead,
    RunEventSet,
    RunFailed,
    RunParked,
    RunPaused,
    RunRejected,
    RunRetried,
    RunStarted,
    RunUnpaused,
    SignalAwaited,
    StepCompleted,
    StepFailed,
    StepHandedOver,
    StepStarted,
    TimerScheduled,
    promise_id,
)


def awaiting_promise(state: RunState, seq: int, now: int) -> LifecycleEvent:
    """The run waits for its durable promise ``seq`` (an await records no fact)."""
    return LifecycleEvent(
        Kind.RUN_SUSPENDED,
        state.run_id,
        at_ms=now,
        workflow=state.workflow,
        version=state.version,
        status=state.status,
        seq=seq,
        reason=f"waiting for promise {promise_id(state.run_id, seq)!r}",
    )


def event(fact: Fact, state: RunState) -> LifecycleEvent | None:
    """The lifecycle event for ``fact`` (already applied to ``state``), or None."""

    def ev(kind: Kind, **fields: Any) -> LifecycleEvent:  # (hot path: no dataclasses.replace)
        return LifecycleEvent(
            kind,
            state.run_id,
            at_ms=fact.at_ms,
            workflow=state.workflow,
            version=state.version,
            status=state.status,
            **fields,
        )

    run_time = fact.at_ms - state.started_at_ms
    match fact:
        case RunStarted(tags=tags, input=input):
            return ev(Kind.RUN_STARTED, tags=tags, input=input)
        case StepStarted(seq=seq, name=name, attempt=attempt):
            return ev(Kind.STEP_STARTED, seq=seq, step=name, attempt=attempt)
        case StepCompleted(seq=seq, name=name, attempt=attempt, duration_ms=ms):
            return ev(Kind.STEP_COMPLETED, seq=seq, step=name, attempt=attempt, duration_ms=ms)
        case StepFailed(seq=seq, name=name, attempt=attempt, error=error):
            return ev(Kind.STEP_FAILED, seq=seq, step=name, attempt=attempt, error=error)
        case StepHandedOver(seq=seq, name=name, attempt=attempt, ran=ran):
            why = "was running; it runs again" if ran else "had not begun"
            return ev(
                Kind.STEP_HANDED_OVER,
                seq=seq,
                step=name,
                attempt=attempt,
                reason=f"handed over to the partition's next owner: the attempt {why}",
            )
        case TimerScheduled(seq=seq, due_ms=due):
            until = datetime.fromtimestamp(due / 1000, UTC).isoformat(timespec="milliseconds")
            return ev(Kind.RUN_SUSPENDED, seq=seq, reason=f"sleeping until {until}")
        case SignalAwaited(seq=seq, name=name):
            return ev(Kind.RUN_SUSPENDED, seq=seq, reason=f"waiting for signal {name!r}")
        case EventAwaited(seq=seq, name=name, key=key):
            why = f"waiting for event {name!r} (key {key!r})"
            return ev(Kind.RUN_SUSPENDED, seq=seq, reason=why)
        case RunParked(reason=reason):
            return ev(Kind.RUN_SUSPENDED, reason=reason)
        case RunCompleted(output=output, continued_as=successor):
            because = f"continued as {successor}" if successor else None
            return ev(
                Kind.RUN_COMPLETED,
                duration_ms=run_time,
                output=output,
                reason=because,
                continued_as=successor,
            )
        case RunFailed(error=error):
            return ev(Kind.RUN_FAILED, duration_ms=run_time, error=error)
        case RunCancelled(reason=reason):
            return ev(Kind.RUN_CANCELLED, duration_ms=run_time, reason=reason)
        case RunDead(reason=reason):
            return ev(Kind.RUN_DEAD, duration_ms=run_time, reason=reason)
        case RunRejected(code=code, reason=reason):
            return ev(Kind.RUN_REJECTED, reason=reason, code=code)
        case RunEventSet(seq=seq, key=key, value=value):
            return ev(Kind.RUN_EVENT_SET, seq=seq, key=key, output=value)
        case RetriedAsNew(new_run_id=successor, reason=reason):
            why = f"{reason}: retried as {successor} with new input"
            return ev(Kind.RUN_RETRIED, reason=why, continued_as=successor)
        case RunRetried(seqs=seqs, reason=reason):
            again = f"; steps {seqs} run again" if seqs else ""
            return ev(Kind.RUN_RETRIED, reason=f"{reason}{again}")
        case RunPaused(reason=reason, by=by) | RunUnpaused(reason=reason, by=by):
            kind = Kind.RUN_PAUSED if isinstance(fact, RunPaused) else Kind.RUN_UNPAUSED
            who = f" by {by}" if by else ""
            return ev(kind, reason=f"{kind.value.removeprefix('run.')}{who}: {reason}")
    return None
