"""Due times. An entity's own: a limit's rate allows its next grant, a schedule fires, an
event entity's batch window closes. A run's, by seq: a durable sleep fires, a wait times
out, a step's retry comes, a remote attempt's liveness is checked, or (`DEADLINE_SEQ`)
the run times out. The kind of state says which, not the seq."""

from __future__ import annotations

from runstream.engine.rules import core, events, limits, promises, remote, schedules
from runstream.engine.rules.context import Rules
from runstream.engine.state import (
    DEADLINE_SEQ,
    EventEntityState,
    LimitState,
    RunState,
    ScheduleState,
    State,
    Status,
)
from runstream.engine.work import Batch, TimerDue
from runstream.errors import TIMED_OUT, Failure
from runstream.schemas.records import (
    CompensationStarted,
    EventAwaited,
    EventTimedOut,
    RunFailed,
    SignalAwaited,
    SignalTimedOut,
    StepFailed,
    StepStarted,
    Subscribe,
    TimerFired,
    TimerScheduled,
    correlation_id,
)


def timer_due(ctx: Rules, b: Batch, st: State, work: TimerDue) -> None:
    """A due time of ``work.seq`` passed: the entity's own timer, or the run's at seq."""
    match st:
        case LimitState():  # its rate allows the next grant (WAKE_SEQ)
            limits.grant_waiting(b, st)
        case ScheduleState():  # its next fire time (WAKE_SEQ)
            schedules.fire(b, st)
        case EventEntityState():  # a batch window closed (BATCH_SEQ)
            events.close_batches(b, st)
        case RunState():
            _run_timer(ctx, b, st, work.seq)


def _run_timer(ctx: Rules, b: Batch, st: RunState, seq: int) -> None:
    """Fire the timer, retry the step, time the wait or the promise out, or (seq 0)
    time the run out."""
    if seq == DEADLINE_SEQ:
        _time_out(ctx, b, st)
        return
    if st.status is Status.PARKED:
        return
    created = st.promises.get(seq)
    if created is not None:
        promises.time_out(ctx, b, st, created)
        return
    fact = st.pending.get(seq)
    if fact is None:
        return
    match fact:
        case TimerScheduled(due_ms=due) if due <= b.now:
            core.emit(b, st, TimerFired(st.run_id, b.now, seq=seq))
        case SignalAwaited(timeout_at_ms=int(due), name=name) if due <= b.now:
            core.emit(b, st, SignalTimedOut(st.run_id, b.now, seq=seq, name=name))
        case StepFailed(retry_at_ms=int(due)) if due <= b.now:
            pass  # advance starts the next attempt
        case StepStarted() if fact.remote:
            remote.check_liveness(ctx, b, st, seq, fact)
            return
        case EventAwaited(timeout_at_ms=int(due), name=name, key=key) if due <= b.now:
            core.emit(b, st, EventTimedOut(st.run_id, b.now, seq=seq, name=name))
            corr = correlation_id(name, key)  # the event may come: not for this wait
            b.effects.commands.append(
                Subscribe(
                    corr,
                    name,
                    subscriber=st.run_id,
                    seq=seq,
                    key=key,
                    cancel=True,
                    sent_at_ms=b.now,
                )
            )
        case _:
            return
    core.advance(ctx, b, st)


def _time_out(ctx: Rules, b: Batch, st: RunState) -> None:
    """The run passed its execution timeout: it fails with RunTimedOut, after waiting
    for its steps in flight and compensating what completed, like any failure."""
    due = st.deadline_ms
    if due is None or due > b.now or st.terminal or st.compensation is not None:
        return  # not yet, or already ending
    took = (st.timeout_ms or due - st.started_at_ms) / 1000
    error = f"{TIMED_OUT}run {st.run_id!r} did not end within its timeout of {took:g}s"
    if core.in_flight(st) or core.compensations(ctx, b, st):
        core.emit(
            b, st, CompensationStarted(st.run_id, b.now, error=error, traceback="", cancelled=False)
        )
        core.compensate(ctx, b, st)
    else:
        core.emit(
            b, st, RunFailed(st.run_id, b.now, error=error, traceback="", code=Failure.TIMED_OUT)
        )
