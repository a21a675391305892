"""The `Context` a workflow gets as its first argument: its durable operations.

Each durable call on the `Context` takes the next sequence number. If the history
settled that number, the call returns the recorded result without doing anything;
the first call without a recorded result suspends the workflow by awaiting a `Suspend`
with its request (`engine.requests`), which its driver (`engine.replay`) gets out of
the coroutine. Calls go through the interceptors' outbound links (`_Outbound` is the
last). The update handlers a workflow registers run here too, with seqs of their own.
The operations that let others talk to the run (promises, events, queries, entity reads,
update handlers) are `context_interactions.Interactions`, which `Context` inherits.

Not to be confused with `engine.rules.context`, what the engine's rules share.
"""

from __future__ import annotations

import os
import random as _random
import uuid as _uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from runstream.engine import payload
from runstream.engine.context_interactions import (
    Interactions,
    QueryHandler,
)
from runstream.engine.entities import CHAIN_HEADER, EntityRef, chain_of
from runstream.engine.interceptors import (
    ChildInput,
    ContinueAsNewInput,
    EntityReadInput,
    SignalInput,
    SleepInput,
    StepInput,
    WorkflowInbound,
    WorkflowOutbound,
    chain,
)
from runstream.engine.limits import Limits
from runstream.engine.requests import (
    PARENT_CLOSE,
    Abort,
    ChildCall,
    ChildHandle,
    Compensation,
    ContinuedAsNew,
    EventWait,
    NonDeterministic,
    Recorded,
    SignalWait,
    SleepCall,
    StepCall,
    Suspend,
    recorded_op,
)
from runstream.engine.settled import Settled
from runstream.engine.state import RunState
from runstream.engine.update_handlers import UpdateHandlers
from runstream.engine.workflow import Registry, seconds
from runstream.errors import (
    ChildFailed,
    EventTimeout,
    NonDeterminismError,
    SignalTimeout,
    StepError,
)
from runstream.schemas.records import (
    ChildEnded,
    ChildStarted,
    EventReceived,
    EventTimedOut,
    SeqFact,
    SignalReceived,
    SignalTimedOut,
    StepCompleted,
    StepFailed,
    TimerFired,
    ValueRecorded,
)


class Context(Interactions):
    """What a workflow gets as its first argument: the durable operations.

    Each operation takes the next sequence number of the run; on replay it returns what
    the run's history recorded for that number. Keep workflow code deterministic: use
    `now`, `uuid` and `random` rather than the clock or `random`, and do I/O in steps.
    """

    def __init__(
        self, state: RunState, registry: Registry, now_ms: int, limits: Limits | None = None
    ) -> None:
        self.run_id = state.run_id
        self.workflow = state.workflow
        self.version = state.version
        self._state = state
        self._registry = registry
        self._now_ms = now_ms
        self._seq = 0
        self._new: list[Recorded] = []
        self._compensations: list[Compensation] = []
        self._limits = limits or Limits()
        self._queries: dict[str, QueryHandler] = {}
        self._querying = False  # a query handler runs: no durable operation may
        self._keys: tuple[tuple[int, int], set[str]] | None = None  # (state, its keys)
        #: Text headers the run carries (`runstream.interceptors`): read them, don't change.
        self.headers: dict[str, str] = dict(state.headers)
        self._settled = Settled(0)  # what was settled before this activation
        interceptors = registry.interceptors
        last: WorkflowOutbound = _Outbound(self)
        self._outbound = chain(interceptors, last, lambda i, n: i.workflow_outbound(n))
        self._inbound: WorkflowInbound = _NoInbound()  # bound by its _Live
        self._updates = UpdateHandlers(self)

    @property
    def is_replaying(self) -> bool:
        """The code is re-running what an earlier activation of this run already got past
        (a replay from the start after a restart or a cache miss, on any instance): do no
        side effect meant to happen once (logging, spans) while it is True."""
        settled = self._settled
        if self._updates.current is not None:  # a handler's next operation: its own seqs
            return settled.everything or self._updates.peek() in settled.handlers
        return self._seq < settled.below

    def _opened_at(self, seq: int) -> int:
        """When the operation at ``seq`` began: its open fact's time, or now (it begins)."""
        fact = self._state.pending.get(seq) or self._state.resolved.get(seq)
        return fact.at_ms if fact is not None else self._now_ms

    # -- durable operations ------------------------------------------------------
    async def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        compensate: Callable[..., Any] | None = None,
        priority: int = 0,
        fairness: str = "",
    ) -> Any:
        """Run ``fn(*args)`` once, durably; on replay return its recorded result.

        ``compensate`` (called with the same arguments) is registered once the step
        succeeds, and runs if the workflow later fails or is cancelled with compensation.
        Raises `StepError` when the step failed after its retries.

        For a step whose queue has a limit (`App.limit`), ``priority`` (higher first) and
        ``fairness`` (a key such as a tenant: round robin between keys) order the wait.
        """
        sd = self._registry.step(fn)
        seq = self._peek()
        call = StepInput(
            self.run_id,
            seq,
            sd.name,
            args,
            dict(self.headers),
            sd.policy.group,
            self._opened_at(seq),
            self.is_replaying,
            compensate,
            priority,
            str(fairness),
            run_attempt=self._state.retries + 1,
        )
        return await self._outbound.step(call)

    async def _step(self, call: StepInput) -> Any:
        sd = self._registry.step_by_name(call.name)
        seq, args = self._next(), call.args
        fact = self._recorded(seq, "step " + sd.name)
        while not isinstance(fact, StepCompleted | StepFailed) or (
            isinstance(fact, StepFailed) and fact.retry_at_ms is not None
        ):
            await Suspend(StepCall(seq, sd, args, call.priority, call.fairness, call.headers))
            fact = self._recorded(seq, "step " + sd.name)  # resumed: settled now?
        call.attempt = fact.attempt
        if isinstance(fact, StepFailed):
            raise StepError(sd.name, fact.error)
        assert isinstance(fact, StepCompleted)
        if call.compensate is not None:
            undo = self._registry.step(call.compensate)
            self._compensations.append(Compensation(seq, undo, args))
        value = payload.loads(fact.output)
        return sd.output.validate_python(value) if sd.output is not None else value

    async def sleep(self, duration: float | str) -> None:
        """Sleep durably: seconds, or a string such as "5s", "10m", "1d"."""
        secs, seq = seconds(duration), self._peek()
        call = SleepInput(
            self.run_id,
            seq,
            secs,
            self.headers,
            self._opened_at(seq),
            self.is_replaying,
            self._state.retries + 1,
        )
        await self._outbound.sleep(call)

    async def _sleep(self, call: SleepInput) -> None:
        seq = self._next()
        while not isinstance(self._recorded(seq, "sleep"), TimerFired):
            await Suspend(SleepCall(seq, call.seconds))

    async def wait_for_signal(self, name: str, timeout: float | str | None = None) -> Any:
        """The payload of the next signal ``name`` sent to this run (buffered if it came
        earlier). Raises `SignalTimeout` when ``timeout`` passes first."""
        secs = None if timeout is None else seconds(timeout)
        replaying, seq = self.is_replaying, self._next()
        since = self._opened_at(seq)
        fact = self._recorded(seq, "signal " + name)
        while not isinstance(fact, SignalReceived | SignalTimedOut):
            await Suspend(SignalWait(seq, name, secs))
            fact = self._recorded(seq, "signal " + name)
        if isinstance(fact, SignalTimedOut):
            raise SignalTimeout(f"no signal {name!r} for run {self.run_id!r} within {timeout}")
        assert isinstance(fact, SignalReceived)
        value = payload.loads(fact.payload)
        got = SignalInput(
            self.run_id,
            seq,
            name,
            value,
            self.headers,
            since,
            fact.at_ms,
            replaying,
            self._state.retries + 1,
        )
        return self._inbound.signal(got)

    async def wait_for_event(
        self, name: str, key: str = "", timeout: float | str | None = None
    ) -> Any:
        """The payload of the next event ``name`` published with correlation ``key``
        (`Client.publish`): one published before the wait is received if still within its
        time to live. Each event comes once to each wait; in a loop, in publish order.
        Raises `EventTimeout` when ``timeout`` passes first."""
        secs = None if timeout is None else seconds(timeout)
        seq = self._next()
        fact = self._recorded(seq, "event " + name)
        while not isinstance(fact, EventReceived | EventTimedOut):
            await Suspend(EventWait(seq, name, key, secs))
            fact = self._recorded(seq, "event " + name)
        if isinstance(fact, EventTimedOut):
            raise EventTimeout(f"no event {name!r} (key {key!r}) within {timeout}")
        return payload.loads(fact.payload)

    async def child(
        self, workflow: Callable[..., Any] | str, input: Any = None, *, run_id: str | None = None
    ) -> Any:
        """Run ``workflow`` as a child run and return its output once it completes.

        The child's id is ``run_id``, by default ``<this run>/<seq>``: a replay never
        starts a second one. Raises `ChildFailed` if the child fails, is cancelled, dies
        or cannot start (an unknown workflow, an invalid input): the parent may catch it.
        """
        return await self._outbound.child(
            self._child_input(workflow, input, run_id, True, "request_cancel")
        )

    def _child_input(
        self,
        workflow: Callable[..., Any] | str,
        input: Any,
        run_id: str | None,
        awaited: bool,
        parent_close: str,
    ) -> ChildInput:
        name, seq = self._registry.workflow_name(workflow), self._peek()
        headers = dict(self.headers)
        if parent_close == "abandon":  # it may outlive an entity call that started it
            headers.pop(CHAIN_HEADER, None)
        return ChildInput(
            self.run_id,
            seq,
            name,
            input,
            run_id,
            awaited,
            parent_close,
            headers,
            self._opened_at(seq),
            self.is_replaying,
            self._state.retries + 1,
        )

    async def _child(self, c: ChildInput) -> Any:
        if not c.awaited:
            return await self._start_child(c)
        call = self._child_call(c)
        fact = self._recorded(call.seq, f"child {call.workflow}")
        while not isinstance(fact, ChildEnded):
            await Suspend(call)
            fact = self._recorded(call.seq, f"child {call.workflow}")
        if fact.status != "completed":
            raise ChildFailed(fact.child_run_id, fact.status, fact.error or "")
        return payload.loads(fact.output or b"null")

    async def start_child(
        self,
        workflow: Callable[..., Any] | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        parent_close: str = "request_cancel",
    ) -> ChildHandle:
        """Start ``workflow`` as a child run without waiting for it. ``parent_close``: if
        this run ends first, ``request_cancel`` the child (with its compensations),
        ``terminate`` it (without), or ``abandon`` it. Raises `ChildFailed` if it cannot
        start."""
        if parent_close not in PARENT_CLOSE:
            raise ValueError(f"parent_close must be one of {PARENT_CLOSE}, not {parent_close!r}")
        handle = await self._outbound.child(
            self._child_input(workflow, input, run_id, False, parent_close)
        )
        assert isinstance(handle, ChildHandle)
        return handle

    async def _start_child(self, c: ChildInput) -> ChildHandle:
        call = self._child_call(c)
        fact = self._recorded(call.seq, f"child {call.workflow}")
        while fact is None:
            await Suspend(call)
            fact = self._recorded(call.seq, f"child {call.workflow}")
        if isinstance(fact, ChildEnded):  # it could not start
            raise ChildFailed(fact.child_run_id, fact.status, fact.error or "")
        assert isinstance(fact, ChildStarted)
        return ChildHandle(fact.child_run_id)

    def _child_call(self, c: ChildInput) -> ChildCall:
        seq = self._next()
        child_id = c.child_run_id or f"{self.run_id}/{seq}"
        data = payload.dumps(c.input)
        return ChildCall(seq, c.workflow, data, child_id, c.awaited, c.parent_close, c.headers)

    def now(self) -> datetime:
        """The time, recorded on first execution so replays see the same value."""
        return datetime.fromtimestamp(self._value("now", lambda: self._now_ms) / 1000, UTC)

    def uuid(self) -> str:
        """A random UUID (hex with dashes), recorded on first execution."""
        return str(self._value("uuid", lambda: str(_uuid.uuid4())))

    def random(self) -> float:
        """A random float in [0, 1), recorded on first execution."""
        return float(self._value("random", lambda: _random.Random(os.urandom(16)).random()))

    def entity(self, name: str, key: str) -> EntityRef:
        """Key ``key`` of durable entity ``name`` (`App.entity`):
        ``await ctx.entity("cart", key).call("add", item)`` is a journaled call."""
        return EntityRef(self, name, key, chain_of(self.headers))

    def continue_as_new(self, input: Any = None) -> None:
        """End this run and start ``<run_id>~N`` with ``input`` and a fresh history."""
        call = ContinueAsNewInput(
            self.run_id, input, dict(self.headers), self.is_replaying, self._state.retries + 1
        )
        self._outbound.continue_as_new(call)

    # -- internals ---------------------------------------------------------------
    def _peek(self) -> int:
        """The seq the next operation will take (`_next`), for the interceptors' inputs."""
        return self._seq + 1 if self._updates.current is None else self._updates.peek()

    def _next(self) -> int:
        if self._querying:
            raise RuntimeError(
                "a query handler may not call durable operations (ctx.step, ctx.set_event, "
                "ctx.now, ...): a query never changes the run"
            )
        if self._updates.validating:
            raise RuntimeError(
                "an update validator may not call durable operations (ctx.step, ctx.now, "
                "...): it only reads the workflow's state; do the work in the handler"
            )
        if self._updates.current is not None:  # an update handler's operation
            return self._updates.next()
        self._seq += 1
        self._updates.point()
        return self._seq

    def _recorded(self, seq: int, op: str) -> SeqFact | None:
        fact = self._state.resolved.get(seq) or self._state.pending.get(seq)
        if fact is None:
            for new in self._new:  # values recorded earlier in this same replay
                if new.seq == seq:
                    fact = new
        if fact is not None and (got := recorded_op(fact)) not in (op, op.partition(" ")[0]):
            raise Abort(NonDeterministic(NonDeterminismError(self.run_id, seq, got, op)))
        return fact

    def _value(self, name: str, make: Callable[[], Any]) -> Any:
        seq = self._next()
        fact = self._recorded(seq, "value " + name)
        if fact is None:
            fact = ValueRecorded(
                self.run_id, self._now_ms, seq=seq, name=name, value=payload.dumps(make())
            )
            self._new.append(fact)
        assert isinstance(fact, ValueRecorded)
        return payload.loads(fact.value)


class _Outbound(WorkflowOutbound):
    """The last outbound link: the operations themselves."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def step(self, input: StepInput) -> Any:
        return await self._ctx._step(input)

    async def child(self, input: ChildInput) -> Any:
        return await self._ctx._child(input)

    async def sleep(self, input: SleepInput) -> None:
        await self._ctx._sleep(input)

    async def entity_read(self, input: EntityReadInput) -> Any:
        return await self._ctx._read(input)

    def continue_as_new(self, input: ContinueAsNewInput) -> NoReturn:
        raise Abort(ContinuedAsNew(input.input, input.headers))


class _NoInbound(WorkflowInbound):
    """Before a context is bound to its coroutine (`_Live`): a signal passes as is."""

    def __init__(self) -> None:
        pass

    def signal(self, input: SignalInput) -> Any:
        return input.payload
