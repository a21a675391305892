"""Every record Runstream reads or writes, one frozen dataclass per Avro schema.

The ``.avsc`` files next to this module are the public contract; each class here has
the name of its schema and its fields in the same order (a test checks both). The
codec turns these objects into single-object encoded Avro and back, so nothing past
the Kafka edge handles raw dicts. Statuses, lifecycle types and dead-letter codes,
which travel as strings, are declared here once.

Records are immutable values. Collections inside them (``tags``) are never mutated.
Only their first two fields are positional (``_: KW_ONLY`` follows them): a call that
builds one names what it sets, and a field added later cannot shift the others.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import ClassVar


class Status(StrEnum):
    """Where a run is. Terminal runs never change again."""

    RUNNING = "running"
    COMPENSATING = "compensating"
    PARKED = "parked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD = "dead"
    REJECTED = "rejected"  # a StartRun was refused; a later valid one may still start it
    PAUSED = "paused"  # an operator paused it: no workflow code runs until unpaused


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.DEAD})


class Kind(StrEnum):
    """The ``type`` of a LifecycleEvent (docs/reference/codes.md: lifecycle events)."""

    RUN_STARTED = "run.started"
    RUN_SUSPENDED = "run.suspended"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_DEAD = "run.dead"
    RUN_REJECTED = "run.rejected"
    RUN_RETRIED = "run.retried"
    RUN_HISTORY_LARGE = "run.history_large"
    EVENT_UNMATCHED = "event.unmatched"
    STEP_STARTED = "step.started"
    STEP_COMPLETED = "step.completed"
    STEP_FAILED = "step.failed"
    STEP_HANDED_OVER = "step.handed_over"
    STEP_HELD = "step.held"  # its task group is paused: sent on unpause (``reason``)
    STEP_RESULT_IGNORED = "step.result_ignored"
    RUN_EVENT_SET = "run.event_set"  # ctx.set_event: ``key`` and the value in ``output``
    RUN_PAUSED = "run.paused"
    RUN_UNPAUSED = "run.unpaused"
    RUN_PURGED = "run.purged"  # past finished_retention: the engine no longer has the run


class Reason(StrEnum):
    """Why a record went to the dead-letter topic (``DeadLetter.code``)."""

    UNDECODABLE = "undecodable"
    UNKNOWN_SCHEMA = "unknown-schema"  # single-object Avro of a schema this engine lacks
    NOT_A_COMMAND = "not-a-command"
    BAD_RUN_ID = "bad-run-id"
    OVERSIZE = "oversize"
    UNKNOWN_WORKFLOW = "unknown-workflow"
    INVALID_INPUT = "invalid-input"
    UNKNOWN_RUN = "unknown-run"
    UNEXPECTED_RESULT = "unexpected-step-result"
    RUN_DEAD = "run-dead"
    NOT_RETRYABLE = "not-retryable"
    UNENCODABLE = "unencodable"
    INTERNAL = "internal-error"
    UNKNOWN_PROMISE = "unknown-promise"  # no such promise in the run (or not a promise id)
    PROMISE_COMPLETED = "promise-completed"  # resolved, rejected or timed out already
    RUN_ENDED = "run-ended"  # its promise can no longer be completed
    UPDATE_REFUSED = "update-refused"  # an update nobody waits for was refused
    BLOB_MISSING = "blob-missing"  # a large payload's reference names no (or corrupt) bytes


#: A run id is 1 to this many bytes of UTF-8.
MAX_RUN_ID_BYTES = 255
# Continue-as-new names the next run "<id>~<n>": ids of that shape are reserved for it.
_CONTINUATION = re.compile(r"~\d+\Z")


def run_id_problem(
    run_id: str, *, new: bool = False, continued_from: str | None = None
) -> str | None:
    """Why ``run_id`` cannot name a run, or None if it can.

    A NUL would let one run's projection keys fall inside another's range, and a huge id
    bloats every key of the run. A ``new`` run may not take an id ``<id>~<n>``, which
    continue-as-new reserves, unless it is the continuation of ``continued_from``.
    """
    size = len(run_id.encode())
    if not 0 < size <= MAX_RUN_ID_BYTES:
        return f"a run id is 1 to {MAX_RUN_ID_BYTES} bytes of UTF-8, not {size}"
    if "\x00" in run_id:
        return "a run id may not contain NUL characters"
    if new and run_id.startswith(ENTITY_PREFIX):
        return f"run id {run_id!r} begins with {ENTITY_PREFIX!r}, which the engine reserves"
    if (
        new
        and _CONTINUATION.search(run_id)
        and (continued_from is None or continuation_of(continued_from) != run_id)
    ):
        return f"run id {run_id!r} ends in '~' and digits, which continue-as-new reserves"
    return None


#: Ids of the engine's own keyed entities begin so; no run may take one.
ENTITY_PREFIX = "~"


#: The id prefixes of the engine's entities, one per kind (`entity_id`).
EVENT_PREFIX = f"{ENTITY_PREFIX}event/"
LIMIT_PREFIX = f"{ENTITY_PREFIX}limit/"
SCHEDULE_PREFIX = f"{ENTITY_PREFIX}schedule/"
TASK_GROUP_PREFIX = f"{ENTITY_PREFIX}taskgroup/"


def entity_id(prefix: str, *parts: str, hashed: str) -> str:
    """``prefix`` and ``parts`` joined by ``/``, unambiguously: if a part holds a ``/``,
    each part is escaped (``%`` and ``/``) and ``//`` marks the id, whose slashes then
    outnumber those of any id of unescaped parts; ids of parts without ``/`` stay as
    they always were. An id too long for a key (or with a NUL) is a hash: of ``hashed``
    (the text hashed before ids were escaped), or of the escaped id."""
    escaped = any("/" in p for p in parts)
    if escaped:
        ent = f"{prefix}//" + "/".join(p.replace("%", "%25").replace("/", "%2F") for p in parts)
    else:
        ent = prefix + "/".join(parts)
    if len(ent.encode()) <= MAX_RUN_ID_BYTES and "\x00" not in ent:
        return ent
    return prefix + hashlib.sha256((ent if escaped else hashed).encode()).hexdigest()


def correlation_id(name: str, key: str) -> str:
    """The id of the entity that matches events ``name`` with correlation ``key`` to the
    runs waiting for them: its partition owns both."""
    return entity_id(EVENT_PREFIX, name, key, hashed=f"{name}\x00{key}")


def limit_id(name: str, key: str | None = None) -> str:
    """The id of the entity that keeps limit ``name`` (a step queue), or the concurrency
    limit of workflow ``name`` for one ``key``: its partition owns the permits."""
    parts = (name,) if key is None else (name, key)
    return entity_id(LIMIT_PREFIX, *parts, hashed=f"{name}\x00{key}")


def task_group_of(entity: str) -> str:
    """The task group a `task_group_id` names."""
    return entity[len(TASK_GROUP_PREFIX) :].rsplit("/", 1)[0]


#: The seq of a run's own permit (its workflow's concurrency_key), below any step's.
RUN_PERMIT_SEQ = -(1 << 31) + 2

#: An update handler's operations take seqs of their own, above the workflow's: the
#: handler of the run's update ``index`` (from 0) takes `update_seq(index, 1)`, ... (a
#: 4-byte key in the projection bounds both numbers).
UPDATE_SEQ_BASE = 1 << 30
UPDATE_SEQ_SPAN = 1 << 16
MAX_UPDATES = (1 << 30) // UPDATE_SEQ_SPAN  # per history


def update_seq(index: int, n: int) -> int:
    """The seq of the ``n``-th operation (from 1) of the handler of update ``index``."""
    return UPDATE_SEQ_BASE + index * UPDATE_SEQ_SPAN + n


class UpdateStage(StrEnum):
    """Where an update stands (`UpdateReply.stage`)."""

    ACCEPTED = "accepted"  # its validator passed: an UpdateAccepted fact
    COMPLETED = "completed"  # its handler returned (output) or failed (error): a fact
    REJECTED = "rejected"  # refused in the decision: no fact


class UpdateCode(StrEnum):
    """Why an update was refused or failed (`UpdateReply.code`)."""

    REJECTED = "rejected"  # its validator raised
    NO_HANDLER = "no-handler"  # the run has no handler of that name (yet)
    UNKNOWN_RUN = "unknown-run"
    RUN_ENDED = "run-ended"  # the run ended (or continued as new) before or while it ran
    NOT_RUNNING = "not-running"  # parked, compensating, or waiting for its permit
    TOO_MANY = "too-many"  # caps: in flight, or in the history
    INVALID_INPUT = "invalid-input"
    HANDLER_FAILED = "handler-failed"  # its handler raised


def schedule_id(name: str) -> str:
    """The id of the entity that keeps schedule ``name`` (`ScheduleCommand`)."""
    return f"{SCHEDULE_PREFIX}{name}"


class IdKind(StrEnum):
    """What a journal key names: a run, or one of the engine's own entities."""

    RUN = "run"
    EVENT = "event"  # correlation_id: published events and the waits for them
    LIMIT = "limit"  # limit_id: permits
    SCHEDULE = "schedule"  # schedule_id
    TASK_GROUP = "taskgroup"  # task_group_id: a task group's pause, one per partition


_ENTITY_KINDS = {
    EVENT_PREFIX: IdKind.EVENT,
    LIMIT_PREFIX: IdKind.LIMIT,
    SCHEDULE_PREFIX: IdKind.SCHEDULE,
    TASK_GROUP_PREFIX: IdKind.TASK_GROUP,
}


def id_kind(run_id: str) -> IdKind:
    """The kind of ``run_id``, from its prefix; any id without an entity's prefix names a
    run (no run may begin with `ENTITY_PREFIX`: `run_id_problem`)."""
    if run_id.startswith(ENTITY_PREFIX):
        for prefix, kind in _ENTITY_KINDS.items():
            if run_id.startswith(prefix):
                return kind
    return IdKind.RUN


#: A promise's id is its run's id, this, and its sequence number (`promise_id`).
PROMISE_INFIX = "/promise/"


def promise_id(run_id: str, seq: int) -> str:
    """The id of the promise the run ``run_id`` created at ``seq`` (`Context.promise`):
    it carries the run's id, so a completion goes to the run's partition."""
    return f"{run_id}{PROMISE_INFIX}{seq}"


def promise_of(pid: str) -> tuple[str, int] | None:
    """(run id, seq) of a promise id, or None if ``pid`` is not one. Read from the
    right: a run id may hold ``/promise/`` itself, the seq is digits only."""
    run_id, infix, seq = pid.rpartition(PROMISE_INFIX)
    if not (run_id and infix and seq.isdigit() and seq[0] != "0"):
        return None
    return run_id, int(seq)


#: A durable entity ``name`` (`App.entity`): each exclusive call is a run of the workflow
#: ``entity:<name>`` whose id `entity_call_id` names; one key's calls share the limit
#: `entity_lock_id` (one permit), which queues them and keeps the key's state.
ENTITY_WORKFLOW_PREFIX = "entity:"


def entity_workflow(name: str) -> str:
    """The hidden workflow whose runs are the exclusive calls of entity ``name``."""
    return f"{ENTITY_WORKFLOW_PREFIX}{name}"


def entity_lock_id(name: str, key: str) -> str:
    """The limit that is entity ``name`` ``key``'s lock, queue and state."""
    return limit_id(entity_workflow(name), key)


def entity_call_id(
    name: str, key: str, call_id: str, partition: Callable[[str], int] | None = None
) -> str:
    """The run id of call ``call_id`` to entity ``name`` ``key``: the same call id is the
    same run, so a call sent twice runs once. With ``partition`` (a run id's partition),
    the id lands on the partition of the key's lock (a ``#<n>`` suffix, the first that
    does): one sender's calls to a key then stay in the order it sent them."""
    base = entity_id(
        f"{entity_workflow(name)}/", key, call_id, hashed=f"{name}\x00{key}\x00{call_id}"
    )
    if partition is None:
        return base
    if len(base.encode()) > MAX_RUN_ID_BYTES - 8:  # room for the suffix
        base = f"{entity_workflow(name)}/" + hashlib.sha256(base.encode()).hexdigest()
    home, n, run_id = partition(entity_lock_id(name, key)), 0, base
    while partition(run_id) != home:
        n += 1
        run_id = f"{base}#{n}"
    return run_id


def continuation_of(run_id: str) -> str:
    """The id of the run that continues ``run_id`` (``order`` -> ``order~1`` -> ``order~2``)."""
    base, n = run_id, 0
    if m := _CONTINUATION.search(run_id):
        base, n = run_id[: m.start()], int(m.group()[1:])
    return f"{base}~{n + 1}"


def continues(run_id: str, origin: str) -> bool:
    """``run_id`` is ``origin`` or one of its continuations (``origin~<n>``)."""
    rest = run_id.removeprefix(f"{origin}~")
    return run_id == origin or (rest != run_id and rest.isdigit())


class Record:
    """Base of every record type: ``AVRO`` is the short name of its schema."""

    __slots__ = ()
    AVRO: ClassVar[str]

    def __init_subclass__(cls) -> None:
        cls.AVRO = cls.__name__


# -- commands: topic <ns>.commands, keyed by run id ------------------------------------


@dataclass(frozen=True, slots=True)
class StartRun(Record):
    run_id: str
    workflow: str
    _: KW_ONLY
    input: bytes
    version: str | None = None
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    sent_at_ms: int = 0
    continued_from: str | None = None
    reply_to: str | None = None  # answer this client once the run has ended
    request_id: str = ""
    timeout_ms: int | None = None  # overrides the workflow's execution timeout
    signal: str | None = None  # signal-with-start: deliver this signal either way
    signal_payload: bytes | None = None
    signal_id: str = ""
    parent_seq: int | None = None  # set by the engine: where the parent awaits this child
    headers: dict[str, str] = field(default_factory=dict)  # interceptors' (traceparent, ...)


@dataclass(frozen=True, slots=True)
class Signal(Record):
    run_id: str
    name: str
    _: KW_ONLY
    payload: bytes
    signal_id: str
    sent_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Cancel(Record):
    run_id: str
    compensate: bool = False
    _: KW_ONLY
    reason: str = ""
    sent_at_ms: int = 0
    abandon_children: bool = False


@dataclass(frozen=True, slots=True)
class Retry(Record):
    run_id: str
    reason: str = ""
    _: KW_ONLY
    input: bytes | None = None  # corrected input: retry as a new run
    sent_at_ms: int = 0
    retry_id: str = ""  # a resent retry counts once


@dataclass(frozen=True, slots=True)
class StepResult(Record):
    run_id: str
    seq: int
    _: KW_ONLY
    attempt: int
    ok: bool
    output: bytes
    error: str | None = None
    traceback: str | None = None
    attempt_id: str = ""
    retryable: bool = True
    duration_ms: int = 0
    worker: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat(Record):
    """A task worker's sign of life for a remote attempt: kept in the projection, never
    journaled."""

    run_id: str
    seq: int
    _: KW_ONLY
    attempt_id: str
    details: bytes | None = None
    sent_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class ChildResult(Record):
    run_id: str  # the parent
    seq: int
    _: KW_ONLY
    child_run_id: str
    status: str
    output: bytes | None = None
    error: str | None = None
    sent_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class PublishEvent(Record):
    run_id: str  # the correlation id, correlation_id(name, key)
    name: str
    _: KW_ONLY
    event_id: str
    payload: bytes
    key: str = ""
    ttl_ms: int = 0
    sent_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe(Record):
    run_id: str  # the correlation id
    name: str
    _: KW_ONLY
    subscriber: str
    seq: int
    key: str = ""
    cancel: bool = False
    sent_at_ms: int = 0
    # With cancel: the event matched to the wait at seq, given back (it had timed out).
    event_id: str = ""
    payload: bytes | None = None


@dataclass(frozen=True, slots=True)
class DeliverEvent(Record):
    run_id: str  # the waiting run
    seq: int
    _: KW_ONLY
    name: str
    event_id: str
    payload: bytes
    sent_at_ms: int = 0
    key: str = ""  # the event's key: where the run gives it back if its wait timed out


@dataclass(frozen=True, slots=True)
class ScheduleCommand(Record):
    run_id: str  # schedule_id(name)
    op: str  # set, pause, resume, delete
    _: KW_ONLY
    workflow: str = ""
    input: bytes | None = None
    cron: str = ""
    tz: str = "UTC"
    sent_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Acquire(Record):
    run_id: str  # limit_id(...)
    holder: str
    _: KW_ONLY
    seq: int
    attempt: int = 1
    priority: int = 0
    fairness: str = ""
    concurrency: int | None = None
    rate: float | None = None
    burst: int = 1
    max_queued: int | None = None
    sent_at_ms: int = 0
    request_id: str = ""  # the holder's id of this request: its Release names it


@dataclass(frozen=True, slots=True)
class Grant(Record):
    run_id: str  # the holder
    seq: int
    _: KW_ONLY
    limit: str
    granted: bool = True
    reason: str = ""
    sent_at_ms: int = 0
    request_id: str = ""  # the request answered: a stale one is released, not taken
    value: bytes | None = None  # a durable entity's state, given with its lock (JSON)


@dataclass(frozen=True, slots=True)
class Release(Record):
    run_id: str  # limit_id(...)
    holder: str
    _: KW_ONLY
    seq: int
    sent_at_ms: int = 0
    request_id: str = ""  # the request whose permit goes back (forged: frees nothing)
    value: bytes | None = None  # a durable entity's new state (JSON); None: unchanged


@dataclass(frozen=True, slots=True)
class CompletePromise(Record):
    run_id: str  # the promise's run (`promise_of`)
    promise_id: str
    _: KW_ONLY
    value: bytes | None = None  # resolved with this JSON
    error: str | None = None  # rejected with this message (the value is ignored)
    sent_at_ms: int = 0
    read: bool = False  # an entity's answer to a workflow's shared read (`rules.entities`)


@dataclass(frozen=True, slots=True)
class Query(Record):
    run_id: str
    request_id: str
    _: KW_ONLY
    reply_to: str
    wait: bool = False


# -- queries (issue 21 item 2): a live query of a run's @query handler ---------------


#: The ``reply_to`` of a `LiveQuery` a run sends to read an entity's key
#: (`EntityRef.read`): its answer is a `CompletePromise` of ``request_id``, the run's
#: promise, on the commands topic, rather than a `QueryAnswer` on the replies topic.
TO_RUN = "~run"


@dataclass(frozen=True, slots=True)
class LiveQuery(Record):
    run_id: str
    request_id: str
    _: KW_ONLY
    reply_to: str
    name: str
    arg: bytes  # JSON
    sent_at_ms: int = 0
    headers: dict[str, str] = field(default_factory=dict)  # the caller's (interceptors)


@dataclass(frozen=True, slots=True)
class Pause(Record):
    run_id: str
    reason: str = ""
    _: KW_ONLY
    by: str = ""  # who asked (an operator, a host): recorded on RunPaused
    sent_at_ms: int = 0
    pause_id: str = ""  # idempotency: the same id again changes nothing


@dataclass(frozen=True, slots=True)
class Unpause(Record):
    run_id: str
    reason: str = ""
    _: KW_ONLY
    by: str = ""
    sent_at_ms: int = 0
    pause_id: str = ""


@dataclass(frozen=True, slots=True)
class ReleaseTask(Record):
    run_id: str  # the run whose remote step a paused task group held
    seq: int
    _: KW_ONLY
    group: str
    sent_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Update(Record):
    """A validated update (`Client.update`); with ``start_workflow``, update-with-start."""

    run_id: str
    name: str
    _: KW_ONLY
    update_id: str  # idempotency: a duplicate gets the first one's answer
    arg: bytes
    reply_to: str | None = None
    request_id: str = ""
    sent_at_ms: int = 0
    start_workflow: str | None = None  # update-with-start: start the run if it does not exist
    start_input: bytes | None = None
    start_version: str | None = None
    start_tags: dict[str, str] = field(default_factory=dict)
    start_timeout_ms: int | None = None


Command = (
    StartRun
    | Signal
    | Cancel
    | Retry
    | StepResult
    | Heartbeat
    | ChildResult
    | PublishEvent
    | Subscribe
    | DeliverEvent
    | ScheduleCommand
    | Acquire
    | Grant
    | Release
    | Query
    | CompletePromise
    | LiveQuery
    | Pause
    | Unpause
    | Update
    | ReleaseTask
)
COMMANDS: tuple[type[Record], ...] = Command.__args__


# -- journal facts: topic <ns>.journal, keyed by run id ----------------------------------


@dataclass(frozen=True, slots=True)
class RunStarted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    workflow: str
    version: str
    input: bytes
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    reply_to: str | None = None
    request_id: str = ""
    deadline_ms: int | None = None  # the run times out then
    parent_seq: int | None = None  # where the parent awaits this run's end
    headers: dict[str, str] = field(default_factory=dict)  # the start's, merged


@dataclass(frozen=True, slots=True)
class RunRejected(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    workflow: str
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class StepStarted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    attempt: int
    attempt_id: str = ""
    isolated: bool = False
    group: str | None = None  # a remote step: the task group serving it
    deadline_ms: int | None = None
    heartbeat_ms: int | None = None

    @property
    def remote(self) -> bool:
        """Dispatched to a task worker (its outcome comes as a StepResult command)."""
        return self.group is not None


@dataclass(frozen=True, slots=True)
class StepCompleted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    output: bytes
    attempt: int
    duration_ms: int


@dataclass(frozen=True, slots=True)
class StepFailed(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    attempt: int
    error: str
    traceback: str
    retry_at_ms: int | None = None  # None: final, the workflow sees the error


@dataclass(frozen=True, slots=True)
class TimerScheduled(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    due_ms: int


@dataclass(frozen=True, slots=True)
class TimerFired(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int


@dataclass(frozen=True, slots=True)
class SignalAwaited(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    timeout_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SignalBuffered(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    name: str
    payload: bytes
    signal_id: str


@dataclass(frozen=True, slots=True)
class SignalReceived(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    payload: bytes
    signal_id: str


@dataclass(frozen=True, slots=True)
class SignalTimedOut(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str


@dataclass(frozen=True, slots=True)
class ValueRecorded(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    value: bytes


@dataclass(frozen=True, slots=True)
class PromiseCreated(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    promise_id: str
    timeout_at_ms: int | None = None  # then it times out, unless completed before


@dataclass(frozen=True, slots=True)
class PromiseCompleted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int  # the promise's (its PromiseCreated's)
    value: bytes | None = None  # resolved: JSON
    error: str | None = None  # rejected (or timed out): why
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class RunEventSet(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    key: str
    value: bytes  # JSON


@dataclass(frozen=True, slots=True)
class ChildStarted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str  # the child's workflow
    child_run_id: str
    awaited: bool
    parent_close: str = "request_cancel"


@dataclass(frozen=True, slots=True)
class ChildEnded(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    child_run_id: str
    status: str
    output: bytes | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class EventAwaited(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    key: str = ""
    timeout_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class EventReceived(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    event_id: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class EventTimedOut(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str


@dataclass(frozen=True, slots=True)
class EventPublished(Record):
    run_id: str  # the correlation id
    at_ms: int
    _: KW_ONLY
    name: str
    event_id: str
    payload: bytes
    key: str = ""
    expires_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class EventSubscribed(Record):
    run_id: str  # the correlation id
    at_ms: int
    _: KW_ONLY
    subscriber: str
    seq: int


@dataclass(frozen=True, slots=True)
class EventMatched(Record):
    run_id: str  # the correlation id
    at_ms: int
    _: KW_ONLY
    subscriber: str
    seq: int
    event_id: str  # empty: the subscription was dropped
    undone: bool = False  # the run gave the event back: its wait had timed out


@dataclass(frozen=True, slots=True)
class EventBatched(Record):
    run_id: str  # the correlation id
    at_ms: int
    _: KW_ONLY
    workflow: str
    event_id: str
    payload: bytes
    due_ms: int | None = None


@dataclass(frozen=True, slots=True)
class BatchStarted(Record):
    run_id: str  # the correlation id
    at_ms: int
    _: KW_ONLY
    workflow: str
    run: str


@dataclass(frozen=True, slots=True)
class ScheduleSet(Record):
    run_id: str  # schedule_id(name)
    at_ms: int
    _: KW_ONLY
    name: str
    workflow: str
    input: bytes
    cron: str
    tz: str
    next_fire_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ScheduleFired(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    fire_ms: int
    run: str
    next_fire_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ScheduleChanged(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    op: str  # paused, resumed, deleted
    next_fire_ms: int | None = None


@dataclass(frozen=True, slots=True)
class StepHandedOver(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    attempt: int
    ran: bool  # its body had begun: it runs again from the start


@dataclass(frozen=True, slots=True)
class StepHeld(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    name: str
    attempt: int  # the attempt that starts when its group is unpaused
    group: str


@dataclass(frozen=True, slots=True)
class TaskHeld(Record):
    run_id: str  # task_group_id(...)
    at_ms: int
    _: KW_ONLY
    holder: str  # the run whose step waits
    seq: int


@dataclass(frozen=True, slots=True)
class GroupPaused(Record):
    run_id: str  # task_group_id(...)
    at_ms: int
    _: KW_ONLY
    reason: str
    by: str
    pause_id: str = ""


@dataclass(frozen=True, slots=True)
class GroupUnpaused(Record):
    run_id: str  # task_group_id(...)
    at_ms: int
    _: KW_ONLY
    reason: str
    by: str
    pause_id: str = ""


@dataclass(frozen=True, slots=True)
class RunRecovered(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    recoveries: int  # recovery attempts charged to the run so far, this one included


@dataclass(frozen=True, slots=True)
class CompensationStarted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    error: str
    traceback: str
    cancelled: bool


@dataclass(frozen=True, slots=True)
class RunParked(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    reason: str


@dataclass(frozen=True, slots=True)
class RunPaused(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    reason: str
    by: str
    pause_id: str = ""


@dataclass(frozen=True, slots=True)
class RunUnpaused(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    reason: str
    by: str
    pause_id: str = ""


@dataclass(frozen=True, slots=True)
class RunCompleted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    output: bytes
    continued_as: str | None = None


@dataclass(frozen=True, slots=True)
class RunFailed(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    error: str
    traceback: str
    code: str | None = None  # errors.FAILURE_CODES; None in facts written before them


@dataclass(frozen=True, slots=True)
class RunCancelled(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    reason: str


@dataclass(frozen=True, slots=True)
class RunDead(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    reason: str


@dataclass(frozen=True, slots=True)
class RunRetried(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seqs: list[int] = field(default_factory=list)
    reason: str = ""
    deadline_ms: int | None = None  # its timeout again, from the retry
    retry_id: str = ""  # the Retry's id: the same id again changes nothing


@dataclass(frozen=True, slots=True)
class RetriedAsNew(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    new_run_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LimitSet(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    concurrency: int | None = None
    rate: float | None = None
    burst: int = 1
    max_queued: int | None = None


@dataclass(frozen=True, slots=True)
class PermitQueued(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    holder: str
    seq: int
    priority: int = 0
    fairness: str = ""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class PermitGranted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    holder: str
    seq: int
    fairness: str = ""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class PermitReleased(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    holder: str
    seq: int
    value: bytes | None = None  # a durable entity's state after the call; None: unchanged


@dataclass(frozen=True, slots=True)
class PermitRequested(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    limit: str
    attempt: int = 1
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class PermitReceived(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    seq: int
    limit: str
    attempt: int = 1
    granted: bool = True
    reason: str = ""
    value: bytes | None = None  # a durable entity's state, given with its lock (JSON)


@dataclass(frozen=True, slots=True)
class UpdateAccepted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    update_id: str
    name: str
    arg: bytes
    index: int  # the run's n-th update (from 0): its handler's seqs are `update_seq(index, k)`
    anchor: int  # where the workflow waited (`UpdateHandlers.points`): a replay starts it there
    reply_to: str | None = None
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class UpdateCompleted(Record):
    run_id: str
    at_ms: int
    _: KW_ONLY
    update_id: str
    output: bytes | None = None  # the handler's result (JSON), or None with an error
    error: str | None = None
    code: str = ""  # `UpdateCode` with an error


Fact = (
    RunStarted
    | RunRejected
    | StepStarted
    | StepCompleted
    | StepFailed
    | TimerScheduled
    | TimerFired
    | SignalAwaited
    | SignalBuffered
    | SignalReceived
    | SignalTimedOut
    | ValueRecorded
    | StepHandedOver
    | ChildStarted
    | ChildEnded
    | EventAwaited
    | EventReceived
    | EventTimedOut
    | EventPublished
    | EventSubscribed
    | EventMatched
    | EventBatched
    | BatchStarted
    | ScheduleSet
    | ScheduleFired
    | ScheduleChanged
    | LimitSet
    | PermitQueued
    | PermitGranted
    | PermitReleased
    | PermitRequested
    | PermitReceived
    | RunRecovered
    | CompensationStarted
    | RunParked
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunDead
    | RunRetried
    | RetriedAsNew
    | PromiseCreated
    | PromiseCompleted
    | RunEventSet
    | RunPaused
    | RunUnpaused
    | UpdateAccepted
    | UpdateCompleted
    | StepHeld
    | TaskHeld
    | GroupPaused
    | GroupUnpaused
)
FACTS: tuple[type[Record], ...] = Fact.__args__
END_FACTS = {
    RunCompleted: Status.COMPLETED,
    RunFailed: Status.FAILED,
    RunCancelled: Status.CANCELLED,
    RunDead: Status.DEAD,
}

# Facts that carry a sequence number: the operation of the workflow they belong to.
SeqFact = (
    StepStarted
    | StepCompleted
    | StepFailed
    | StepHandedOver
    | StepHeld
    | TimerScheduled
    | TimerFired
    | SignalAwaited
    | SignalReceived
    | SignalTimedOut
    | ValueRecorded
    | ChildStarted
    | ChildEnded
    | EventAwaited
    | EventReceived
    | EventTimedOut
    | PermitRequested
    | PermitReceived
    | PromiseCreated
    | PromiseCompleted
    | RunEventSet
)


# -- other topics ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LifecycleEvent(Record):
    """Topic <ns>.lifecycle, keyed by run id: the public stream of run and step events."""

    type: str
    run_id: str
    _: KW_ONLY
    at_ms: int
    workflow: str = ""
    version: str = ""
    status: str = ""
    seq: int | None = None
    step: str | None = None
    attempt: int | None = None
    duration_ms: int | None = None
    output: bytes | None = None
    error: str | None = None
    reason: str | None = None
    continued_as: str | None = None
    code: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # run.started
    input: bytes | None = None  # run.started
    key: str | None = None  # run.event_set


@dataclass(frozen=True, slots=True)
class DeadLetter(Record):
    """Topic <ns>.dlq, keyed by the original key: a poison record or a dead run."""

    reason: str
    source_topic: str
    _: KW_ONLY
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    run_id: str | None = None
    at_ms: int = 0
    code: str = ""
    redrives: int = 0  # times `runstream dlq redrive` produced the original again


#: Kafka headers on a record `runstream dlq redrive` produced again: how many times it was
#: redriven ("1", "2", ...), and the dead letter it came from ("<topic>:<partition>:<offset>").
#: A redriven record that fails again carries its count into its new DeadLetter.
REDRIVE_HEADER = "runstream-redrive"
REDRIVE_OF_HEADER = "runstream-redrive-of"


def redrives_of(headers: Iterable[tuple[str, bytes]]) -> int:
    """The redrive count a record's headers carry (0 if none, or not a number)."""
    for name, value in headers:
        if name == REDRIVE_HEADER:
            try:
                return max(0, int(value))
            except ValueError:
                return 0
    return 0


@dataclass(frozen=True, slots=True)
class RunInfo(Record):
    """Topic <ns>.replies, keyed by the asking client's id: the answer to a Query."""

    request_id: str
    run_id: str
    _: KW_ONLY
    found: bool
    status: str
    workflow: str
    version: str
    input: bytes | None = None
    output: bytes | None = None
    error: str | None = None
    reason: str | None = None
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    steps: int = 0
    continued_as: str | None = None
    reply_error: str | None = None
    code: str | None = None
    parent_run_id: str | None = None
    children: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class UpdateReply(Record):
    """Topic <ns>.replies, keyed by the asking client's id: where an update stands."""

    request_id: str
    update_id: str
    _: KW_ONLY
    run_id: str
    stage: str  # `UpdateStage`
    output: bytes | None = None
    error: str | None = None
    code: str = ""  # `UpdateCode` with an error


@dataclass(frozen=True, slots=True)
class StepTask(Record):
    """Topic <ns>.tasks.<group>: a remote step invocation (declared for remote steps)."""

    run_id: str
    seq: int
    _: KW_ONLY
    attempt: int
    name: str
    args: bytes
    deadline_ms: int | None = None
    attempt_id: str = ""
    group: str = ""
    heartbeat_ms: int | None = None
    sent_at_ms: int = 0
    headers: dict[str, str] = field(default_factory=dict)  # for step-body interceptors


@dataclass(frozen=True, slots=True)
class Event(Record):
    """Topic <ns>.events: a named event (declared for named events)."""

    name: str
    payload: bytes
    _: KW_ONLY
    event_id: str


@dataclass(frozen=True, slots=True)
class QueryAnswer(Record):
    """Topic <ns>.replies, keyed by the asking client's id: the answer to a LiveQuery."""

    request_id: str
    run_id: str
    _: KW_ONLY
    found: bool
    value: bytes | None = None  # the handler's result, JSON
    error: str | None = None  # why there is no value


_ALL: tuple[type[Record], ...] = (
    *COMMANDS,
    *FACTS,
    LifecycleEvent,
    DeadLetter,
    RunInfo,
    QueryAnswer,
    StepTask,
    Event,
    UpdateReply,
)
RECORDS: dict[str, type[Record]] = {cls.AVRO: cls for cls in _ALL}
