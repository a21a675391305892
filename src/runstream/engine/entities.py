"""Durable entities, keyed actors (`App.entity`; docs/guides/entities.md).

An entity ``cart`` has handlers and, per key, a state: a JSON object of named entries
(`EntityState`). It is built from what the engine already has:

- each exclusive call is a run of the hidden workflow ``entity:cart``
  (`records.entity_workflow`), idempotent by its run id (`records.entity_call_id`);
- the runs of one key share a concurrency limit of one permit (``concurrency_key`` is the
  key): the limit entity ``~limit/entity:cart/<key>`` (`records.entity_lock_id`) queues
  them in the order their requests reach its partition and lets one run at a time;
- that limit also keeps the key's state: a grant gives it to the call (`Grant.value`,
  recorded as `PermitReceived.value`), and the call's end gives the new state back with
  the permit (`Release.value`, recorded as `PermitReleased.value`). A call that fails,
  is cancelled or times out gives the permit back with no state: it changes nothing.

A shared handler reads the state the limit holds, on its owner, inside the decision
(`rules.entities.shared`): it never waits behind an exclusive call and records nothing.
A workflow's read (`EntityRef.read`) is the same call, its answer recorded in the
workflow's journal as the outcome of a promise (`rules.entities.ask`).

A call cycle is refused at its start (`CallCycle`): each call carries the chain of keys
its callers hold, in its input; a workflow started by a handler (a child that ends with
it) carries the chain in a header (`CHAIN_HEADER`), and passes it to its own children
and calls.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from runstream.engine import payload
from runstream.engine.workflow import WorkflowDef, workflow_def
from runstream.schemas.records import entity_workflow

if TYPE_CHECKING:
    from runstream.engine.workflow_context import Context

F = TypeVar("F", bound=Callable[..., Any])

#: The name of the built-in shared handler that tells the state, the call in progress and
#: the queue (`runstream entities show`).
SHOW = "~show"

#: The most a key's state may take, as JSON: it rides inline in its lock's records
#: (Grant, Release), which large payloads never split.
ENTITY_STATE_MAX_BYTES = 256 * 1024


#: The run header that carries the keys held by the entity calls a workflow was started
#: by (JSON ``[[entity, key], ...]``), so that a call it makes to one of them is refused
#: as a cycle. Runs' headers go to their children (not to abandoned ones: they may
#: outlive the call and take the key in their turn).
CHAIN_HEADER = "runstream-entity-chain"


class CallCycle(Exception):
    """An exclusive call would wait for a key its own chain of callers holds."""


def chain_of(headers: Mapping[str, str]) -> list[list[str]]:
    """The keys a run's callers hold (`CHAIN_HEADER`); none if absent or malformed."""
    try:
        chain = json.loads(headers.get(CHAIN_HEADER, "[]"))
    except ValueError:
        return []
    ok = isinstance(chain, list) and all(
        isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in chain
    )
    return chain if ok else []


class EntityState:
    """A key's durable state: named JSON values. Changes count when the call returns."""

    def __init__(self, entries: dict[str, Any], *, writable: bool = True) -> None:
        self._entries = entries
        self._writable = writable

    def get(self, name: str, default: Any = None) -> Any:
        """The value of entry ``name`` (a copy: change it with `set`), or ``default``."""
        return copy.deepcopy(self._entries.get(name, default))

    def set(self, name: str, value: Any) -> None:
        """Set entry ``name`` (a JSON value)."""
        self._check()
        self._entries[name] = copy.deepcopy(value)

    def clear(self, name: str | None = None) -> None:
        """Clear entry ``name``, or every entry."""
        self._check()
        if name is None:
            self._entries.clear()
        else:
            self._entries.pop(name, None)

    def keys(self) -> list[str]:
        """The names of the entries set."""
        return sorted(self._entries)

    def _check(self) -> None:
        if not self._writable:
            raise TypeError("a shared handler reads the state; only an exclusive one changes it")


def load_state(data: bytes | None) -> dict[str, Any]:
    """The entries of a state as the limit keeps it (None: the key never had one)."""
    value = payload.loads(data) if data else {}
    return value if isinstance(value, dict) else {}


class EntityContext:
    """What an exclusive handler gets: the key, its state, and the workflow's durable
    operations (its steps and sleeps are the call run's)."""

    def __init__(self, ctx: Context, name: str, key: str, state: EntityState, chain: list[Any]):
        self.name, self.key, self.state = name, key, state
        self._ctx = ctx
        self._chain = chain

    @property
    def run_id(self) -> str:
        """The id of the call's run."""
        return self._ctx.run_id

    @property
    def is_replaying(self) -> bool:
        """`Context.is_replaying` of the call's run."""
        return self._ctx.is_replaying

    @property
    def headers(self) -> dict[str, str]:
        """The call run's headers (the caller's: `Client.start`'s, or the calling
        workflow's): read them, don't change them."""
        return self._ctx.headers

    async def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`Context.step`: a durable step of the call's run."""
        return await self._ctx.step(fn, *args, **kwargs)

    async def sleep(self, duration: float | str) -> None:
        """`Context.sleep`: a durable timer (the key stays locked meanwhile)."""
        await self._ctx.sleep(duration)

    def now(self) -> datetime:
        """`Context.now`."""
        return self._ctx.now()

    def uuid(self) -> str:
        """`Context.uuid`."""
        return self._ctx.uuid()

    def random(self) -> float:
        """`Context.random`."""
        return self._ctx.random()

    async def child(self, workflow: Callable[..., Any] | str, input: Any = None) -> Any:
        """`Context.child`: a child run, awaited. It carries the keys this call holds
        (`CHAIN_HEADER`): a call it makes to one of them is refused as a cycle."""
        return await self._ctx.child(workflow, input)

    async def start_child(
        self,
        workflow: Callable[..., Any] | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        parent_close: str = "request_cancel",
    ) -> Any:
        """`Context.start_child`: a child run, not awaited. Unless ``abandon``ed (then it
        may outlive the call), it carries the keys this call holds, as `child` does."""
        return await self._ctx.start_child(
            workflow, input, run_id=run_id, parent_close=parent_close
        )

    def entity(self, name: str, key: str) -> EntityRef:
        """Another entity's key: a call to it carries this key, so a cycle fails fast."""
        return EntityRef(self._ctx, name, key, self._chain)


@dataclass(frozen=True)
class SharedContext:
    """What a shared handler gets: the key, a read-only view of its state, and the
    caller's headers (a client's `EntityHandle.read`, or the reading workflow's outbound
    interceptors')."""

    name: str
    key: str
    state: EntityState
    headers: dict[str, str] = field(default_factory=dict)


class EntityRef:
    """An entity's key, as seen from a workflow (`Context.entity`)."""

    def __init__(self, ctx: Context, name: str, key: str, chain: Iterable[Any] = ()) -> None:
        self._ctx, self._name, self._key, self._chain = ctx, name, key, list(chain)

    async def call(self, handler: str, arg: Any = None) -> Any:
        """Call exclusive handler ``handler`` and return its result: a child run of the
        caller (journaled: a replay returns the recorded result, never calls twice).
        Raises `ChildFailed` if the handler raised or the call could not start."""
        call = call_input(self._key, handler, arg, self._chain)
        out = await self._ctx.child(entity_workflow(self._name), call)
        return out["result"]

    async def read(self, handler: str, arg: Any = None, timeout: float | str | None = None) -> Any:
        """What shared handler ``handler`` returns for ``arg`` on the key's state as last
        committed (never behind an exclusive call), recorded in the journal the first
        time: a replay returns the recorded answer, never asks again. The ask waits in
        the log while the key's partition has no owner, up to ``timeout`` (seconds or
        ``"30s"``; None: as long as it takes). Raises `QueryFailed` if the handler raised
        or does not exist, `QueryTimeout` if no answer came by the timeout (the run may
        catch either, or fails)."""
        return await self._ctx._entity_read(self._name, self._key, handler, arg, timeout)


def call_input(key: str, handler: str, arg: Any, chain: Iterable[Any] = ()) -> dict[str, Any]:
    """The input of an exclusive call's run."""
    return {"key": key, "handler": handler, "arg": arg, "chain": list(chain)}


@dataclass
class EntityDef:
    """A registered entity: its exclusive and shared handlers."""

    name: str
    exclusive: dict[str, Callable[..., Awaitable[Any]]] = field(default_factory=dict)
    shared: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def workflow(self) -> WorkflowDef:
        """The hidden workflow whose runs are this entity's exclusive calls."""

        async def call(ctx: Context, call: dict[str, Any]) -> dict[str, Any]:
            handler = self.exclusive.get(call.get("handler", ""))
            if handler is None:
                known = ", ".join(sorted(self.exclusive)) or "none"
                raise LookupError(
                    f"entity {self.name!r} has no exclusive handler {call.get('handler')!r} "
                    f"(it has: {known})"
                )
            key = call["key"]
            state = EntityState(load_state(ctx._state.permit_value))
            chain = [*call.get("chain", []), [self.name, key]]
            ctx.headers[CHAIN_HEADER] = json.dumps(chain)  # to the children it starts
            ectx = EntityContext(ctx, self.name, key, state, chain)
            result = await handler(ectx, call.get("arg"))
            size = len(payload.dumps(state._entries))
            if size > ENTITY_STATE_MAX_BYTES:  # it travels inline with the lock's records
                raise ValueError(
                    f"entity state of {self.name!r} key {key!r} would be {size} bytes, over "
                    f"its cap of {ENTITY_STATE_MAX_BYTES}: keep large values in steps' "
                    "outputs or elsewhere, and their ids in the state"
                )
            return {"result": result, "state": state._entries}

        return workflow_def(call, name=entity_workflow(self.name), concurrency_key=self._lock_key)

    def _lock_key(self, call: Any) -> str:
        """The key of a call's lock; raises (the start is refused) for a malformed call or
        one that waits for a key its callers hold (it would wait forever)."""
        if not isinstance(call, dict) or not isinstance(call.get("key"), str):
            raise ValueError(f"a call to entity {self.name!r} needs a text key: {call!r}")
        key: str = call["key"]
        chain = call.get("chain", [])
        if [self.name, key] in chain:
            path = " -> ".join(f"{n}[{k!r}]" for n, k in [*chain, [self.name, key]])
            raise CallCycle(f"call cycle: {path} (the first holds the key the last waits for)")
        return key

    def call_shared(
        self,
        handler: str,
        key: str,
        entries: dict[str, Any],
        arg: Any,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Run shared handler ``handler`` on a key's state (a read: no change counts),
        with the caller's ``headers``."""
        fn = self.shared.get(handler)
        if fn is None:
            known = ", ".join(sorted(self.shared)) or "none"
            raise LookupError(
                f"entity {self.name!r} has no shared handler {handler!r} (it has: {known})"
            )
        state = EntityState(entries, writable=False)
        result = fn(SharedContext(self.name, key, state, dict(headers or {})), arg)
        if inspect.iscoroutine(result):
            try:
                result.send(None)
            except StopIteration as done:
                return done.value
            result.close()
            raise TypeError(f"shared handler {handler!r} awaited something: it may only read")
        return result


def shared(fn: F) -> F:
    """Mark an entity's handler as shared: read-only, concurrent, never queued. (Under
    ``@staticmethod``, which keeps type checkers content with handlers that take no
    ``self``.)"""
    fn.__runstream_shared__ = True  # type: ignore[attr-defined]
    return fn


def entity_def(name: str, handlers: Iterable[tuple[str, Callable[..., Any]]]) -> EntityDef:
    """An entity's definition from its handlers (`App.entity`): a function marked
    `shared` is shared; every other ``async def`` is exclusive."""
    edef = EntityDef(name)
    for hname, fn in handlers:
        if getattr(fn, "__runstream_shared__", False):
            edef.shared[hname] = fn
        elif inspect.iscoroutinefunction(fn):
            edef.exclusive[hname] = fn
    if not (edef.exclusive or edef.shared):
        raise TypeError(f"entity {name!r} has no handlers (async def functions)")
    return edef
