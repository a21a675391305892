"""`apply(state, fact)`: the only place the state of a run or an entity changes (an
entity's facts: `entity_reducer`).

No clock, no I/O, no randomness: replaying a run's journal facts in order
always gives the same state, which is what restore and rebuild rely on.
One case per fact type, by the kind of state; a fact the reducer does not know for that
kind is an error, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, replace
from typing import TypeVar

from runstream.engine import blobs
from runstream.engine.entity_reducer import apply_to_entity
from runstream.engine.state import (
    RunState,
    State,
    Status,
    UnknownFactError,
    new_state,
)
from runstream.errors import BlobUnavailable
from runstream.schemas.records import (
    END_FACTS,
    RUN_PERMIT_SEQ,
    UPDATE_SEQ_BASE,
    ChildEnded,
    ChildStarted,
    CompensationStarted,
    EventAwaited,
    EventReceived,
    EventTimedOut,
    Fact,
    PermitReceived,
    PermitRequested,
    PromiseCompleted,
    PromiseCreated,
    RetriedAsNew,
    RunCancelled,
    RunCompleted,
    RunDead,
    RunEventSet,
    RunFailed,
    RunParked,
    RunPaused,
    RunRecovered,
    RunRejected,
    RunRetried,
    RunStarted,
    RunUnpaused,
    SeqFact,
    SignalAwaited,
    SignalBuffered,
    SignalReceived,
    SignalTimedOut,
    StepCompleted,
    StepFailed,
    StepHandedOver,
    StepHeld,
    StepStarted,
    TimerFired,
    TimerScheduled,
    UpdateAccepted,
    UpdateCompleted,
    ValueRecorded,
)

S = TypeVar("S", bound=State)


def apply(state: S, fact: Fact) -> S:
    """Fold ``fact`` into ``state`` (in place) and return it: a run's facts into a run,
    each entity's own facts into it (`state.State`)."""
    state.facts += 1
    if isinstance(state, RunState):
        _run(state, fact)
    else:
        apply_to_entity(state, fact)
    return state


def payload_bytes(fact: Fact) -> int:
    """The bytes of ``fact``'s payloads (inputs, outputs, arguments, signal and event
    payloads): what a run's history cap in bytes counts."""
    names = _PAYLOAD_FIELDS.get(type(fact))
    if names is None:
        names = _PAYLOAD_FIELDS[type(fact)] = tuple(
            f.name for f in fields(fact) if "bytes" in str(f.type)
        )
    return sum(len(getattr(fact, name) or b"") for name in names)


_PAYLOAD_FIELDS: dict[type, tuple[str, ...]] = {}


def blob_bytes(fact: Fact) -> int:
    """The bytes ``fact``'s large payloads reference: what a run's blob budget counts."""
    if payload_bytes(fact) == 0:
        return 0
    return sum(ref.size for name in _PAYLOAD_FIELDS[type(fact)] if (ref := _ref(fact, name)))


def _ref(fact: Fact, name: str) -> blobs.Ref | None:
    try:
        return blobs.parse(getattr(fact, name))
    except BlobUnavailable:  # never recorded: a malformed reference is refused at intake
        return None


def _run(state: RunState, fact: Fact) -> None:
    state.history_bytes += payload_bytes(fact)
    state.blob_bytes += blob_bytes(fact)
    if state.status is Status.PARKED and not isinstance(
        fact, RunParked | SignalBuffered | PromiseCompleted
    ):
        state.status, state.reason = Status.RUNNING, None  # the run made progress again
    match fact:
        case (
            StepStarted() | StepHandedOver() | StepHeld() | TimerScheduled() | SignalAwaited()
            | EventAwaited()
        ):  # fmt: skip
            state.pending[fact.seq] = fact
            state.beats.pop(fact.seq, None)  # a new attempt has not beaten yet
        case StepCompleted():
            _settle(state, fact)
            state.steps += 1
            state.permits.pop(fact.seq, None)
        case PermitRequested():
            state.pending[fact.seq] = fact
            state.permits[fact.seq] = fact
        case PermitReceived(seq=seq) if seq == RUN_PERMIT_SEQ:
            state.pending.pop(seq, None)  # the run may go on; it holds the permit till its end
            state.permit_value = fact.value
            if not fact.granted:
                state.permits.pop(seq, None)
        case PermitReceived():
            state.pending[fact.seq] = fact
            if not fact.granted:
                state.permits.pop(fact.seq, None)
        case TimerFired() | SignalTimedOut() | ValueRecorded() | EventReceived() | EventTimedOut():
            _settle(state, fact)
        case SignalReceived():
            _settle(state, fact)
            _consume_buffered(state, fact.signal_id)
        case StepFailed(retry_at_ms=None):  # final: the workflow sees the error
            _settle(state, fact)
            state.permits.pop(fact.seq, None)
        case StepFailed():
            state.pending[fact.seq] = fact  # waits for its retry
            state.beats.pop(fact.seq, None)
            state.permits.pop(fact.seq, None)  # given back: the next attempt asks again
        case RunStarted():
            state.workflow, state.version, state.input = fact.workflow, fact.version, fact.input
            state.parent_run_id, state.tags = fact.parent_run_id, dict(fact.tags)
            state.started_at_ms, state.status, state.started = fact.at_ms, Status.RUNNING, True
            state.reason = state.code = None
            state.reply_to, state.request_id = fact.reply_to, fact.request_id
            state.deadline_ms, state.parent_seq = fact.deadline_ms, fact.parent_seq
            if fact.deadline_ms is not None:
                state.timeout_ms = fact.deadline_ms - fact.at_ms
            state.headers = dict(fact.headers)
        case RunRejected():
            state.workflow, state.status = fact.workflow, Status.REJECTED
            state.reason, state.code = fact.reason, fact.code
        case SignalBuffered():
            state.signals.append(fact)
            state.signal_ids.add(fact.signal_id)
        case RunRecovered():
            state.recoveries = fact.recoveries
            crashed = state.pending.get(fact.seq)
            if isinstance(crashed, StepStarted):  # its recovery starts the next attempt
                state.recovery_starts.add((fact.seq, crashed.attempt + 1))
        case CompensationStarted():  # a cancel or a timeout ends a pause
            state.compensation, state.status, state.paused = fact, Status.COMPENSATING, None
        case RunParked():
            state.status, state.reason = Status.PARKED, fact.reason
        case RunCompleted() | RunFailed() | RunCancelled() | RunDead():
            state.status, state.ended_at_ms = END_FACTS[type(fact)], fact.at_ms
            state.paused = None
            state.beats.clear()
            state.permits.clear()  # given back by the transaction that ends the run
            state.pending.clear()
            # settled_paused stays: no code saw those steps settle, so a retry's first
            # activation must (`RunRetried` clears them; its batch reads its before-state)
            if isinstance(fact, RunCompleted):
                state.output, state.continued_as = fact.output, fact.continued_as
            elif isinstance(fact, RunFailed):
                state.error, state.code = fact.error, fact.code
            else:
                state.reason = fact.reason
        # the rarer facts: children, retries
        case ChildStarted(awaited=True):
            state.pending[fact.seq] = fact  # until its ChildEnded
        case ChildStarted() | ChildEnded():
            _settle(state, fact)
        case RunRetried():
            _reopen(state, fact)
            state.settled_paused.clear()
            if fact.retry_id:
                state.retry_ids.add(fact.retry_id)
        case RetriedAsNew():
            state.retried_as = fact.new_run_id
        case PromiseCreated():  # settled: a replay gets the same promise
            _settle(state, fact)
            state.promises[fact.seq] = fact
        case PromiseCompleted():  # its one outcome, kept for the awaits (not a settle)
            _resolve(state, fact)
            state.promises.pop(fact.seq, None)
        case RunEventSet():  # settled: a replay does not set it again
            _settle(state, fact)
        case RunPaused():  # `rules.pause`: facts still come; no code runs till unpaused
            state.paused, state.status = fact, Status.PAUSED
            state.pause_ids.add(fact.pause_id)
        case RunUnpaused():  # the unpause's batch still reads them from its state before
            state.paused, state.settled_paused = None, set()
            state.pause_ids.add(fact.pause_id)
            state.status = Status.RUNNING if state.compensation is None else Status.COMPENSATING
        case UpdateAccepted():
            state.updates[fact.update_id] = fact
        case UpdateCompleted():
            state.update_results[fact.update_id] = fact
        case _:
            raise UnknownFactError(type(fact).__name__)


def fold(run_id: str, facts: Iterable[Fact]) -> State:
    """The state of ``run_id`` after ``facts``, from nothing."""
    state = new_state(run_id)
    for fact in facts:
        apply(state, fact)
    return state


def _settle(
    state: RunState,
    fact: StepCompleted
    | StepFailed
    | TimerFired
    | SignalReceived
    | SignalTimedOut
    | ValueRecorded
    | ChildStarted
    | ChildEnded
    | EventReceived
    | EventTimedOut
    | PromiseCreated
    | RunEventSet,
) -> None:
    state.pending.pop(fact.seq, None)
    state.beats.pop(fact.seq, None)
    _resolve(state, fact)
    if state.paused is not None:
        state.settled_paused.add(fact.seq)


def _resolve(state: RunState, fact: SeqFact) -> None:
    """``fact`` settles its seq; `RunState.top_seq` and `handler_seqs` follow."""
    state.resolved[fact.seq] = fact
    if fact.seq >= UPDATE_SEQ_BASE:
        state.handler_seqs.add(fact.seq)
    elif state.top_seq is None or fact.seq > state.top_seq:
        state.top_seq = fact.seq


def _reopen(state: RunState, fact: RunRetried) -> None:
    """A failed or dead run goes on: each final step failure of ``fact.seqs`` becomes a
    retry due now, so the step's next attempt starts (`rules.steps.run_step`)."""
    state.status, state.ended_at_ms = Status.RUNNING, None
    state.error = state.reason = state.code = None
    state.recoveries = 0
    state.retries += 1  # a coroutine suspended before this is out of date (engine.replay)
    if fact.deadline_ms is not None:  # None from an older engine: the old deadline stays
        state.deadline_ms = fact.deadline_ms
    for seq in fact.seqs:
        failed = state.resolved.pop(seq)
        assert isinstance(failed, StepFailed)
        state.pending[seq] = replace(failed, retry_at_ms=fact.at_ms)
        state.handler_seqs.discard(seq)
    if state.top_seq in fact.seqs:  # rare: a walk of the history, once per retry
        state.top_seq = max((s for s in state.resolved if s < UPDATE_SEQ_BASE), default=None)


def _consume_buffered(state: RunState, signal_id: str) -> None:
    state.signal_ids.add(signal_id)
    for i, sig in enumerate(state.signals):
        if sig.signal_id == signal_id:
            del state.signals[i]
            return
