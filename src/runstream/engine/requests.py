"""What workflow code asks the engine for, and how a replay of it ends.

A workflow suspends by awaiting a `Suspend` that carries a `Request` (a step to run, a
timer, a signal, a child ...): the driver (`engine.replay`) gets it out of the coroutine.
A replay ends in an `Outcome`; an `Abort` unwinds the code with one (continue-as-new, a
history that no longer fits), and `Overrun` interrupts code past its time budget. A
`Replay` is what one activation returns: its outcome and what it recorded on the way.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any

from runstream.engine.workflow import StepDef
from runstream.errors import NonDeterminismError
from runstream.schemas.records import (
    ChildEnded,
    ChildStarted,
    EventAwaited,
    EventReceived,
    EventTimedOut,
    PermitReceived,
    PermitRequested,
    PromiseCompleted,
    PromiseCreated,
    RunEventSet,
    SeqFact,
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
    UpdateAccepted,
    ValueRecorded,
)


# What a suspended workflow waits for.
@dataclass(frozen=True, slots=True)
class StepCall:
    seq: int
    step: StepDef
    args: tuple[Any, ...]
    priority: int = 0  # for its queue's limit, if it has one
    fairness: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # to its body (interceptors')


@dataclass(frozen=True, slots=True)
class SleepCall:
    seq: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SignalWait:
    seq: int
    name: str
    timeout: float | None


@dataclass(frozen=True, slots=True)
class ChildCall:
    seq: int
    workflow: str
    input: bytes  # JSON
    child_run_id: str
    awaited: bool
    parent_close: str
    headers: dict[str, str] = field(default_factory=dict)  # the child's


@dataclass(frozen=True, slots=True)
class EventWait:
    seq: int
    name: str
    key: str
    timeout: float | None


@dataclass(frozen=True, slots=True)
class PromiseWait:
    seq: int  # the promise's: its completion (or its timeout) settles the wait


@dataclass(frozen=True, slots=True)
class EntityRead:
    """A shared read of an entity's key (`EntityRef.read`): asked once, as a promise of
    the run (``promise_id``) that the key's lock completes with the handler's answer."""

    seq: int
    promise_id: str
    lock: str  # the key's lock (`records.entity_lock_id`): its owner answers
    handler: str
    arg: bytes  # JSON: {"entity", "key", "arg"}, as a client's shared call
    timeout: float | None = None  # seconds: its promise times out if unanswered by then
    headers: dict[str, str] = field(default_factory=dict)  # to the shared handler


Request = StepCall | SleepCall | SignalWait | ChildCall | EventWait | PromiseWait | EntityRead

#: What happens to a child if its parent ends first (`Context.start_child`).
PARENT_CLOSE = ("request_cancel", "terminate", "abandon")


@dataclass(frozen=True, slots=True)
class ChildHandle:
    """A child run started by `Context.start_child`."""

    run_id: str


# How one replay ended.
@dataclass(frozen=True, slots=True)
class Completed:
    output: Any


@dataclass(frozen=True, slots=True)
class Failed:
    error: str
    traceback: str


@dataclass(frozen=True, slots=True)
class ContinuedAsNew:
    input: Any
    headers: dict[str, str] | None = None  # the successor's (None: the run's)


@dataclass(frozen=True, slots=True)
class Blocked:
    request: Request


@dataclass(frozen=True, slots=True)
class NonDeterministic:
    error: NonDeterminismError


@dataclass(frozen=True, slots=True)
class Overran:
    """The workflow code ran past its time budget and was interrupted."""


Outcome = Completed | Failed | ContinuedAsNew | Blocked | NonDeterministic | Overran


@dataclass(frozen=True, slots=True)
class Compensation:
    """The undo registered by the completed step at ``seq`` (runs as step ``-seq``)."""

    seq: int
    step: StepDef
    args: tuple[Any, ...]


#: Facts the workflow code records as it runs (no wait needed): values, promises' ids,
#: the run's events (`Context.set_event`).
Recorded = ValueRecorded | PromiseCreated | RunEventSet


@dataclass(slots=True)
class Replay:
    outcome: Outcome
    new_facts: list[Recorded] = field(default_factory=list)  # ctx.now/uuid/random/promise
    compensations: list[Compensation] = field(default_factory=list)
    # The update handlers still open in the history, and how far each got (`rules.updates`).
    updates: list[tuple[UpdateAccepted, Outcome]] = field(default_factory=list)


class Overrun(BaseException):
    """Raised into workflow code that overran its time budget (see runtime.budget)."""


class Abort(BaseException):
    """Unwinds user code with an ``outcome`` (raised by the `Context`, caught by its
    driver); a BaseException so `except Exception` in workflows can't swallow it."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


class Suspend:
    """What workflow code awaits to wait for ``request``: it yields itself out of the
    coroutine to its driver, which resumes the code once the history may settle it."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request

    def __await__(self) -> Generator[Suspend, None, None]:
        yield self  # resumed (by a Replayer) once the history may settle the request


def recorded_op(fact: SeqFact) -> str:
    """What a fact records at its sequence number, as the code must ask for it."""
    match fact:
        case StepStarted() | StepCompleted() | StepFailed() | StepHandedOver() | StepHeld():
            return f"step {fact.name}"
        case TimerScheduled() | TimerFired():
            return "sleep"
        case SignalAwaited() | SignalReceived() | SignalTimedOut():
            return f"signal {fact.name}"
        case ValueRecorded():
            return f"value {fact.name}"
        case ChildStarted() | ChildEnded():
            return f"child {fact.name}"
        case EventAwaited() | EventReceived() | EventTimedOut():
            return f"event {fact.name}"
        case PermitRequested() | PermitReceived():
            return "step"  # waits for a permit of its queue: a step, its name not recorded
        case PromiseCreated() | PromiseCompleted():
            return "promise"
        case RunEventSet():
            return f"set_event {fact.key}"
    raise TypeError(type(fact).__name__)  # pragma: no cover - SeqFact is closed


def requested_op(request: Request) -> str:
    """What a suspended workflow asks for, named as `recorded_op` names recorded ones."""
    match request:
        case StepCall():
            return f"step {request.step.name}"
        case SleepCall():
            return "sleep"
        case SignalWait():
            return f"signal {request.name}"
        case ChildCall():
            return f"child {request.workflow}"
        case EventWait():
            return f"event {request.name}"
        case PromiseWait() | EntityRead():
            return "promise"


def close_coroutine(coro: Coroutine[Any, Any, Any] | None) -> None:
    """Close ``coro`` if any (its finally blocks run); what it raises there is ignored,
    except `Overrun` (its time budget), which goes on."""
    if coro is not None:
        try:
            coro.close()
        except Overrun:
            raise
        except BaseException:  # it awaited or raised in a finally block: let it be
            pass
