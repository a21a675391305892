"""`Client`: start, signal, cancel, complete promises and ask about runs, over Kafka only.

Commands go to ``<ns>.commands`` on the partition Kafka's murmur2 gives the run id,
like any other producer. Answers come back on ``<ns>.replies``, keyed by the client's
id: the run's owner answers from its projection, at once or (``result``) in the
transaction that ends the run.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runstream.engine import blobs, payload
from runstream.engine.limits import DEFAULT_MAX_RECORD, Limits
from runstream.engine.partitioner import partition_for, task_group_id
from runstream.engine.workflow import seconds
from runstream.entity_client import EntityHandle
from runstream.errors import (
    EventNotSet,
    KafkaUnavailable,
    OwnerUnavailable,
    PayloadTooLarge,
    QueryFailed,
    RunCancelled,
    RunNotFound,
    RunRejected,
    TopicError,
    UpdateFailed,
    run_failed,
)
from runstream.interceptors import outgoing_headers, record_headers
from runstream.operations import (
    CancelReport,
    JournalFact,
    RunEvent,
    RunPage,
    RunSummary,
    When,
    bulk_cancel,
    caught_up,
    chain_ended,
    check_status,
    journal,
    run_event,
    time_ms,
    where_of,
)
from runstream.pausing import KEY, PauseReport, bulk, who
from runstream.projections.runs import RunQuery
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    TERMINAL,
    Cancel,
    Command,
    CompletePromise,
    LiveQuery,
    Pause,
    PublishEvent,
    Query,
    QueryAnswer,
    Retry,
    ScheduleCommand,
    Signal,
    StartRun,
    Status,
    Unpause,
    Update,
    UpdateReply,
    UpdateStage,
    continuation_of,
    correlation_id,
    promise_of,
    run_id_problem,
    schedule_id,
)
from runstream.schemas.records import (
    RunInfo as RunInfoRecord,
)
from runstream.settings import Settings
from runstream.topics.admin import client_config
from runstream.topics.blobstore import KafkaBlobs, blob_producer
from runstream.topics.kafka import CommandSender, Listener
from runstream.topics.spec import Topics

_KEEP: Any = object()  # Client.retry without new input
_EXPECTED = 10_000  # starts whose answer this client remembers to expect


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
    continued_as: str | None = None
    code: str | None = None  # why it failed (`runstream.Failure`) or its start was rejected
    parent_run_id: str | None = None
    children: list[str] = []  # the child runs it started, in order (the first 1,000)


class Client:
    """Talks to a namespace's engine instances through Kafka. Thread-safe.

    Raises `KafkaUnavailable` if no broker answers within ``settings.connect_timeout``,
    and `TopicError` if the namespace has no topics yet.
    """

    def __init__(
        self, namespace: str, bootstrap: str | None = None, *, settings: Settings | None = None
    ) -> None:
        s = (settings or Settings()).with_bootstrap(bootstrap)
        self.settings, self.namespace, self.topics = s, namespace, Topics(namespace)
        self.bootstrap = s.bootstrap()
        self.client_id = f"client-{uuid.uuid4().hex}"
        self.codec = Codec.default()
        self._config = client_config(self.bootstrap, s.kafka)
        self._send_timeout = s.send_timeout
        self._sender = CommandSender(self._config, s.send_timeout)
        self._partitions = self._partition_count(self.topics.commands, s.connect_timeout)
        self._reply_partitions = self._partition_count(self.topics.replies, s.connect_timeout)
        self._lock = threading.RLock()  # one question at a time reads the replies
        self._mutex = threading.Lock()  # guards the listener's creation and what is expected
        self._listener: Listener | None = None
        self._key = self.client_id.encode()
        self._asked: set[str] = set()  # request ids waiting for an answer
        self._expected: OrderedDict[str, str] = OrderedDict()  # run id -> its start's request
        self._replies: dict[str, RunInfoRecord | QueryAnswer] = {}
        self._update_replies: dict[str, UpdateReply | None] = {}  # by update id: latest
        # Large payloads (`engine.blobs`): written before the command that references them.
        self._blobs = KafkaBlobs(self._config, self.topics.blobs, timeout=s.send_timeout)
        self._blob_limits = Limits(
            s.max_record_bytes or DEFAULT_MAX_RECORD, blob_threshold=s.blob_threshold_bytes
        )
        self._blob_producer: Any = None  # made at the first large payload

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait until Kafka took every command sent (`CommandNotDelivered` if it refused
        one), then release the connections."""
        try:
            self._sender.close(self._send_timeout)
        finally:
            self._blobs.close()
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka took every command sent (``send_timeout`` at most by default);
        raises `CommandNotDelivered` naming the ones it refused."""
        self._sender.flush(self._send_timeout if timeout is None else timeout)

    # -- large payloads ----------------------------------------------------------------
    def _dumps(self, value: Any) -> bytes:
        """The JSON bytes of ``value``, or, above the blob threshold, the reference to
        them once they are on the blobs topic (flushed: the command comes after)."""
        data = payload.dumps(value)
        limits = self._blob_limits
        if not limits.big(len(data)):
            return data
        with self._mutex:
            if self._blob_producer is None:
                self._blob_producer = blob_producer(self._config)
            producer = self._blob_producer
        return self._blobs.write(producer, data, limits.payload).encode()

    def _loads(self, data: bytes | None) -> Any:
        """The value of a payload, read from the blobs topic if it is a reference."""
        with blobs.active(self._blobs):
            return payload.loads(data)

    # -- commands --------------------------------------------------------------------
    def start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        run_id: str | None = None,
        version: str | None = None,
        tags: dict[str, str] | None = None,
        timeout: float | str | None = None,
        wait: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Start a run and return its id. Idempotent by ``run_id``: starting an id that
        exists does nothing. ``timeout`` (seconds or ``"1h"``) overrides the workflow's
        execution timeout. ``wait=False`` returns before Kafka acknowledged it (a refusal
        is then raised by the next waiting call or `close`). ``headers`` (text) travel with
        the run to its interceptors, steps and children (`runstream.interceptors`), in the
        command and as its Kafka record headers; with OpenTelemetry installed, the current
        span's ``traceparent`` is added (`runstream.otel`)."""
        return self._start(workflow, input, run_id, version, tags, timeout, wait, headers=headers)

    def signal_with_start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        run_id: str,
        signal: str,
        value: Any = None,
        signal_id: str | None = None,
        version: str | None = None,
        tags: dict[str, str] | None = None,
        timeout: float | str | None = None,
        wait: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Send signal ``signal`` to run ``run_id``, starting it first if it does not exist,
        in one command: the signal is delivered exactly once either way (a signal id makes
        retries of this call count once). ``headers``: as `start`'s, for a run it starts."""
        sig = (signal, self._dumps(value), signal_id or uuid.uuid4().hex)
        return self._start(workflow, input, run_id, version, tags, timeout, wait, sig, headers)

    def _start(
        self,
        workflow: str | Callable[..., Any],
        input: Any,
        run_id: str | None,
        version: str | None,
        tags: dict[str, str] | None,
        timeout: float | str | None,
        wait: bool,
        signal: tuple[str, bytes, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        sig_name, sig_payload, sig_id = signal or (None, None, "")
        name = _workflow_name(workflow)
        run_id = run_id or uuid.uuid4().hex
        problem = run_id_problem(run_id, new=True)
        if problem:
            raise ValueError(problem)
        # Ask for the run's end with the start itself: result() then costs no question.
        # With Kafka away, send the start all the same (librdkafka keeps it until Kafka is
        # back or send_timeout passes); result() will ask.
        try:
            self._listen()
            reply_to: str | None = self.client_id
        except KafkaUnavailable:
            reply_to = None
        request_id = uuid.uuid4().hex
        cmd = StartRun(
            run_id,
            name,
            input=self._dumps(input),
            version=version,
            parent_run_id=None,
            tags=dict(tags or {}),
            sent_at_ms=_now_ms(),
            reply_to=reply_to,
            request_id=request_id,
            timeout_ms=None if timeout is None else int(seconds(timeout) * 1000),
            signal=sig_name,
            signal_payload=sig_payload,
            signal_id=sig_id,
            headers=outgoing_headers(headers),
        )
        with self._mutex:
            if reply_to is not None:
                self._expected[run_id] = request_id
                self._asked.add(request_id)
            if len(self._expected) > _EXPECTED:
                self._asked.discard(self._expected.popitem(last=False)[1])
        self._send(cmd, wait)
        return run_id

    def signal(
        self, run_id: str, name: str, value: Any = None, *, signal_id: str | None = None
    ) -> None:
        """Send signal ``name`` to a run; a signal id makes retries of this call count once."""
        self._send(
            Signal(
                run_id,
                name,
                payload=self._dumps(value),
                signal_id=signal_id or uuid.uuid4().hex,
                sent_at_ms=_now_ms(),
            )
        )

    def resolve(self, promise_id: str, value: Any = None) -> None:
        """Resolve a run's durable promise (`Context.promise`) with ``value``: the
        workflow's ``await`` returns it. A promise completes once; a completion the engine
        refuses (completed already, no such promise, the run ended) goes to ``<ns>.dlq``
        with the reason."""
        self._send(self._completion(promise_id, value=self._dumps(value)))

    def reject(self, promise_id: str, error: str) -> None:
        """Reject a run's durable promise: the workflow's ``await`` raises
        `PromiseRejected` with ``error``. Refused as `resolve` is."""
        self._send(self._completion(promise_id, error=error))

    def _completion(
        self, promise_id: str, *, value: bytes | None = None, error: str | None = None
    ) -> CompletePromise:
        parsed = promise_of(promise_id)
        if parsed is None:
            raise ValueError(f"{promise_id!r} is not a promise id (<run_id>/promise/<seq>)")
        return CompletePromise(
            parsed[0], promise_id, value=value, error=error, sent_at_ms=_now_ms()
        )

    def cancel(
        self,
        run_id: str,
        *,
        compensate: bool = False,
        reason: str = "",
        children: str = "cancel",
        wait: bool = True,
    ) -> None:
        """Cancel a run (after its compensations if ``compensate``); a finished run stays.
        Its child runs are cancelled too (and theirs), unless ``children="abandon"``.
        ``wait=False`` returns before Kafka acknowledged it (see `start`)."""
        if children not in ("cancel", "abandon"):
            raise ValueError(f"children must be 'cancel' or 'abandon', not {children!r}")
        abandon = children == "abandon"
        self._send(
            Cancel(
                run_id, compensate, reason=reason, sent_at_ms=_now_ms(), abandon_children=abandon
            ),
            wait,
        )

    def publish(
        self,
        name: str,
        value: Any = None,
        *,
        key: str = "",
        ttl: float | str = 0,
        event_id: str | None = None,
        wait: bool = True,
    ) -> str:
        """Publish event ``name`` with correlation ``key``: each run waiting for it
        (``ctx.wait_for_event(name, key=...)``) gets it once, each workflow it triggers
        starts. ``ttl`` (seconds or "10m") keeps it for waits that come later; 0 (the
        default) reaches only waits that exist. An event id makes retries count once."""
        event_id = event_id or uuid.uuid4().hex
        ttl_ms = int(seconds(ttl) * 1000)
        corr = correlation_id(name, key)
        self._send(
            PublishEvent(
                corr,
                name,
                event_id=event_id,
                payload=self._dumps(value),
                key=key,
                ttl_ms=ttl_ms,
                sent_at_ms=_now_ms(),
            ),
            wait,
        )
        return event_id

    def schedule(
        self, name: str, workflow: str | Callable[..., Any], input: Any = None, *,
        cron: str, tz: str = "UTC",
    ) -> None:  # fmt: skip
        """Create or replace schedule ``name``: at each fire time of ``cron`` (read in
        ``tz``) start ``workflow`` with ``input``, as run ``<name>@<fire time>``. A fire
        missed while no engine ran is caught up once, never twice. A bad cron expression
        or time zone, or an unknown workflow, is dead-lettered with the reason."""
        wf, data = _workflow_name(workflow), self._dumps(input)
        self._send(
            ScheduleCommand(
                schedule_id(name),
                "set",
                workflow=wf,
                input=data,
                cron=cron,
                tz=tz,
                sent_at_ms=_now_ms(),
            )
        )

    def pause_schedule(self, name: str) -> None:
        """Stop firing schedule ``name`` until it is resumed."""
        self._send(ScheduleCommand(schedule_id(name), "pause", sent_at_ms=_now_ms()))

    def resume_schedule(self, name: str) -> None:
        """Fire schedule ``name`` again from its next fire time (the ones missed while it
        was paused are not fired)."""
        self._send(ScheduleCommand(schedule_id(name), "resume", sent_at_ms=_now_ms()))

    def delete_schedule(self, name: str) -> None:
        """Delete schedule ``name``: it fires no more."""
        self._send(ScheduleCommand(schedule_id(name), "delete", sent_at_ms=_now_ms()))

    def retry(self, run_id: str, *, input: Any = _KEEP, reason: str = "", wait: bool = True) -> str:
        """Let a failed or dead run go on from its last completed step (the steps after it
        that failed run again; no completed step does), or try a parked run again now;
        other runs stay as they are, and a run that compensated can't go on. Returns the
        id of the run that goes on.

        With ``input``, an ended run is retried instead as a new run of the newest version
        of its workflow, ``<run_id>~<n>``, with that input; both histories link the two.
        A refused retry goes to the dead-letter topic with its reason. ``wait=False``
        returns before Kafka acknowledged it (see `start`)."""
        if input is _KEEP:
            rid = uuid.uuid4().hex
            self._send(Retry(run_id, reason, sent_at_ms=_now_ms(), retry_id=rid), wait)
            return run_id
        self._send(Retry(run_id, reason, input=self._dumps(input), sent_at_ms=_now_ms()), wait)
        return continuation_of(run_id)

    def pause(self, run_id: str, *, reason: str = "", by: str = "", wait: bool = True) -> None:
        """Pause a run: no workflow code of it runs until `unpause` (its steps in flight
        finish; what comes meanwhile is recorded and reaches the code then). A cancel
        and its execution timeout still end it. A pause of a paused or ended run changes
        nothing; ``by`` (default ``user@host``) and ``reason`` go into its history."""
        pid = uuid.uuid4().hex  # a retry of this send changes nothing more
        self._send(Pause(run_id, reason, by=by or who(), sent_at_ms=_now_ms(), pause_id=pid), wait)

    def unpause(self, run_id: str, *, reason: str = "", by: str = "", wait: bool = True) -> None:
        """Let a paused run go on; a run that is not paused stays as it is."""
        pid = uuid.uuid4().hex
        cmd = Unpause(run_id, reason, by=by or who(), sent_at_ms=_now_ms(), pause_id=pid)
        self._send(cmd, wait)

    def pause_group(self, group: str, *, reason: str = "", by: str = "", wait: bool = True) -> None:
        """Pause task group ``group``: the engine sends no new remote step of it until
        `unpause_group` (the steps due meanwhile wait, and start then with their whole
        timeout); attempts already sent finish and are recorded. One command per journal
        partition, where each partition's owner keeps the pause (docs/guides/pause.md).
        A pause of a paused group changes nothing."""
        self._group(group, Pause, reason, by, wait)

    def unpause_group(
        self, group: str, *, reason: str = "", by: str = "", wait: bool = True
    ) -> None:
        """Let task group ``group`` go on: the steps it held are sent at once."""
        self._group(group, Unpause, reason, by, wait)

    def _group(
        self, group: str, kind: type[Pause | Unpause], reason: str, by: str, wait: bool
    ) -> None:
        self.topics.tasks(group)  # a valid group name (a topic's), checked now
        pid, n = uuid.uuid4().hex, self._partitions
        for p in range(n):
            ent = task_group_id(group, p, n)
            self._send(kind(ent, reason, by=by or who(), sent_at_ms=_now_ms(), pause_id=pid), False)
        if wait:
            self.flush()

    # -- updates (docs/guides/updates.md) ---------------------------------------------
    def update(
        self,
        run_id: str,
        name: str,
        arg: Any = None,
        *,
        update_id: str | None = None,
        timeout: float = 30.0,
    ) -> Any:
        """Send update ``name`` to a run and return its handler's result. Raises
        `UpdateFailed` if the run rejected it (its validator raised, no such handler,
        the run has ended, a cap: nothing was recorded) or its handler failed, and
        `TimeoutError` after ``timeout`` seconds. Idempotent by ``update_id``: a call
        again with the same id gets the same answer, and the handler runs once."""
        handle = self.start_update(
            run_id, name, arg, update_id=update_id, wait_for="completed", timeout=timeout
        )
        return handle.result(timeout)

    def start_update(
        self,
        run_id: str,
        name: str,
        arg: Any = None,
        *,
        update_id: str | None = None,
        wait_for: str = "accepted",
        timeout: float = 30.0,
    ) -> UpdateHandle:
        """Send update ``name`` and return once it is ``wait_for``: ``"admitted"`` (on
        the log: Kafka has it, it will be decided even if every engine is down now),
        ``"accepted"`` (its validator passed: a fact), or ``"completed"``. The handle's
        `UpdateHandle.result` waits for the result. Raises `UpdateFailed` as `update`."""
        cmd = Update(
            run_id,
            name,
            update_id=update_id or uuid.uuid4().hex,
            arg=self._dumps(arg),
            reply_to=self.client_id,
            sent_at_ms=_now_ms(),
        )
        return self._start_update(cmd, wait_for, timeout)

    def update_with_start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        run_id: str,
        update: str,
        arg: Any = None,
        update_id: str | None = None,
        version: str | None = None,
        tags: dict[str, str] | None = None,
        run_timeout: float | str | None = None,
        wait_for: str = "accepted",
        timeout: float = 30.0,
    ) -> UpdateHandle:
        """Send update ``update`` to run ``run_id``, starting the run first (with
        ``input``) if it does not exist, in one command on the run's partition: one
        decision starts the run and validates the update. ``run_timeout`` is the run's
        execution timeout. Otherwise as `start_update`."""
        problem = run_id_problem(run_id, new=True)
        if problem:
            raise ValueError(problem)
        cmd = Update(
            run_id,
            update,
            update_id=update_id or uuid.uuid4().hex,
            arg=self._dumps(arg),
            reply_to=self.client_id,
            sent_at_ms=_now_ms(),
            start_workflow=_workflow_name(workflow),
            start_input=self._dumps(input),
            start_version=version,
            start_tags=dict(tags or {}),
            start_timeout_ms=None if run_timeout is None else int(seconds(run_timeout) * 1000),
        )
        return self._start_update(cmd, wait_for, timeout)

    def _start_update(self, cmd: Update, wait_for: str, timeout: float) -> UpdateHandle:
        if wait_for not in _STAGES:
            raise ValueError(f"wait_for must be one of {_STAGES}, not {wait_for!r}")
        handle = UpdateHandle(self, cmd)
        if wait_for == "admitted":
            self._listen()  # the answers sent from now on are read
            with self._mutex:
                self._update_replies.setdefault(cmd.update_id, None)
            self._send(cmd)  # returns once Kafka has it
            return handle
        handle._wait(wait_for, timeout)
        return handle

    def _update_answer(self, cmd: Update, wait_for: str, deadline: float) -> UpdateReply | None:
        """The update's answer once it is at ``wait_for`` (or ended), else None at the
        deadline. The command is sent again now and then (idempotent by its id), in case
        its answer was lost with an owner that died or its partition moved."""
        self._listen()
        uid, again = cmd.update_id, 2.0
        with self._lock:
            with self._mutex:
                known = uid in self._update_replies
                self._update_replies.setdefault(uid, None)
            if not known:
                self._send(cmd)
            ask_again = time.monotonic() + again
            while True:
                answer = self._update_replies.get(uid)
                if answer is not None and answer.stage != UpdateStage.ACCEPTED:
                    self._update_replies.pop(uid, None)  # its end: the handle keeps it
                    return answer
                if answer is not None and wait_for == "accepted":
                    return answer
                now = time.monotonic()
                if now >= deadline:
                    return None
                if now >= ask_again:
                    self._send(cmd)
                    again = min(again * 2, 15.0)
                    ask_again = now + again
                self._pump(min(deadline, ask_again, now + 1.0) - now)

    # -- questions -------------------------------------------------------------------
    def get_run(self, run_id: str, timeout: float = 10.0) -> RunInfo:
        """Ask the run's owner; raises RunNotFound if no such run exists."""
        with self._lock:
            info = self._ask(run_id, time.monotonic() + timeout, wait=False)
        if info is None:
            raise TimeoutError(
                f"no answer about run {run_id!r} within {timeout}s (is an engine instance running?)"
            )
        if not info.found:
            raise RunNotFound(f"no run {run_id!r} in namespace {self.namespace!r}")
        if info.reply_error:
            raise PayloadTooLarge(f"the answer about run {run_id!r}: {info.reply_error}")
        with blobs.active(self._blobs):  # its input and output may be large
            return _run_info(info)

    def result(self, run_id: str, timeout: float = 30.0) -> Any:
        """The run's output once it ends (following continue-as-new). Raises RunFailed
        (its class chosen by its code: RunTimedOut, QueueFull), RunCancelled, RunRejected,
        RunNotFound (at once), or TimeoutError.

        The run's owner answers in the transaction that ends the run (on this client's
        replies partition); the question is asked again now and then, in case the run's
        partition moved to another instance meanwhile."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                end = self._ask(run_id, deadline, wait=True)
                if end is None:
                    raise TimeoutError(f"run {run_id!r} did not finish within {timeout}s")
                if not end.found:
                    raise RunNotFound(f"no run {run_id!r} in namespace {self.namespace!r}")
                if end.reply_error:
                    raise PayloadTooLarge(f"the answer about run {run_id!r}: {end.reply_error}")
                if end.status == Status.COMPLETED:
                    if end.continued_as:
                        run_id = end.continued_as
                        continue
                    return self._loads(end.output)
                if end.status == Status.CANCELLED:
                    raise RunCancelled(run_id, end.reason or "")
                if end.status == Status.REJECTED:
                    raise RunRejected(run_id, end.code or "", end.reason or "")
                raise run_failed(run_id, end.error or end.reason or "", end.status, end.code)

    def query(
        self,
        run_id: str,
        name: str,
        arg: Any = None,
        *,
        timeout: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """What the run's query handler ``name`` (``@ctx.query_handler``) returns for
        ``arg``, evaluated by the run's owner on the workflow as it is now; the run's
        journal does not change. ``headers`` (text) reach the inbound interceptors over
        the run's own, as `start`'s do. Raises `RunNotFound`, `QueryFailed` (no such
        handler, or it raised), or `OwnerUnavailable` when no engine instance answers
        within ``timeout`` seconds (none runs, or the partition is between owners)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._listen()
            request_id = uuid.uuid4().hex
            self._asked.add(request_id)
            try:
                cmd = LiveQuery(
                    run_id,
                    request_id,
                    reply_to=self.client_id,
                    name=name,
                    arg=payload.dumps(arg),
                    sent_at_ms=_now_ms(),
                    headers=outgoing_headers(headers),
                )
                self._send(cmd)
                while (answer := self._replies.pop(request_id, None)) is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise OwnerUnavailable(
                            f"no engine instance answered query {name!r} of run {run_id!r} "
                            f"within {timeout}s: is one (`runstream worker`) running for "
                            f"namespace {self.namespace!r}? (`get_event` needs none)"
                        )
                    self._pump(min(left, 1.0))
            finally:
                self._asked.discard(request_id)
        assert isinstance(answer, QueryAnswer)
        if not answer.found:
            raise RunNotFound(f"no run {run_id!r} in namespace {self.namespace!r}")
        if answer.error is not None:
            raise QueryFailed(answer.error)
        return self._loads(answer.value or b"null")

    def entity(self, name: str, key: str) -> EntityHandle:
        """Key ``key`` of durable entity ``name`` (`App.entity`):
        ``client.entity("cart", "ann").call("add", item)``, ``.read("total")``, ``.show()``."""
        return EntityHandle(self, name, key)

    def get_event(
        self,
        run_id: str,
        key: str,
        *,
        wait: float | str | None = None,
        cache_dir: Path | None = None,
    ) -> RunEvent | None:
        """The newest value the run set for ``key`` (``ctx.set_event``), read from the runs
        read model (caught up with ``<ns>.lifecycle``; no engine needed), following the
        runs that carry it on (continue-as-new, retry as a new run): a key set again by a
        later run answers with that value. `RunEvent.as_of` is the lifecycle offset the
        answer reflects. None if the key is not set yet (`RunNotFound` if the model knows
        no such run).

        With ``wait`` (seconds or "5m"), waits until the key is set: raises `EventNotSet`
        if the run ends first (and nothing carries it on), `TimeoutError` when ``wait``
        passes."""
        deadline = None if wait is None else time.monotonic() + seconds(wait)
        while True:
            with caught_up(self.namespace, self.settings, cache_dir) as (model, _):
                found, last = run_event(model, run_id, key)
            if found is not None:
                return found
            if deadline is None:
                if last is None:
                    raise RunNotFound(f"no run {run_id!r} in {self.topics.lifecycle}")
                return None
            if last is not None and chain_ended(last):
                raise EventNotSet(
                    f"run {last.run_id!r} ended {last.status} without setting {key!r}"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id!r} did not set {key!r} within {wait}")
            time.sleep(0.2)

    # -- internals ---------------------------------------------------------------------
    def _send(self, cmd: Command, wait: bool = True) -> None:
        """Produce a command. With ``wait``, raise unless Kafka acknowledged it; without,
        a failed delivery is kept and raised by the next waiting call or `close()`."""
        key = cmd.run_id.encode()
        self._sender.send(
            self.topics.commands,
            partition_for(key, self._partitions),
            key,
            self.codec.encode(cmd),
            f"{cmd.AVRO} for run {cmd.run_id!r}",
            record_headers(cmd.headers) if isinstance(cmd, StartRun) and cmd.headers else None,
        )
        if wait:
            self._sender.flush(self._send_timeout)

    def _ask(self, run_id: str, deadline: float, wait: bool) -> RunInfoRecord | None:
        """The owner's answer about ``run_id`` (with ``wait``: once the run has ended, or
        that it does not exist), or None at the deadline. A waiting question is asked again
        after 2 s, then less and less often, in case the owner forgot it (its partition
        moved)."""
        self._listen()
        again = 2.0
        with self._mutex:
            expected = self._expected.pop(run_id, None) if wait else None
        while True:
            if expected is not None:  # asked with the start: wait for that answer first
                request_id, expected = expected, None
            else:
                request_id = uuid.uuid4().hex
                self._asked.add(request_id)
                self._send(Query(run_id, request_id, reply_to=self.client_id, wait=wait))
            ask_again = time.monotonic() + again
            try:
                while True:
                    info = self._replies.pop(request_id, None)
                    if isinstance(info, RunInfoRecord) and (not wait or _ended(info)):
                        return info
                    now = time.monotonic()
                    if now >= deadline:
                        return None
                    if wait and now >= ask_again:
                        break
                    self._pump(min(deadline, ask_again if wait else deadline, now + 1.0) - now)
            finally:
                self._asked.discard(request_id)
            again = min(again * 2, 15.0)

    def _listen(self) -> None:
        """Read this client's replies partition from its end now (an explicit offset: a
        quick answer cannot land before the position is fixed and be missed)."""
        with self._mutex:
            if self._listener is None:
                # a group under the namespace: the ACLs of a Client's principal cover it
                listener = Listener(self._config, f"{self.namespace}.{self.client_id}")
                topic = self.topics.replies
                p = partition_for(self.client_id.encode(), self._reply_partitions)
                try:
                    listener.add(topic, p, listener.end_offset(topic, p))
                except BaseException:
                    listener.close()
                    raise
                self._listener = listener

    def _pump(self, timeout: float) -> None:
        assert self._listener is not None
        for rec in self._listener.poll(max(0.0, timeout)):
            if rec.key != self._key:
                continue  # another client's answer on the same partition
            try:
                msg = self.codec.decode(rec.value)
            except Exception:  # not ours to judge: the engine writes these topics
                continue
            if isinstance(msg, RunInfoRecord | QueryAnswer) and msg.request_id in self._asked:
                self._replies[msg.request_id] = msg
            elif isinstance(msg, UpdateReply) and msg.update_id in self._update_replies:
                known = self._update_replies[msg.update_id]
                if known is None or known.stage == UpdateStage.ACCEPTED:  # keep the end
                    self._update_replies[msg.update_id] = msg

    def partition_of(self, run_id: str) -> int:
        """The partition of ``<ns>.commands`` (and of the journal) that owns ``run_id``."""
        return partition_for(run_id.encode(), self._partitions)

    def _partition_count(self, topic: str, timeout: float) -> int:
        n = self._sender.partitions(topic, timeout)
        if n is None:
            raise TopicError(
                f"topic {topic!r} does not exist: run `runstream topics create -n "
                f"{self.namespace}` or start an engine instance"
            )
        return n

    # -- operations on many runs: the runs read model and the journal (`operations`) ----

    def list_runs(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        version: str | None = None,
        tags: Mapping[str, str] | None = None,
        since: When | None = None,
        until: When | None = None,
        limit: int = 20,
        after: str | None = None,
        cache_dir: Path | None = None,
    ) -> RunPage:
        """A page of the namespace's runs, newest first, that match every condition
        given: ``tags`` must all match; ``since`` and ``until`` bound the start (a
        datetime, a timedelta or "1h" ago, or an ISO date). ``after=page.after`` gives the
        next page. Read from the runs read model (as `runstream runs list`), caught up
        with ``<ns>.lifecycle`` first, kept in ``cache_dir`` (default: the runstream
        cache directory). Raises `ValueError` for a status no run can have."""
        check_status(status)
        query = RunQuery(
            status=status,
            workflow=workflow,
            version=version,
            tags=dict(tags or {}),
            since_ms=None if since is None else time_ms(since),
            until_ms=None if until is None else time_ms(until),
        )
        with caught_up(self.namespace, self.settings, cache_dir) as (model, _):
            page = model.find(query, limit, after)
            count, partial = model.count(query), model.partial
        return RunPage([RunSummary.of(r) for r in page.runs], page.after, count, partial)

    def history(self, run_id: str, *, cache_dir: Path | None = None) -> list[JournalFact]:
        """The run's journal facts, in order (as `runstream runs history`), read from its
        journal partition. Raises `RunNotFound` if the journal holds none."""
        facts = journal(run_id, self.namespace, self.settings, cache_dir)
        if not facts:
            raise RunNotFound(f"no run {run_id!r} in {self.topics.journal}")
        return [JournalFact.of(f) for f in facts]

    def cancel_where(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        version: str | None = None,
        tags: Mapping[str, str] | None = None,
        compensate: bool = False,
        reason: str = "",
        rate: float | None = None,
        timeout: float = 120.0,
        dry_run: bool = False,
        cache_dir: Path | None = None,
    ) -> CancelReport:
        """Cancel every run that matches the conditions (at least one), as a durable job
        (as `runstream runs cancel --where`): the runs are selected once from the runs
        read model and kept in a job file beside it, so a call stopped part way resumes
        with the same conditions (refused with `ValueError` if ``compensate`` differs).
        ``rate``: at most so many cancels a second. Then waits up to ``timeout`` seconds
        for the runs to end: `CancelReport.open` names those that have not. ``dry_run``
        only says which runs it would cancel."""
        where = where_of(status, workflow, version, tags or {})
        return bulk_cancel(
            self.namespace,
            self.settings,
            lambda: self,
            where,
            compensate=compensate,
            reason=reason or f"cancel_where {where}",
            rate=rate,
            timeout=timeout,
            dry_run=dry_run,
            base=cache_dir,
            progress=None,
        )

    def pause_where(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        version: str | None = None,
        tags: Mapping[str, str] | None = None,
        key: str | None = None,
        reason: str = "",
        dry_run: bool = False,
        cache_dir: Path | None = None,
    ) -> PauseReport:
        """Pause every open, unpaused run that matches the conditions (at least one), as
        selected from the runs read model (as `runstream runs pause --where`); ``key``:
        the runs whose workflow's ``concurrency_key`` gave that key (read from the
        journal). ``dry_run`` only says which. Calling it again pauses the ones that
        matched since."""
        named = (status, workflow, version, tags)
        where = where_of(status, workflow, version, tags or {}) if key is None or any(named) else {}
        where |= {} if key is None else {KEY: key}
        return self._pause_where(where, False, reason, dry_run, cache_dir)

    def unpause_where(
        self,
        *,
        workflow: str | None = None,
        version: str | None = None,
        tags: Mapping[str, str] | None = None,
        key: str | None = None,
        reason: str = "",
        dry_run: bool = False,
        cache_dir: Path | None = None,
    ) -> PauseReport:
        """Unpause every paused run that matches the conditions (none: every paused run;
        ``key`` as in `pause_where`)."""
        where = where_of(Status.PAUSED.value, workflow, version, tags or {})
        where |= {} if key is None else {KEY: key}
        return self._pause_where(where, True, reason, dry_run, cache_dir)

    def _pause_where(
        self, where: dict[str, str], unpause: bool, reason: str, dry_run: bool, base: Path | None
    ) -> PauseReport:
        what = "unpause_where" if unpause else "pause_where"
        return bulk(
            self.namespace,
            self.settings,
            lambda: self,
            where,
            unpause=unpause,
            reason=reason or f"{what} {where}",
            by=who(),
            dry_run=dry_run,
            base=base,
        )


_STAGES = ("admitted", "accepted", "completed")


class UpdateHandle:
    """An update sent by `Client.start_update`: ``stage`` is how far it is known to
    have got (admitted, accepted, completed); `result` waits for its result."""

    def __init__(self, client: Client, cmd: Update) -> None:
        self._client, self._cmd = client, cmd
        self.run_id, self.update_id, self.name = cmd.run_id, cmd.update_id, cmd.name
        self.stage = "admitted"
        self._answer: UpdateReply | None = None

    def __repr__(self) -> str:
        return f"<UpdateHandle {self.name!r} {self.update_id!r} of {self.run_id!r}: {self.stage}>"

    def result(self, timeout: float = 30.0) -> Any:
        """The handler's result once it completes. Raises `UpdateFailed` (rejected, or
        its handler failed, or its run ended first) or `TimeoutError`."""
        answer = self._wait("completed", timeout)
        return self._client._loads(answer.output or b"null")

    def _wait(self, wait_for: str, timeout: float) -> UpdateReply:
        if self._answer is None or (
            self._answer.stage == UpdateStage.ACCEPTED and wait_for == "completed"
        ):
            deadline = time.monotonic() + timeout
            answer = self._client._update_answer(self._cmd, wait_for, deadline)
            if answer is None:
                raise TimeoutError(
                    f"update {self.update_id!r} of run {self.run_id!r} not {wait_for} within "
                    f"{timeout}s (is an engine instance running?)"
                )
            self._answer, self.stage = answer, answer.stage
        answer = self._answer
        if answer.error is not None:
            rejected = answer.stage == UpdateStage.REJECTED
            raise UpdateFailed(self.run_id, self.update_id, answer.code, answer.error, rejected)
        return answer


def _ended(info: RunInfoRecord) -> bool:
    """The answer a waiting question wants: the run ended, or it does not exist."""
    return not info.found or info.status in (*TERMINAL, Status.REJECTED)


def _run_info(info: RunInfoRecord) -> RunInfo:
    def ts(ms: int | None) -> datetime | None:
        return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)

    return RunInfo(
        run_id=info.run_id,
        status=info.status,
        workflow=info.workflow,
        version=info.version,
        input=payload.loads(info.input),
        output=payload.loads(info.output),
        error=info.error,
        reason=info.reason,
        started_at=ts(info.started_at_ms),
        ended_at=ts(info.ended_at_ms),
        steps=info.steps,
        continued_as=info.continued_as,
        code=info.code,
        parent_run_id=info.parent_run_id,
        children=list(info.children),
    )


def _workflow_name(workflow: str | Callable[..., Any]) -> str:
    """A workflow's registered name, given the name or the decorated function."""
    name = getattr(workflow, "__runstream_workflow__", workflow)
    if not isinstance(name, str):
        raise TypeError(f"{workflow!r} is not a registered workflow or a workflow name")
    return name


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["Client", "RunInfo", "UpdateHandle"]
