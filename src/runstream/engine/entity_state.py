"""The states of the engine's own entities, each a journal key of its own (`id_kind`):
an event's correlation entity, a schedule, a limit (also a durable entity's lock and
state) and a task group's pause on one partition. `reducer.apply` folds their facts
(`entity_reducer`); `state.new_state` picks a state by the id's kind."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from runstream.schemas.records import (
    EventBatched,
    EventPublished,
    GroupPaused,
    LimitSet,
    PermitGranted,
    PermitQueued,
    ScheduleSet,
)

# An entity has one timer of its own (a run's are told apart by seq): its projection key
# is (due, id, seq) with these seqs, the values older versions wrote.
#: The timer seq of a schedule's next fire and of a limit's next grant by its rate.
WAKE_SEQ = 0
#: The timer seq of an event entity's batch windows: below any step's (compensations
#: take -1, -2, ...), and still a 4-byte key in the projection.
BATCH_SEQ = -(1 << 31) + 1


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
