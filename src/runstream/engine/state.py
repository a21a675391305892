"""The state of what a journal key names, folded from its facts by `reducer.apply`: a
run (`RunState`), or one of the engine's own entities (`entity_state`: events,
schedules, limits, task groups); `new_state` picks by the id's kind (`id_kind`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from runstream.engine.entity_state import (
    BATCH_SEQ,
    WAKE_SEQ,
    EventEntityState,
    LimitState,
    ScheduleState,
    TaskGroupState,
)
from runstream.schemas.records import (
    TERMINAL,
    CompensationStarted,
    EventAwaited,
    IdKind,
    PermitRequested,
    PromiseCreated,
    RunPaused,
    SeqFact,
    SignalAwaited,
    SignalBuffered,
    StepFailed,
    StepHandedOver,
    StepHeld,
    StepStarted,
    TimerScheduled,
    UpdateAccepted,
    UpdateCompleted,
    id_kind,
)
from runstream.schemas.records import Status as Status

__all__ = [
    "BATCH_SEQ",
    "DEADLINE_SEQ",
    "WAKE_SEQ",
    "Beat",
    "EventEntityState",
    "LimitState",
    "RunState",
    "RunView",
    "ScheduleState",
    "State",
    "Status",
    "TaskGroupState",
    "UnknownFactError",
    "beats_of",
    "new_state",
]


class UnknownFactError(ValueError):
    """A fact type the reducer has no rule for, for the kind of state it came to: never
    skipped silently (`reducer`, `entity_reducer`)."""


#: A remote attempt's latest sign of life: (at ms, details as JSON bytes or None).
Beat = tuple[int, bytes | None]

# A timer's key in the projection is (due, id, seq): a run's timers are told apart by
# seq (an entity's: `entity_state`). The values are what older versions wrote.
#: The timer seq of a run's execution timeout (no step, sleep or wait takes seq 0).
DEADLINE_SEQ = 0


@dataclass(slots=True)
class RunState:
    """Everything the engine knows about one run.

    ``resolved`` maps a sequence number to the fact that settled it (StepCompleted,
    a final StepFailed, TimerFired, SignalReceived, SignalTimedOut, ValueRecorded), in
    the order they settled (the compensations' order, `rules.core.compensate`);
    ``pending`` maps it to the fact of an operation still open (StepStarted, a
    StepFailed awaiting its retry, a StepHandedOver awaiting its restart, TimerScheduled,
    SignalAwaited). A promise's seq is resolved by its PromiseCreated, then by its
    PromiseCompleted; ``promises`` are those not completed yet (kept past the run's end:
    a retried run awaits them again).
    """

    run_id: str
    workflow: str = ""
    version: str = ""
    input: bytes = b"null"
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    status: Status = Status.RUNNING
    started_at_ms: int = 0
    deadline_ms: int | None = None  # the run times out then
    timeout_ms: int | None = None  # its execution timeout (from its start, or its retry)
    parent_seq: int | None = None  # where the parent awaits this run's end
    ended_at_ms: int | None = None
    resolved: dict[int, SeqFact] = field(default_factory=dict)
    # Kept by the reducer beside ``resolved``, so a decision need not walk the history
    # (`rules.context.settled`): its largest workflow seq (None: none), and the update
    # handlers' seqs in it (from `UPDATE_SEQ_BASE`).
    top_seq: int | None = None
    handler_seqs: set[int] = field(default_factory=set)
    pending: dict[int, SeqFact] = field(default_factory=dict)
    signals: list[SignalBuffered] = field(default_factory=list)  # buffered, not yet consumed
    signal_ids: set[str] = field(default_factory=set)  # every signal id seen: dedupe
    retry_ids: set[str] = field(default_factory=set)  # every retry id recorded: dedupe
    # A run's permits, requested or held, by seq -> its request (the limit, the request id).
    permits: dict[int, PermitRequested] = field(default_factory=dict)
    promises: dict[int, PromiseCreated] = field(default_factory=dict)  # open, by seq
    # Remote attempts' latest heartbeats, by seq. Not facts (there are too many): the
    # projection keeps them beside the facts, and a new owner starts them afresh.
    beats: dict[int, Beat] = field(default_factory=dict)
    recoveries: int = 0
    # (seq, attempt) of each recovery start: one that crashes in turn runs alone next
    recovery_starts: set[tuple[int, int]] = field(default_factory=set)
    retries: int = 0  # RunRetried facts: each reopens steps a suspended coroutine saw fail
    compensation: CompensationStarted | None = None  # while compensating
    paused: RunPaused | None = None  # while paused (status PAUSED): who, why, since when
    # seqs settled while paused: the code first sees them at the unpause (is_replaying)
    settled_paused: set[int] = field(default_factory=set)
    pause_ids: set[str] = field(default_factory=set)  # Pause/Unpause ids recorded: dedupe
    output: bytes | None = None
    error: str | None = None
    reason: str | None = None
    code: str | None = None  # a rejected start's reason code, or a failed run's (Failure)
    continued_as: str | None = None
    retried_as: str | None = None  # retried with new input as this run
    facts: int = 0  # facts applied: the next fact's index in the projection
    history_bytes: int = 0  # the payload bytes of its facts (`reducer.payload_bytes`)
    blob_bytes: int = 0  # the bytes its facts' large payloads reference (`engine.blobs`)
    steps: int = 0  # StepCompleted facts
    started: bool = False  # has a RunStarted (a rejected start has only RunRejected)
    reply_to: str | None = None  # the client its start asked to be told of its end
    request_id: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # interceptors' (RunStarted.headers)
    # Validated updates (`rules.updates`): every one accepted, in order, and their outcomes.
    updates: dict[str, UpdateAccepted] = field(default_factory=dict)
    update_results: dict[str, UpdateCompleted] = field(default_factory=dict)
    # A durable entity's call (`App.entity`): the state given with its lock (JSON).
    permit_value: bytes | None = None

    @property
    def exists(self) -> bool:
        """The run was started (a rejected start is not a run)."""
        return self.started

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def copy(self) -> RunState:
        """A copy whose containers can change without touching this one."""
        return replace(
            self,
            resolved=dict(self.resolved),
            handler_seqs=set(self.handler_seqs),
            pending=dict(self.pending),
            signals=list(self.signals),
            signal_ids=set(self.signal_ids),
            retry_ids=set(self.retry_ids),
            recovery_starts=set(self.recovery_starts),
            settled_paused=set(self.settled_paused),
            pause_ids=set(self.pause_ids),
            beats=dict(self.beats),
            permits=dict(self.permits),
            promises=dict(self.promises),
            updates=dict(self.updates),
            update_results=dict(self.update_results),
        )

    def timers(self) -> set[tuple[int, int]]:
        """(due_ms, seq) of every open operation that waits for a time (an open
        promise's timeout too), and the run's own execution timeout (`DEADLINE_SEQ`)."""
        out = set()
        if self.deadline_ms is not None and not self.terminal:
            out.add((self.deadline_ms, DEADLINE_SEQ))
        if not self.terminal:
            for seq, created in self.promises.items():
                if created.timeout_at_ms is not None:
                    out.add((created.timeout_at_ms, seq))
        for seq, fact in self.pending.items():
            match fact:
                case TimerScheduled(due_ms=due):
                    out.add((due, seq))
                case StepStarted() if fact.remote:
                    live = self.liveness_due(seq, fact)
                    if live is not None:
                        out.add((live, seq))
                case (
                    StepFailed(retry_at_ms=int(due))
                    | SignalAwaited(timeout_at_ms=int(due))
                    | EventAwaited(timeout_at_ms=int(due))
                ):
                    out.add((due, seq))
        return out

    def liveness_due(self, seq: int, started: StepStarted, since: int = 0) -> int | None:
        """When the remote attempt ``started`` times out, unless a heartbeat comes first:
        its deadline, or a heartbeat interval after its last sign of life (its start,
        its latest heartbeat, or ``since``, when the owner took the partition over)."""
        dues: list[int] = [] if started.deadline_ms is None else [started.deadline_ms]
        if started.heartbeat_ms is not None:
            beat = self.beats.get(seq, (0, None))[0]
            dues.append(max(beat, started.at_ms, since) + started.heartbeat_ms)
        return min(dues, default=None)

    def updates_in_flight(self) -> list[UpdateAccepted]:
        """The updates accepted and not completed yet, in order."""
        return [u for i, u in self.updates.items() if i not in self.update_results]

    def running_steps(self) -> list[int]:
        """Sequence numbers of steps the engine runs, started with no outcome yet."""
        return [s for s, f in self.pending.items() if isinstance(f, StepStarted) and not f.remote]

    def remote_steps(self) -> list[int]:
        """Sequence numbers of remote attempts waiting for their result."""
        return [s for s, f in self.pending.items() if isinstance(f, StepStarted) and f.remote]

    def handed_over_steps(self) -> list[int]:
        """Sequence numbers of steps a graceful handover let go: to start again."""
        return [s for s, f in self.pending.items() if isinstance(f, StepHandedOver)]

    def held_steps(self) -> list[int]:
        """Sequence numbers of remote steps a paused task group holds (`rules.taskgroups`)."""
        return [s for s, f in self.pending.items() if isinstance(f, StepHeld)]

    def recovers_alone(self) -> bool:
        """Whether the steps a crash interrupted run again alone in the process, one run at
        a time: those that already ran alone, or were a recovery themselves, when their
        process died. A first crash is most often nobody's (a kill, a lost machine), so
        those steps run again at once, side by side; a poison step costs one more crash."""
        return any(
            f.isolated or (s, f.attempt) in self.recovery_starts
            for s in self.running_steps()
            if isinstance(f := self.pending[s], StepStarted)
        )


#: The state of anything the journal keeps: a run or one of the engine's entities.
State = RunState | EventEntityState | ScheduleState | LimitState | TaskGroupState

_STATES: dict[IdKind, type[State]] = {
    IdKind.RUN: RunState,
    IdKind.EVENT: EventEntityState,
    IdKind.SCHEDULE: ScheduleState,
    IdKind.LIMIT: LimitState,
    IdKind.TASK_GROUP: TaskGroupState,
}


def new_state(run_id: str) -> State:
    """The empty state of what ``run_id`` names (its kind: `id_kind`)."""
    return _STATES[id_kind(run_id)](run_id)


def beats_of(state: State) -> dict[int, Beat]:
    """The remote attempts' heartbeats of ``state`` (only a run has any)."""
    return state.beats if isinstance(state, RunState) else {}


class RunView(Protocol):
    """A run's state, read only: what code that answers about a run, or tells others of
    it, may see (Zeebe's ReadonlyProcessingState). `RunState` is one."""

    @property
    def run_id(self) -> str: ...
    @property
    def workflow(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def input(self) -> bytes: ...
    @property
    def status(self) -> Status: ...
    @property
    def started_at_ms(self) -> int: ...
    @property
    def ended_at_ms(self) -> int | None: ...
    @property
    def parent_run_id(self) -> str | None: ...
    @property
    def parent_seq(self) -> int | None: ...
    @property
    def resolved(self) -> Mapping[int, SeqFact]: ...
    @property
    def pending(self) -> Mapping[int, SeqFact]: ...
    @property
    def output(self) -> bytes | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def code(self) -> str | None: ...
    @property
    def continued_as(self) -> str | None: ...
    @property
    def paused(self) -> RunPaused | None: ...
    @property
    def steps(self) -> int: ...
    @property
    def exists(self) -> bool: ...
    @property
    def terminal(self) -> bool: ...
    def running_steps(self) -> list[int]: ...
    def remote_steps(self) -> list[int]: ...
    def handed_over_steps(self) -> list[int]: ...
