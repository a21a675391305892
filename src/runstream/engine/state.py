"""The state of what a journal key names, folded from its facts by `reducer.apply`: a
run (`RunState`), or one of the engine's own entities (`EventEntityState`,
`ScheduleState`, `LimitState`); `new_state` picks by the id's kind (`id_kind`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from runstream.schemas.records import (
    TERMINAL,
    CompensationStarted,
    EventAwaited,
    EventBatched,
    EventPublished,
    GroupPaused,
    IdKind,
    LimitSet,
    PermitGranted,
    PermitQueued,
    PermitRequested,
    PromiseCreated,
    RunPaused,
    ScheduleSet,
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
    "beats_of",
    "new_state",
]

#: A remote attempt's latest sign of life: (at ms, details as JSON bytes or None).
Beat = tuple[int, bytes | None]

# A timer's key in the projection is (due, id, seq): a run's timers are told apart by
# seq; an entity has one timer of its own. The values are what older versions wrote.
#: The timer seq of a run's execution timeout (no step, sleep or wait takes seq 0).
DEADLINE_SEQ = 0
#: The timer seq of a schedule's next fire and of a limit's next grant by its rate.
WAKE_SEQ = 0
#: The timer seq of an event entity's batch windows: below any step's (compensations
#: take -1, -2, ...), and still a 4-byte key in the projection.
BATCH_SEQ = -(1 << 31) + 1


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


@dataclass(slots=True)
class EventEntityState:
    """A correlation entity ``~event/<name>/<key>``: its events within their time to
    live, the waits open there, and the batches it collects for triggered workflows."""

    run_id: str  # its id: the journal key
    facts: int = 0
    events: list[EventPublished] = field(default_factory=list)  # within their time to live
    event_ids: list[str] = field(default_factory=list)  # the latest ids seen: dedupe
    subscriptions: list[tuple[str, int]] = field(default_factory=list)  # (run, seq)
    delivered: set[tuple[str, str]] = field(default_factory=set)  # (run, event id)
    # The event matched to each (run, seq) and not given back, while its id is among
    # `event_ids`: a wait that times out gets its event undone at once (`subscribe`).
    matched: dict[tuple[str, int], str] = field(default_factory=dict)
    batches: dict[str, list[EventBatched]] = field(default_factory=dict)  # by workflow

    def copy(self) -> EventEntityState:
        return replace(
            self,
            events=list(self.events),
            event_ids=list(self.event_ids),
            subscriptions=list(self.subscriptions),
            delivered=set(self.delivered),
            matched=dict(self.matched),
            batches={wf: list(events) for wf, events in self.batches.items()},
        )

    def timers(self) -> set[tuple[int, int]]:
        """The first batch window to close (`BATCH_SEQ`)."""
        windows = [b[0].due_ms for b in self.batches.values() if b and b[0].due_ms is not None]
        return {(min(windows), BATCH_SEQ)} if windows else set()


@dataclass(slots=True)
class ScheduleState:
    """A schedule entity ``~schedule/<name>``: its definition, whether paused, its next fire."""

    run_id: str  # its id: the journal key
    facts: int = 0
    schedule: ScheduleSet | None = None
    paused: bool = False
    next_fire_ms: int | None = None

    def copy(self) -> ScheduleState:
        return replace(self)

    def timers(self) -> set[tuple[int, int]]:
        """Its next fire (`WAKE_SEQ`)."""
        return set() if self.next_fire_ms is None else {(self.next_fire_ms, WAKE_SEQ)}


@dataclass(slots=True)
class LimitState:
    """A limit entity ``~limit/...``: its settings, the permits held, the requests waiting
    (in arrival order), the rate limit's theoretical arrival time (ms, GCRA), and when
    each fairness key was last served (the grant's number), for round robin."""

    run_id: str  # its id: the journal key
    facts: int = 0
    limit: LimitSet | None = None
    held: dict[tuple[str, int], PermitGranted] = field(default_factory=dict)
    queue: list[PermitQueued] = field(default_factory=list)
    tat_ms: float = 0.0
    served: dict[str, int] = field(default_factory=dict)
    grants: int = 0
    value: bytes | None = None  # a durable entity's state (JSON), when the limit is its lock

    def copy(self) -> LimitState:
        return replace(self, held=dict(self.held), queue=list(self.queue), served=dict(self.served))

    def timers(self) -> set[tuple[int, int]]:
        """When its rate allows its next grant (`WAKE_SEQ`)."""
        wake = self.next_grant_ms()
        return set() if wake is None else {(wake, WAKE_SEQ)}

    def asked(self, holder: str, seq: int) -> bool:
        """It holds out a permit to ``holder`` at ``seq``, or queues its request."""
        return (holder, seq) in self.held or any(
            (q.holder, q.seq) == (holder, seq) for q in self.queue
        )

    def request_of(self, holder: str, seq: int) -> str | None:
        """The id of the request of ``holder`` at ``seq`` it holds out a permit to, or
        queues (None: it does neither)."""
        held = self.held.get((holder, seq))
        if held is not None:
            return held.request_id
        return next((q.request_id for q in self.queue if (q.holder, q.seq) == (holder, seq)), None)

    def can_grant(self, now: int) -> bool:
        """It may grant a permit at ``now`` (concurrency and rate allow it)."""
        if self.limit is None or self._full():
            return False
        wake = self._rate_wake()
        return wake is None or wake <= now

    def next_grant_ms(self) -> int | None:
        """When it may grant to the requests waiting, for nothing but its rate
        (None when full: a release will grant)."""
        if not self.queue or self._full():
            return None
        return self._rate_wake()

    def _full(self) -> bool:
        lim = self.limit
        return lim is not None and lim.concurrency is not None and len(self.held) >= lim.concurrency

    def _rate_wake(self) -> int | None:
        """When the token bucket has a token (GCRA: its arrival time less the burst)."""
        lim = self.limit
        if lim is None or not lim.rate:
            return None
        interval = 1000 / lim.rate
        return math.ceil(self.tat_ms - (max(lim.burst, 1) - 1) * interval)


@dataclass(slots=True)
class TaskGroupState:
    """A task group's pause on one partition ``~taskgroup/<group>/<p>.<salt>``
    (`partitioner.task_group_id`): whether paused (who, why), and the runs of the
    partition that hold a remote step of the group meanwhile, by (run, seq)."""

    run_id: str  # its id: the journal key
    facts: int = 0
    paused: GroupPaused | None = None
    pause_ids: set[str] = field(default_factory=set)  # commands recorded: dedupe
    held: list[tuple[str, int]] = field(default_factory=list)  # (run, seq), in order

    def copy(self) -> TaskGroupState:
        return replace(self, pause_ids=set(self.pause_ids), held=list(self.held))

    def timers(self) -> set[tuple[int, int]]:
        return set()


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
