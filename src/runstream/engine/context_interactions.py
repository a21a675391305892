"""The operations of a workflow's `Context` through which others talk to a running
run: durable promises, events set for readers, live query handlers, shared reads of
durable entities, and update handlers. `Context` inherits them; they use its seqs and
history through the few members declared on `Interactions`."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

from runstream.engine import payload
from runstream.engine.interceptors import EntityReadInput, WorkflowOutbound
from runstream.engine.limits import Limits
from runstream.engine.requests import EntityRead, PromiseWait, Recorded, Suspend
from runstream.engine.state import RunState
from runstream.engine.update_handlers import UpdateHandler, UpdateHandlers
from runstream.engine.workflow import seconds
from runstream.errors import (
    EventRefused,
    PromiseRejected,
    PromiseTimeout,
    QueryFailed,
    QueryTimeout,
)
from runstream.schemas.records import (
    PromiseCompleted,
    PromiseCreated,
    RunEventSet,
    SeqFact,
    entity_lock_id,
    promise_id,
)

#: The longest key of `Context.set_event`, in bytes of UTF-8 (a read model key holds it).
MAX_EVENT_KEY_BYTES = 255

#: A live query handler (`Context.query_handler`): called with the query's argument.
QueryHandler = Callable[..., Any]


class Promise:
    """A durable promise (`Context.promise`), named by ``id``: ``await promise`` gives
    the value it was resolved with, or raises `PromiseRejected` or `PromiseTimeout`.
    Awaiting it again gives the same outcome."""

    __slots__ = ("_ctx", "id", "seq")

    def __init__(self, ctx: Interactions, seq: int, pid: str) -> None:
        self._ctx, self.seq, self.id = ctx, seq, pid

    def __repr__(self) -> str:
        return f"<Promise {self.id!r}>"

    def __await__(self) -> Generator[Any, None, Any]:
        return self._ctx._outcome(self).__await__()


class Interactions:
    """Promises, events, queries, entity reads and update handlers of a `Context`."""

    run_id: str
    headers: dict[str, str]
    _state: RunState
    _now_ms: int
    _new: list[Recorded]
    _limits: Limits
    _queries: dict[str, QueryHandler]
    _keys: tuple[tuple[int, int], set[str]] | None
    _updates: UpdateHandlers
    _outbound: WorkflowOutbound

    if TYPE_CHECKING:  # the Context's own, which these operations use

        @property
        def is_replaying(self) -> bool: ...
        def _next(self) -> int: ...
        def _peek(self) -> int: ...
        def _opened_at(self, seq: int) -> int: ...
        def _recorded(self, seq: int, op: str) -> SeqFact | None: ...

    def promise(self, timeout: float | str | None = None) -> Promise:
        """A durable promise. Its ``id``, ``<run_id>/promise/<seq>``, is recorded in the
        decision that goes on to the code after this call, so a step that sends the id
        counts only once the id is on the journal (and a replay gives the same id).
        Anyone completes it, once: `Client.resolve` / `Client.reject`, ``runstream
        promise resolve|reject``, or a plain `CompletePromise` record; a completion that
        comes before the workflow awaits it is kept. ``timeout`` (from now) completes it
        as timed out if nobody did by then: its await raises `PromiseTimeout`, and a
        later completion is refused."""
        secs = None if timeout is None else seconds(timeout)
        seq = self._next()
        pid = promise_id(self.run_id, seq)
        if self._recorded(seq, "promise") is None:
            due = None if secs is None else self._now_ms + int(secs * 1000)
            self._new.append(
                PromiseCreated(
                    self.run_id, self._now_ms, seq=seq, promise_id=pid, timeout_at_ms=due
                )
            )
        return Promise(self, seq, pid)

    async def _outcome(self, promise: Promise) -> Any:
        """What awaiting ``promise`` gives: its outcome once recorded (no seq of its own:
        the promise's completion, or its timeout, is the one fact that settles it)."""
        if self._updates.current is None:  # an await takes no seq, but the code may wait here
            self._updates.point()
        fact = self._recorded(promise.seq, "promise")
        while not isinstance(fact, PromiseCompleted):
            await Suspend(PromiseWait(promise.seq))
            fact = self._recorded(promise.seq, "promise")
        if fact.timed_out:
            raise PromiseTimeout(promise.id, fact.error or f"promise {promise.id!r} timed out")
        if fact.error is not None:
            raise PromiseRejected(promise.id, fact.error)
        return payload.loads(fact.value or b"null")

    def set_event(self, key: str, value: Any = None) -> None:
        """Publish ``value`` under ``key`` for readers outside the run: a fact in the
        journal (a replay does not record it again) and a ``run.event_set`` event on the
        lifecycle stream, which `Client.get_event` reads from the runs read model, with
        no engine needed. Setting a key again replaces its value. Raises `EventRefused`
        for a value larger than `Limits.event_value` bytes of JSON, or a new key past
        `Limits.event_keys` keys in this run."""
        seq = self._next()
        key = str(key)
        if self._recorded(seq, "set_event " + key) is not None:
            return
        if not 0 < len(key.encode()) <= MAX_EVENT_KEY_BYTES:
            raise EventRefused(f"an event key is 1 to {MAX_EVENT_KEY_BYTES} bytes, not {key!r}")
        data = payload.dumps(value)
        most = min(self._limits.event_value, self._limits.payload)
        if len(data) > most:
            raise EventRefused(
                f"ctx.set_event({key!r}): the value is {len(data):,} bytes of JSON; "
                f"the limit is {most:,} (Limits.event_value)"
            )
        keys = self._event_keys()
        if key not in keys and len(keys) >= self._limits.event_keys:
            raise EventRefused(
                f"ctx.set_event({key!r}): run {self.run_id!r} has set {len(keys)} keys, the "
                "limit (Limits.event_keys); set one of them again, or keep a dict in one key"
            )
        self._new.append(RunEventSet(self.run_id, self._now_ms, seq=seq, key=key, value=data))
        keys.add(key)

    def _event_keys(self) -> set[str]:
        """The keys this run has set so far (recorded, and earlier in this replay): read
        from the history once per state the code runs against, not once per call."""
        token = (id(self._state), self._state.facts)
        if self._keys is None or self._keys[0] != token:
            facts = [*self._state.resolved.values(), *self._new]
            self._keys = (token, {f.key for f in facts if isinstance(f, RunEventSet)})
        return self._keys[1]

    def query_handler(self, name: str) -> Callable[[QueryHandler], QueryHandler]:
        """Declare a live query handler, as a decorator, on a plain (not async) function:
        ``client.query(run_id, name, arg)`` calls it (with ``arg`` if it takes one) on the
        run's owner, on the workflow as replayed to its current state, and answers with
        what it returns (JSON). Handlers read the workflow's variables (a closure); they
        may not call durable operations, and a query never changes the journal. Declare
        them before the first wait so every query finds them."""

        def register(fn: QueryHandler) -> QueryHandler:
            if inspect.iscoroutinefunction(inspect.unwrap(fn)):
                raise TypeError(f"query handler {name!r} must be a plain def, not async")
            self._queries[name] = fn
            return fn

        return register

    async def _entity_read(
        self, entity: str, key: str, handler: str, arg: Any, timeout: float | str | None
    ) -> Any:
        """`EntityRef.read`, through the outbound interceptors."""
        seq = self._peek()
        call = EntityReadInput(
            self.run_id,
            seq,
            entity,
            key,
            handler,
            arg,
            None if timeout is None else seconds(timeout),
            self.headers,
            self._opened_at(seq),
            self.is_replaying,
            self._state.retries + 1,
        )
        return await self._outbound.entity_read(call)

    async def _read(self, call: EntityReadInput) -> Any:
        """A shared entity read: asked the first time, its answer (or its timeout) a fact
        (`PromiseCompleted`) a replay returns. Raises `QueryFailed` with the handler's
        error, `QueryTimeout` past ``call.timeout``."""
        seq = self._next()
        lock, pid = entity_lock_id(call.entity, call.key), promise_id(self.run_id, seq)
        asked = payload.dumps({"entity": call.entity, "key": call.key, "arg": call.arg})
        fact = self._recorded(seq, "promise")
        while not isinstance(fact, PromiseCompleted):
            read = EntityRead(seq, pid, lock, call.handler, asked, call.timeout, dict(call.headers))
            await Suspend(read)
            fact = self._recorded(seq, "promise")
        if fact.timed_out:
            what = f"{call.handler!r} of entity {call.entity!r} key {call.key!r}"
            raise QueryTimeout(f"no answer of {what} within {call.timeout} s")
        if fact.error is not None:
            raise QueryFailed(fact.error)
        return payload.loads(fact.value or b"null")

    def update_handler(
        self,
        name: str,
        fn: Callable[[Any], Awaitable[Any]] | None = None,
        *,
        validator: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Handle updates ``name`` (`Client.update`) with ``fn(arg)``, an ``async def``
        that may await steps, sleeps and waits like workflow code and whose return value
        is the update's result. ``validator(arg)``, a plain function, runs first on the
        run's current state inside the engine's decision: if it raises, the update is
        rejected with its error and leaves no trace in the history. Used as a decorator
        without ``fn``. Register handlers before the workflow's first durable call, so a
        run can take updates as soon as it starts (update-with-start)."""

        def register(f: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
            self._updates.registered[name] = UpdateHandler(name, f, validator)
            return f

        return register if fn is None else register(fn)
