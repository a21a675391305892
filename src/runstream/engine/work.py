"""What the core is given (work) and what it gives back (effects), as plain data.

The shell turns every consumed Kafka message into a `LogRecord` and every internal
event (a step body finished, a timer is due, a partition was restored) into one of
the small work items below. The core decides each one into a `Batch`: the facts, events,
replies and dead letters of one transaction, and the step bodies to run after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runstream.engine.blobs import Blob
from runstream.engine.state import State, beats_of
from runstream.engine.workflow import StepDef
from runstream.schemas.records import (
    Command,
    DeadLetter,
    Fact,
    LifecycleEvent,
    QueryAnswer,
    Record,
    RunInfo,
    StepTask,
    UpdateReply,
)

#: One attempt of one step of a run: (run id, seq, attempt).
Attempt = tuple[str, int, int]

# -- work ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One consumed Kafka record, as the edge hands it over (never a raw Message)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What a step attempt returned or raised."""

    partition: int
    run_id: str
    seq: int
    attempt: int
    ok: bool
    output: bytes = b"null"
    error: str | None = None
    traceback: str | None = None
    retryable: bool = True
    duration_ms: int = 0
    isolated: bool = False  # the attempt ran alone (a recovery)

    @property
    def key(self) -> Attempt:
        return self.run_id, self.seq, self.attempt


@dataclass(frozen=True, slots=True)
class TimerDue:
    """A due time of the run's operation ``seq`` has passed."""

    partition: int
    run_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class Recover:
    """After a restore: the run had a step in flight in a process that is gone."""

    partition: int
    run_id: str


@dataclass(frozen=True, slots=True)
class Resume:
    """After a restore: try a parked run again (its code or version may be back)."""

    partition: int
    run_id: str


@dataclass(frozen=True, slots=True)
class HandOver:
    """The instance lets the run's partition go (a stop, a rebalance) while steps of the run
    are still open here: record them as handed over. ``began`` are the seqs whose body had
    begun (the others were still queued)."""

    partition: int
    run_id: str
    began: frozenset[int] = frozenset()


Work = LogRecord | StepOutcome | TimerDue | Recover | Resume | HandOver


# -- effects ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepJob:
    """Run a step body once the transaction that records its StepStarted commits."""

    partition: int
    run_id: str
    seq: int
    attempt: int
    step: StepDef
    args: tuple[Any, ...]
    isolated: bool = False  # a recovery: runs alone in the process (see runtime.steps)
    headers: Mapping[str, str] = field(default_factory=dict)  # for its body's interceptors

    @property
    def key(self) -> Attempt:
        return self.run_id, self.seq, self.attempt


@dataclass(frozen=True, slots=True)
class Waiter:
    """A client waits for the end of a run: answer it in the transaction that ends it."""

    partition: int
    run_id: str
    reply_to: str
    request_id: str


@dataclass(frozen=True, slots=True)
class Forward:
    """A command that arrived on a partition its key does not hash to, sent to its own."""

    partition: int
    key: bytes | None
    value: bytes


@dataclass(slots=True)
class Encoded:
    """The bytes of an `Effects`' records, in their order, as far as encoded."""

    facts: list[bytes] = field(default_factory=list)
    lifecycle: list[bytes] = field(default_factory=list)
    tasks: list[bytes] = field(default_factory=list)
    commands: list[bytes] = field(default_factory=list)
    replies: list[bytes] = field(default_factory=list)
    dead_letters: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class Effects:
    """Everything a batch of decisions produced, in order."""

    facts: list[Fact] = field(default_factory=list)
    lifecycle: list[LifecycleEvent] = field(default_factory=list)
    steps: list[StepJob] = field(default_factory=list)
    tasks: list[StepTask] = field(default_factory=list)  # remote attempts, to their group
    commands: list[Command] = field(default_factory=list)  # to other runs
    replies: list[tuple[str, RunInfo | QueryAnswer | UpdateReply]] = field(
        default_factory=list
    )  # (to, answer)
    waiters: list[Waiter] = field(default_factory=list)  # questions to answer at the end
    dead_letters: list[DeadLetter] = field(default_factory=list)
    forwards: list[Forward] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)  # large payloads, to the blobs topic
    encoded: Encoded = field(default_factory=Encoded)

    def encode(self, encode: Callable[[Record], bytes]) -> tuple[int, str]:
        """Encode the records not encoded yet into `encoded` (the decision guard encodes
        what each decision produced, so none is unencodable or too large; the outbox, the
        rest). Returns the size and the type of the largest record encoded now."""
        e, largest = self.encoded, (0, "")
        new: tuple[tuple[list[bytes], Sequence[Record]], ...] = (
            (e.facts, self.facts[len(e.facts) :]),
            (e.lifecycle, self.lifecycle[len(e.lifecycle) :]),
            (e.tasks, self.tasks[len(e.tasks) :]),
            (e.commands, self.commands[len(e.commands) :]),
            (e.replies, [info for _, info in self.replies[len(e.replies) :]]),
            (e.dead_letters, self.dead_letters[len(e.dead_letters) :]),
        )
        for done, records in new:
            for record in records:
                data = encode(record)
                done.append(data)
                if len(data) > largest[0]:
                    largest = (len(data), type(record).__name__)
        return largest

    def _lists(self) -> tuple[list[Any], ...]:
        e = self.encoded
        return (
            self.facts,
            self.lifecycle,
            self.steps,
            self.tasks,
            self.commands,
            self.replies,
            self.waiters,
            self.dead_letters,
            self.forwards,
            self.blobs,
            e.facts,
            e.lifecycle,
            e.tasks,
            e.commands,
            e.replies,
            e.dead_letters,
        )

    def mark(self) -> tuple[int, ...]:
        """Where the effects stand now, for `rollback`."""
        return tuple(len(x) for x in self._lists())

    def rollback(self, mark: tuple[int, ...]) -> None:
        """Drop every effect added since ``mark``."""
        for lst, n in zip(self._lists(), mark, strict=True):
            del lst[n:]


@dataclass(slots=True)
class Working:
    """A run's (or an entity's) state before the batch (as committed) and its working copy.
    ``seen``: after the batch dropped the run's cached coroutine (`Decider._undo`), the
    state its code had seen, so the replay that follows in the batch is one to the
    interceptors up to there (`rules.context.settled`)."""

    partition: int
    before: State
    after: State
    seen: State | None = None


class Batch:
    """The working copies, effects and consumed offsets of one transaction.

    ``load(partition, run_id)`` gives a run's committed state (do not mutate it). If the
    transaction aborts, the shell drops the batch and nothing of it remains.
    """

    def __init__(
        self,
        load: Callable[[int, str], State],
        now: int,
        parked: Mapping[str, str] | None = None,
        since: Callable[[int], int] | None = None,
    ) -> None:
        self.load = load
        self.now = now
        # When this instance took partition p over (ms): a remote attempt's liveness
        # counts from then at the earliest (its heartbeats before were not seen here).
        self.since = since or (lambda _p: 0)
        self.runs: dict[str, Working] = {}
        self.effects = Effects()
        self.consumed: dict[int, tuple[int, int]] = {}  # partition -> (first, last) offset
        # Runs whose workflow code must not run in this batch, with why (runtime.budget).
        self.parked: Mapping[str, str] = parked or {}

    def state(self, partition: int, run_id: str) -> State:
        """The working copy in this batch of the run (or entity) ``run_id``."""
        w = self.runs.get(run_id)
        if w is None:
            before = self.load(partition, run_id)
            w = self.runs[run_id] = Working(partition, before, before.copy())
        return w.after

    def partition_of(self, run_id: str) -> int:
        return self.runs[run_id].partition

    def consume(self, record: LogRecord) -> None:
        """Count ``record`` as consumed by this batch's transaction."""
        first, _ = self.consumed.get(record.partition, (record.offset, record.offset))
        self.consumed[record.partition] = (first, record.offset)

    @property
    def empty(self) -> bool:
        """Nothing to produce or commit: the batch needs no transaction (see `changed`)."""
        fx = self.effects
        return not (
            fx.waiters
            or self.consumed
            or fx.facts
            or fx.replies
            or fx.dead_letters
            or fx.forwards
            or fx.commands
        )

    @property
    def changed(self) -> bool:
        """A run's state changed with no fact: its heartbeats, which the projection keeps
        beside the facts (a new owner's grace for a remote attempt is one). An empty batch
        with such a change needs no transaction, but the shell keeps it and arms its timers."""
        return any(beats_of(w.after) != beats_of(w.before) for w in self.runs.values())
