"""`Client`: start, signal, cancel and ask about runs, over Kafka only.

Commands go to ``<ns>.commands`` on the partition Kafka's murmur2 gives the run id,
like any other producer. Answers come back on ``<ns>.replies`` (point queries the
owning instance answers from its projection) and ``<ns>.lifecycle``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaException, Producer, TopicPartition
from pydantic import BaseModel

from runstream.config import client_config, resolve_bootstrap
from runstream.engine import payload
from runstream.errors import (
    CommandNotDelivered,
    RunCancelled,
    RunFailed,
    RunNotFound,
    TopicError,
)
from runstream.schemas.codec import Codec
from runstream.topics.consume import consume_ready
from runstream.topics.partitioner import partition_for
from runstream.topics.spec import Topics

TERMINAL = ("completed", "failed", "cancelled", "dead")
_RECENT = 10_000  # terminal events remembered for result() calls that come later


class RunInfo(BaseModel):
    """A run as its owning instance knows it."""

    run_id: str
    status: str
    workflow: str
    version: str
    input: Any = None
    output: Any = None
    error: str | None = None
    reason: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    steps: int = 0


class Client:
    """Talks to a namespace's engine instances through Kafka. Thread-safe."""

    def __init__(self, namespace: str, bootstrap: str | None = None) -> None:
        self.namespace = namespace
        self.topics = Topics(namespace)
        self.bootstrap = resolve_bootstrap(bootstrap)
        self.client_id = f"client-{uuid.uuid4().hex}"
        self.codec = Codec.default()
        base = client_config(self.bootstrap)
        self._producer = Producer(
            {**base, "enable.idempotence": True, "linger.ms": 0, "partitioner": "murmur2_random"}
        )
        self._partitions = self._partition_count(self.topics.commands)
        self._reply_partitions = self._partition_count(self.topics.replies)
        self._lock = threading.RLock()
        self._listener: Consumer | None = None
        self._listening: set[int] = set()  # lifecycle partitions assigned
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()  # run id -> terminal
        self._replies: dict[str, dict[str, Any]] = {}
        self._undelivered: list[str] = []  # commands Kafka refused, not yet reported

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._producer.flush(10)
        self._raise_undelivered()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # -- commands --------------------------------------------------------------------
    def start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        run_id: str | None = None,
        version: str | None = None,
        tags: dict[str, str] | None = None,
        wait: bool = True,
    ) -> str:
        """Start a run and return its id. Idempotent by ``run_id``: starting an id that
        exists does nothing. ``wait=False`` returns before Kafka acknowledged it."""
        name = getattr(workflow, "__runstream_workflow__", workflow)
        if not isinstance(name, str):
            raise TypeError(f"{workflow!r} is not a registered workflow or a workflow name")
        run_id = run_id or uuid.uuid4().hex
        _check_run_id(run_id)
        self._send(
            run_id,
            "StartRun",
            {
                "run_id": run_id,
                "workflow": name,
                "input": payload.dumps(input),
                "version": version,
                "parent_run_id": None,
                "tags": tags or {},
                "sent_at_ms": _now_ms(),
            },
            wait,
        )
        return run_id

    def signal(
        self, run_id: str, name: str, value: Any = None, *, signal_id: str | None = None
    ) -> None:
        """Send signal ``name`` to a run; a signal id makes retries of this call count once."""
        self._send(
            run_id,
            "Signal",
            {
                "run_id": run_id,
                "name": name,
                "payload": payload.dumps(value),
                "signal_id": signal_id or uuid.uuid4().hex,
                "sent_at_ms": _now_ms(),
            },
        )

    def cancel(self, run_id: str, *, compensate: bool = False, reason: str = "") -> None:
        """Cancel a run (after its compensations if ``compensate``); a finished run stays."""
        self._send(
            run_id,
            "Cancel",
            {"run_id": run_id, "compensate": compensate, "reason": reason, "sent_at_ms": _now_ms()},
        )

    # -- questions -------------------------------------------------------------------
    def get_run(self, run_id: str, timeout: float = 10.0) -> RunInfo:
        """Ask the run's owner; raises RunNotFound if no such run exists."""
        with self._lock:
            info = self._ask(run_id, time.monotonic() + timeout, terminal=False)
        if info is None:
            raise TimeoutError(
                f"no answer about run {run_id!r} within {timeout}s (is an engine instance running?)"
            )
        if not info["found"]:
            raise RunNotFound(f"no run {run_id!r} in namespace {self.namespace!r}")
        return _run_info(info)

    def result(self, run_id: str, timeout: float = 30.0) -> Any:
        """The run's output once it ends (following continue-as-new); raises RunFailed,
        RunCancelled, or TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                end = self._ask(run_id, deadline, terminal=True)
                if end is None:
                    raise TimeoutError(f"run {run_id!r} did not finish within {timeout}s")
                status, reason = end["status"], end.get("reason") or ""
                if status == "completed":
                    if reason.startswith(_CONTINUED):
                        run_id = reason.removeprefix(_CONTINUED)
                        continue
                    return payload.loads(end["output"])
                if status == "cancelled":
                    raise RunCancelled(run_id, end.get("reason") or "")
                raise RunFailed(run_id, end.get("error") or end.get("reason") or "", status)

    # -- internals ---------------------------------------------------------------------
    def _send(self, run_id: str, name: str, rec: dict[str, Any], wait: bool = True) -> None:
        """Produce a command. With ``wait``, raise unless Kafka acknowledged it; without,
        a failed delivery is kept and raised by the next waiting call or `close()`."""
        p = partition_for(run_id.encode(), self._partitions)

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self._undelivered.append(f"{name} for run {run_id!r}: {err}")

        self._producer.produce(
            self.topics.commands,
            self.codec.encode(name, rec),
            run_id.encode(),
            partition=p,
            on_delivery=delivered,
        )
        if not wait:
            self._producer.poll(0)
            return
        if self._producer.flush(30) > 0:
            raise TimeoutError(f"Kafka at {self.bootstrap} did not take the {name} command")
        self._raise_undelivered()

    def _raise_undelivered(self) -> None:
        if self._undelivered:
            lost, self._undelivered = self._undelivered, []
            raise CommandNotDelivered(f"Kafka did not take {len(lost)} command(s): {lost[:5]}")

    def _ask(self, run_id: str, deadline: float, terminal: bool) -> dict[str, Any] | None:
        """Query the run's owner while listening to the run's lifecycle partition. Returns
        the answer (only a terminal one if ``terminal``), or None at the deadline."""
        self._listen(partition_for(run_id.encode(), self._partitions))
        request_id = uuid.uuid4().hex
        self._send(
            run_id,
            "Query",
            {"run_id": run_id, "request_id": request_id, "reply_to": self.client_id},
        )
        while True:
            end = self._recent.get(run_id) if terminal else None
            if end is not None:
                return end
            info = self._replies.pop(request_id, None)
            if info is not None and (not terminal or info["status"] in TERMINAL):
                return info
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._pump(min(remaining, 1.0))

    def _listen(self, lifecycle_partition: int) -> None:
        if self._listener is None:
            self._listener = Consumer(
                {
                    **client_config(self.bootstrap),
                    "group.id": self.client_id,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 5,
                }
            )
            p = partition_for(self.client_id.encode(), self._reply_partitions)
            self._listener.assign([self._from_end(self.topics.replies, p)])
        if lifecycle_partition not in self._listening:
            self._listener.incremental_assign(
                [self._from_end(self.topics.lifecycle, lifecycle_partition)]
            )
            self._listening.add(lifecycle_partition)

    def _from_end(self, topic: str, p: int) -> TopicPartition:
        # An explicit offset, not OFFSET_END: the position must be fixed before we ask,
        # or an answer that comes quickly could land before it and be missed.
        assert self._listener is not None
        try:
            _, high = self._listener.get_watermark_offsets(TopicPartition(topic, p), 10)
        except KafkaException:
            high = OFFSET_END
        return TopicPartition(topic, p, high)

    def _pump(self, timeout: float) -> None:
        assert self._listener is not None
        for msg in consume_ready(self._listener, timeout):
            if msg.error() is not None:
                continue
            name, rec = self.codec.decode(msg.value())
            if name == "RunInfo":
                self._replies[rec["request_id"]] = rec
            elif name == "LifecycleEvent" and rec["type"] in _TERMINAL_EVENTS:
                rec["status"] = rec["type"].removeprefix("run.")
                self._recent[rec["run_id"]] = rec
                if len(self._recent) > _RECENT:
                    self._recent.popitem(last=False)

    def _partition_count(self, topic: str) -> int:
        md = self._producer.list_topics(topic, timeout=30).topics.get(topic)
        if md is None or md.error is not None or not md.partitions:
            raise TopicError(
                f"topic {topic!r} does not exist: run `runstream topics create "
                f"{self.namespace}` or start an engine instance"
            )
        return len(md.partitions)


_CONTINUED = "continued as "
_TERMINAL_EVENTS = {f"run.{s}" for s in TERMINAL}


def _run_info(info: dict[str, Any]) -> RunInfo:
    def ts(ms: int | None) -> datetime | None:
        return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)

    return RunInfo(
        run_id=info["run_id"],
        status=info["status"],
        workflow=info["workflow"],
        version=info["version"],
        input=payload.loads(info["input"]),
        output=payload.loads(info["output"]),
        error=info["error"],
        reason=info["reason"],
        started_at=ts(info["started_at_ms"]),
        ended_at=ts(info["ended_at_ms"]),
        steps=info["steps"],
    )


def _check_run_id(run_id: str) -> None:
    if not run_id or "\x00" in run_id or len(run_id.encode()) > 512:
        raise ValueError("a run id is 1 to 512 bytes of text without NUL characters")


def _now_ms() -> int:
    return int(time.time() * 1000)
