"""A durable entity's key as a client sees it (`Client.entity`; docs/guides/entities.md)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runstream.engine.entities import SHOW, call_input
from runstream.schemas.records import entity_call_id, entity_lock_id, entity_workflow

if TYPE_CHECKING:
    from runstream.client import Client
    from runstream.testing import Run, WorkflowTester


class EntityHandle:
    """Key ``key`` of entity ``name``: exclusive calls (`call`), shared reads (`read`) and
    what the key holds now (`show`)."""

    def __init__(self, client: Client, name: str, key: str) -> None:
        self._client, self.name, self.key = client, name, key

    def __repr__(self) -> str:
        return f"EntityHandle({self.name!r}, {self.key!r})"

    def call(
        self, handler: str, arg: Any = None, *, call_id: str | None = None, timeout: float = 30.0
    ) -> Any:
        """Call exclusive handler ``handler`` with ``arg`` and return its result, once
        the calls before it on this key are done. Idempotent by ``call_id`` (default: a
        new one): the same id again is the same call (run once, its first result). Raises
        what `Client.result` raises: `RunFailed` if the handler raised (the state is then
        unchanged), `RunCancelled`, `RunRejected` (a call cycle, a malformed call),
        `TimeoutError`."""
        run_id = self.start(handler, arg, call_id=call_id)
        return self._client.result(run_id, timeout=timeout)["result"]

    def start(self, handler: str, arg: Any = None, *, call_id: str | None = None) -> str:
        """Send the call and return its run's id at once (`Client.result` waits for it:
        its output is ``{"result": ..., "state": ...}``)."""
        run_id = self.call_run_id(call_id or uuid.uuid4().hex)
        call = call_input(self.key, handler, arg)
        self._client.start(entity_workflow(self.name), call, run_id=run_id)
        return run_id

    def call_run_id(self, call_id: str) -> str:
        """The id of the run of call ``call_id``."""
        c = self._client
        return entity_call_id(self.name, self.key, call_id, c.partition_of)

    def read(
        self,
        handler: str,
        arg: Any = None,
        *,
        timeout: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """What shared handler ``handler`` returns for ``arg`` on the key's state as last
        committed, answered by the key's owner at once (never behind an exclusive call).
        The handler reads ``headers`` as ``ctx.headers``. Raises `QueryFailed` (no such
        handler, it raised) or `OwnerUnavailable`."""
        return self._ask(handler, arg, timeout, headers)

    def show(self, *, timeout: float = 5.0) -> dict[str, Any]:
        """The key's state, the call in progress and the calls queued (run ids), from its
        owner: ``{"entity", "key", "state", "in_progress", "waits_on", "queue"}``
        (``waits_on``: call run id -> its open operations, e.g. ``["step reserve"]``)."""
        answer: dict[str, Any] = self._ask(SHOW, None, timeout)
        return answer

    def _ask(
        self, handler: str, arg: Any, timeout: float, headers: Mapping[str, str] | None = None
    ) -> Any:
        asked = {"entity": self.name, "key": self.key, "arg": arg}
        lock = entity_lock_id(self.name, self.key)
        return self._client.query(lock, handler, asked, timeout=timeout, headers=headers)


class TestEntity:
    """An entity's key in a `runstream.testing.WorkflowTester` (`WorkflowTester.entity`):
    the same calls as `EntityHandle`, decided by the core at once."""

    __test__ = False  # not a pytest test class

    def __init__(self, tester: WorkflowTester, name: str, key: str) -> None:
        self._tester, self.name, self.key = tester, name, key

    def start(self, handler: str, arg: Any = None, *, call_id: str | None = None) -> Run:
        """Send the call and let it run until it ends or waits (a sleep: `advance`)."""
        t = self._tester
        call_id = call_id or t._next_id("call")
        run_id = entity_call_id(self.name, self.key, call_id)
        call = call_input(self.key, handler, arg)
        return t.start(entity_workflow(self.name), call, run_id=run_id)

    def call(self, handler: str, arg: Any = None, *, call_id: str | None = None) -> Any:
        """Call exclusive handler ``handler``; its result. Raises as `Run.result` does
        (`RunNotFinished` while it waits: the key's earlier call, or a sleep)."""
        return self.start(handler, arg, call_id=call_id).result()["result"]

    def read(
        self, handler: str, arg: Any = None, *, headers: Mapping[str, str] | None = None
    ) -> Any:
        """What shared handler ``handler`` returns for ``arg`` (it reads ``headers`` as
        ``ctx.headers``). Raises `QueryFailed`."""
        return self._ask(handler, arg, headers)

    def show(self) -> dict[str, Any]:
        """The key's state, the call in progress and the calls queued."""
        answer: dict[str, Any] = self._ask(SHOW, None)
        return answer

    def _ask(self, handler: str, arg: Any, headers: Mapping[str, str] | None = None) -> Any:
        asked = {"entity": self.name, "key": self.key, "arg": arg}
        lock = entity_lock_id(self.name, self.key)
        return self._tester.query(lock, handler, asked, headers=headers)
