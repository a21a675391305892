"""Interceptors (public as `runstream.interceptors`): your code around what runs do, on
every instance (tracing, logging, headers, auth).
``App("shop", interceptors=[Tracing(), Audit()])``; the first is the outermost.

An `Interceptor` wraps four chains, each a class whose methods call ``self.next`` (the
same method of the next link, the engine's own last), as Temporal's interceptors do:

- `WorkflowInbound`: into the workflow code: ``execute`` (the whole run, as code: a
  coroutine that spans every activation), ``activate`` (one activation: the code run
  once, from the start or from where it waited, until it waits or ends), ``signal`` (a
  signal reaching the code).
- `WorkflowOutbound`: out of the workflow code: ``step``, ``child``, ``sleep``,
  ``continue_as_new``.
- `StepBody`: around each attempt of a step body, local (engine) or remote (task
  worker).
- `Interceptor.run_ended`: once a run's end is committed (on the engine that ended it).

Workflow code is replayed, and so are the inbound and outbound chains: ``is_replaying``
says whether what the link sees was already settled by an earlier activation (a replay
after a restart, on any instance); do side effects (emit a span, log) only when it is
False, and keep what the chain changes (headers, arguments) deterministic. Each link
calls ``next`` once.

``headers`` (text to text) travel with a run: `Client.start` (``headers=``) sends them in
the StartRun command and as its Kafka record headers (a plain producer may set Kafka
headers only), the engine records them on the RunStarted fact (so they survive a restart),
and they go to every step (local, or remote in the StepTask), child run and continued run.
An outbound link may change the ``headers`` of the step, child or continued run it sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from runstream.engine.state import RunState

__all__ = [
    "ActivationInput",
    "ChildInput",
    "ContinueAsNewInput",
    "ExecuteInput",
    "Interceptor",
    "RunEndedInput",
    "SignalInput",
    "SleepInput",
    "StepBody",
    "StepBodyInput",
    "StepInput",
    "WorkflowInbound",
    "WorkflowOutbound",
    "kafka_headers",
    "record_headers",
]

log = logging.getLogger("runstream.interceptors")

#: A Kafka record header with this prefix (runstream-redrive, ...) is Runstream's own.
RESERVED_PREFIX = "runstream"

# -- what each link sees ---------------------------------------------------------------


@dataclass(slots=True)
class ExecuteInput:
    """The run, as its code starts (from the start: the first time, or a replay)."""

    run_id: str
    workflow: str
    version: str
    input: Any
    headers: Mapping[str, str]
    started_at_ms: int
    is_replaying: bool
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class ActivationInput:
    """One activation of the run's code (a decision that runs it)."""

    run_id: str
    workflow: str
    version: str
    headers: Mapping[str, str]
    now_ms: int
    is_replaying: bool  # the code starts again from the start, over what it did before
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class UpdateInput:
    """An accepted update reaching its handler (`Context.update_handler`): started once
    per activation that replays the run from the start, live (not ``is_replaying``) the
    first time."""

    run_id: str
    update_id: str
    name: str
    arg: Any
    headers: Mapping[str, str]
    is_replaying: bool
    run_attempt: int = 1


@dataclass(slots=True)
class QueryInput:
    """A live query reaching its handler (`Context.query_handler`); never recorded."""

    run_id: str
    name: str
    arg: Any
    headers: Mapping[str, str]


@dataclass(slots=True)
class SignalInput:
    """A signal reaching the code (`Context.wait_for_signal` returns its payload)."""

    run_id: str
    seq: int
    name: str
    payload: Any
    headers: Mapping[str, str]
    waited_since_ms: int  # when the wait began
    received_at_ms: int
    is_replaying: bool
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class StepInput:
    """A step the code calls; ``headers`` go to its body (`StepBodyInput.headers`)."""

    run_id: str
    seq: int
    name: str
    args: tuple[Any, ...]
    headers: dict[str, str]
    group: str | None  # a remote step's task group
    started_at_ms: int  # when the code first asked for it
    is_replaying: bool
    compensate: Callable[..., Any] | None = None
    priority: int = 0
    fairness: str = ""
    attempt: int = 0  # the attempt that settled it, once settled (0: not known yet)
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class ChildInput:
    """A child run the code starts (``awaited``: `Context.child`, else `start_child`);
    ``headers`` become the child's."""

    run_id: str
    seq: int
    workflow: str
    input: Any
    child_run_id: str | None  # None: the default, ``<run_id>/<seq>``
    awaited: bool
    parent_close: str
    headers: dict[str, str]
    started_at_ms: int
    is_replaying: bool
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class EntityReadInput:
    """A shared read of an entity's key from workflow code (`EntityRef.read`); change
    ``key``, ``arg`` or ``timeout`` (seconds, None: none) before calling ``next``."""

    run_id: str
    seq: int
    entity: str
    key: str
    handler: str
    arg: Any
    timeout: float | None
    headers: Mapping[str, str]
    started_at_ms: int
    is_replaying: bool
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class SleepInput:
    run_id: str
    seq: int
    seconds: float
    headers: Mapping[str, str]
    started_at_ms: int
    is_replaying: bool
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class ContinueAsNewInput:
    """The run ends and ``<run_id>~N`` starts with ``input`` and these ``headers``."""

    run_id: str
    input: Any
    headers: dict[str, str]
    is_replaying: bool
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


@dataclass(slots=True)
class StepBodyInput:
    """One attempt of a step body, about to run (never a replay: bodies run for real)."""

    run_id: str
    seq: int
    attempt: int
    name: str
    args: tuple[Any, ...]
    headers: Mapping[str, str]
    group: str | None  # a remote step's task group (run by a task worker)
    is_replaying: bool = False


@dataclass(slots=True)
class RunEndedInput:
    """A run's end, committed: ``status`` is completed, failed, cancelled or dead."""

    run_id: str
    workflow: str
    version: str
    status: str
    started_at_ms: int
    ended_at_ms: int
    headers: Mapping[str, str]
    parent_run_id: str | None = None
    error: str | None = None
    continued_as: str | None = None
    run_attempt: int = 1  # 1, then 2 after the run's first retry (`Client.retry`), ...


def ended(st: RunState, at_ms: int) -> RunEndedInput:
    """What the interceptors are told of the end of run ``st`` (at ``at_ms``)."""
    return RunEndedInput(
        st.run_id,
        st.workflow,
        st.version,
        str(st.status),
        st.started_at_ms,
        at_ms,
        st.headers,
        st.parent_run_id,
        st.error or st.reason,
        st.continued_as,
        st.retries + 1,
    )


def tell_ended(interceptors: Sequence[Interceptor], run: RunEndedInput) -> None:
    """Tell each interceptor of ``run``'s end; what one raises is logged, never raised."""
    for interceptor in interceptors:
        try:
            interceptor.run_ended(run)
        except Exception:  # theirs: never the engine's loop
            log.exception("interceptor %r failed on the end of run %s", interceptor, run.run_id)


# -- the chains ------------------------------------------------------------------------


class WorkflowInbound:
    """Into the workflow code. Subclass it, override what you need, call ``self.next``:
    one method per kind of call into a run (its execution, an activation, a signal, an
    update's handler, a live query's handler)."""

    def __init__(self, next: WorkflowInbound) -> None:
        self.next = next

    async def execute(self, input: ExecuteInput) -> Any:
        return await self.next.execute(input)

    def activate(self, input: ActivationInput) -> Any:
        """Runs the code; returns what the activation ended with (opaque: pass it on)."""
        return self.next.activate(input)

    def signal(self, input: SignalInput) -> Any:
        """Returns the payload the code gets."""
        return self.next.signal(input)

    async def update(self, input: UpdateInput) -> Any:
        """Runs the update's handler; returns its result."""
        return await self.next.update(input)

    def query(self, input: QueryInput) -> Any:
        """Runs the query's handler; returns its answer."""
        return self.next.query(input)


class WorkflowOutbound:
    """Out of the workflow code. Subclass it, override what you need, call ``self.next``."""

    def __init__(self, next: WorkflowOutbound) -> None:
        self.next = next

    async def step(self, input: StepInput) -> Any:
        return await self.next.step(input)

    async def child(self, input: ChildInput) -> Any:
        """The child's output (awaited), or its `ChildHandle`."""
        return await self.next.child(input)

    async def sleep(self, input: SleepInput) -> None:
        await self.next.sleep(input)

    async def entity_read(self, input: EntityReadInput) -> Any:
        """The shared handler's answer (`EntityRef.read`)."""
        return await self.next.entity_read(input)

    def continue_as_new(self, input: ContinueAsNewInput) -> NoReturn:
        self.next.continue_as_new(input)


class StepBody:
    """Around one attempt of a step body (in the thread that runs it). ``execute``
    returns the body's result or raises what it raised."""

    def __init__(self, next: StepBody) -> None:
        self.next = next

    def execute(self, input: StepBodyInput) -> Any:
        return self.next.execute(input)


class Interceptor:
    """Wraps the chains: return the link given (nothing to do), or yours around it."""

    def workflow_inbound(self, next: WorkflowInbound) -> WorkflowInbound:
        return next

    def workflow_outbound(self, next: WorkflowOutbound) -> WorkflowOutbound:
        return next

    def step_body(self, next: StepBody) -> StepBody:
        return next

    def run_ended(self, input: RunEndedInput) -> None:
        """Told once a run's end is committed (after the transaction: exactly once, unless
        the engine dies right between the commit and this call). Must not raise."""


L = TypeVar("L")


def chain(interceptors: Sequence[Interceptor], last: L, wrap: Callable[[Interceptor, L], L]) -> L:
    """``last`` wrapped by each interceptor, the first outermost."""
    link = last
    for i in reversed(interceptors):
        link = wrap(i, link)
    return link


def record_headers(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """``headers`` as Kafka record headers."""
    return [(k, v.encode()) for k, v in headers.items()]


def kafka_headers(raw: Sequence[tuple[str, bytes]]) -> dict[str, str]:
    """The interceptor headers a Kafka record carries: those not Runstream's own
    (`RESERVED_PREFIX`) whose value is UTF-8 text (a foreign producer's binary ones are
    left out, never a reason to refuse the record)."""
    out: dict[str, str] = {}
    for k, v in raw:
        if k.startswith(RESERVED_PREFIX):
            continue
        try:
            out[k] = v.decode()
        except UnicodeDecodeError:
            continue
    return out
