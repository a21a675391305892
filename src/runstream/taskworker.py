"""A task worker: the process that serves the remote steps of one task group.

The engine records a remote step's ``StepStarted`` and, in the same transaction,
produces a `StepTask` to ``<ns>.tasks.<group>``. A `TaskWorker` consumes that topic
as a member of the group's own consumer group, runs each task's step body on one of
``concurrency`` threads, and answers with a `StepResult` command keyed by the run id.
No more than ``concurrency`` bodies run at once. Beyond the running ones the worker
holds up to ``prefetch`` fetched tasks (and at most `PREFETCH_BYTES` of them), so a freed
slot starts the next task at once; when it holds that many it pauses its partitions
(the group session stays alive, nothing spins) and resumes them once half are gone.
Pausing is for backlogs, not for metering every task: librdkafka drops what it had
prefetched for a paused partition and fetches it again on resume. Measured on a backlog
of 6,000 trivial tasks with 16 slots: 1,100 tasks/s with no prefetch, 1,500 with 16,
5,200 with 256.

**At least once, settled once.** A task's offset is committed only once Kafka has
acknowledged its result, and only as part of the contiguous prefix of tasks done. A
worker that dies loses nothing: its uncommitted tasks are delivered again to the next
owner of their partition, and their bodies run again. The engine settles an attempt
with the first result that carries its open attempt id and ignores every other, so a
second result changes nothing: results need no transaction (docs/remote-steps.md).
Step bodies must be idempotent, as local ones must.

A task that is past its ``deadline_ms`` is skipped (the engine has timed the attempt
out already). A task naming a step this worker does not serve fails its attempt as
non-retryable: waiting would not teach this worker the step. A record that cannot be
read goes to ``<ns>.dlq``. Either way the worker goes on.
"""

from __future__ import annotations

import inspect
import logging
import os
import queue
import socket
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from runstream.engine import payload
from runstream.engine.decide import dead_letter
from runstream.engine.partitioner import partition_for
from runstream.engine.steps import StepContext
from runstream.engine.work import LogRecord, StepJob, StepOutcome
from runstream.engine.workflow import StepDef, type_hints
from runstream.errors import ConfigError, RunstreamError
from runstream.metrics import TaskMetrics, serve
from runstream.runtime.steps import execute
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    Heartbeat,
    Reason,
    StepResult,
    StepTask,
)
from runstream.settings import Settings
from runstream.supervisor import stop_on_signals
from runstream.topics.spec import Topics
from runstream.topics.tasklog import TaskLog, open_task_log

if TYPE_CHECKING:
    from runstream.app import App

log = logging.getLogger("runstream.tasks")

#: Fetched tasks a worker holds beyond the running ones, by default, and their bytes at most.
PREFETCH = 256
PREFETCH_BYTES = 64 * 1024 * 1024
#: Heartbeats of a task that asks for none (no ``heartbeat_ms``) go at most this often (s).
QUIET_HEARTBEAT = 10.0
#: How long the loop waits for tasks before it settles and commits what ended: short
#: while tasks are held (their results are acknowledged and committed, and a paused
#: consumer resumed, that much later at most), longer when idle.
BUSY_POLL, IDLE_POLL = 0.05, 0.5
#: A warning about skipped (late) tasks at most this often (s); the others are counted.
WARN_EVERY = 10.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TaskWorker:
    """Serves the remote steps of task group ``group`` declared on ``app``.

    ``run()`` blocks until SIGTERM/SIGINT (in the main thread) or ``stop()``. Stopping
    fetches no more tasks, lets the running bodies finish within ``grace`` seconds,
    sends their results and commits; a second stop does not wait.

    Args:
        app: its namespace and Kafka, and the steps (``@app.step(group=...)``).
        group: the task group served (topic ``<ns>.tasks.<group>``).
        concurrency: step bodies running at once, at most.
        prefetch: tasks held beyond the running ones, waiting for a slot.
        settings: Kafka settings (bootstrap, extra librdkafka settings, session timeout,
            record size); ``app``'s bootstrap, if given, wins.
        grace: seconds the running bodies get at a stop.
    """

    def __init__(
        self,
        app: App,
        group: str,
        *,
        concurrency: int = 16,
        prefetch: int = PREFETCH,
        settings: Settings | None = None,
        grace: float = 30.0,
    ) -> None:
        if concurrency < 1 or prefetch < 0:
            raise ValueError(
                f"concurrency must be 1 or more, not {concurrency}, and prefetch 0 or more"
            )
        self.app, self.group, self.concurrency, self.grace = app, group, concurrency, grace
        self.max_held = concurrency + prefetch
        self.settings = (settings or Settings()).with_bootstrap(app.bootstrap)
        self.topics = Topics(app.namespace)
        self.topics.tasks(group)  # a valid group name, checked now
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.codec = Codec.default()
        steps = [sd for sd in app.registry.steps.values() if sd.policy.group == group]
        if not steps:
            groups = ", ".join(app.registry.groups()) or "none"
            raise ConfigError(
                f"app {app.namespace!r} declares no step of task group {group!r} "
                f"(its groups: {groups})"
            )
        self.served = {sd.name: _Served.of(sd) for sd in steps}
        self.stats: Counter[str] = Counter()  # results, failed, skipped, dead_letters, heartbeats
        self._stats_lock = threading.Lock()
        self.metrics = TaskMetrics(
            group, self.stats, lambda: (self._slots.running, self._slots.held[0])
        )
        self._metered = False  # metrics served (off: the bodies' histograms cost nothing)
        self._stopping, self._hurry = threading.Event(), threading.Event()
        self._log: TaskLog | None = None
        self._slots = _Slots(concurrency, self._work)
        self._offsets = _Offsets()
        self._sent = _SentResults()
        self._generation: dict[int, int] = {}  # partition -> its current assignment's number
        # tasks whose result Kafka took (or that need none): (generation, partition, offset)
        self._ended: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
        self._unknown_warned: set[str] = set()
        self._late, self._late_warned_at = 0, 0.0
        for sd in steps:
            if sd.policy.heartbeat is not None and sd.context_param is None:
                log.warning(
                    "step %r declares heartbeat=%gs but takes no StepContext parameter: it "
                    "cannot send heartbeats, so every attempt longer than that times out",
                    sd.name,
                    sd.policy.heartbeat,
                )

    # -- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the worker to stop (thread-safe); asked again, it does not wait for the
        running bodies."""
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()

    def run(self) -> None:
        """Connect (waiting out an outage), then serve the group until stopped."""
        if threading.current_thread() is threading.main_thread():
            stop_on_signals(self.stop)
        started = time.monotonic()
        s = self.settings
        try:
            server = serve(self.metrics.registry, s.metrics_host, s.metrics_port)
        except OSError as exc:  # the port is taken, say: one line that says so
            raise ConfigError(
                f"cannot serve metrics on {s.metrics_host}:{s.metrics_port}: {exc}"
            ) from exc
        self._metered = server is not None
        try:
            self._log = open_task_log(
                self.settings, self.topics, self.group, self.worker_id, self._stopping.is_set
            )
            if self._log is None:
                return
            log.info(
                "task worker %s serving group %r of %s (%s, %d at once): steps %s",
                self.worker_id,
                self.group,
                self.app.namespace,
                self._log.topic,
                self.concurrency,
                ", ".join(sorted(self.served)),
            )
            self._slots.start()
            self._log.subscribe(self._assigned, self._revoked)
            while not self._stopping.is_set():
                self._turn(self._log)
            self._drain(self._log)
        finally:
            self._slots.close()
            if server is not None:
                server.close()
            if self._log is not None:
                self._log.close()
                log.info(
                    "task worker %s stopped after %.0fs: %s",
                    self.worker_id,
                    time.monotonic() - started,
                    dict(self.stats),
                )

    def _turn(self, tl: TaskLog) -> None:
        """Take what tasks there is room for, then settle the tasks that ended."""
        held, held_bytes = self._slots.held
        room = self.max_held - held
        if room <= 0 or held_bytes >= PREFETCH_BYTES:
            tl.pause()  # no spinning: poll below only keeps the group session served
        elif held <= self.max_held // 2 and held_bytes < PREFETCH_BYTES // 2:
            tl.resume()  # with room for a good batch: each pause costs a fetch round
        wait = BUSY_POLL if held or self._offsets.open else IDLE_POLL
        for record in tl.poll(wait, max(room, 1)):
            self._take(tl, record)
        tl.serve()
        self._settle(tl)

    def _drain(self, tl: TaskLog) -> None:
        """The stop: fetch nothing more, let the running bodies end (within the grace),
        wait for Kafka to take their results, commit."""
        tl.pause()
        dropped = self._slots.drop(None)  # not begun: their partition's next owner runs them
        deadline = time.monotonic() + self.grace
        while self._slots.running and time.monotonic() < deadline and not self._hurry.is_set():
            tl.poll(0.1, 1)  # paused: nothing comes, but rebalances are served
            tl.serve()
            self._settle(tl)
        if self._slots.running:
            log.warning(
                "%d step bodies still running at the stop; their tasks will run again",
                self._slots.running,
            )
        if not tl.flush(10):
            log.warning("Kafka did not take every result within 10s; those tasks will run again")
        tl.serve()
        self._settle(tl, wait=True)
        if dropped:
            log.info("%d tasks taken but not begun are left to the next worker", dropped)

    # -- partitions ------------------------------------------------------------------
    def _assigned(self, partitions: list[int]) -> None:
        for p in partitions:
            self._generation[p] = self._generation.get(p, 0) + 1
        log.info("task partitions %s assigned", sorted(partitions))

    def _revoked(self, partitions: list[int], lost: bool) -> None:
        """Partitions go to another worker: drop their tasks not begun, commit what ended
        (unless the partitions are lost already), and forget them. Bodies still running
        end here; their results are sent, and their tasks run again on the next owner."""
        dropped = self._slots.drop(set(partitions))
        if not lost and self._log is not None:
            self._log.serve()
            self._settle(self._log, wait=True)
        self._offsets.forget(partitions)
        for p in partitions:
            self._generation[p] = self._generation.get(p, 0) + 1  # late endings are stale
        log.info(
            "task partitions %s %s (%d tasks not begun left to the next owner)",
            sorted(partitions),
            "lost" if lost else "revoked",
            dropped,
        )

    def _settle(self, tl: TaskLog, *, wait: bool = False) -> None:
        """Count the tasks that ended, and commit each partition's prefix of ended tasks."""
        while True:
            try:
                generation, p, offset = self._ended.get_nowait()
            except queue.Empty:
                break
            if self._generation.get(p) == generation:
                self._offsets.finish(p, offset)
        # A wait (a stop, a revoke) commits every position: an earlier asynchronous
        # commit may have failed unseen.
        offsets = self._offsets.positions() if wait else self._offsets.uncommitted()
        if offsets and tl.commit(offsets, wait=wait):
            self._offsets.committed(offsets)

    # -- tasks -----------------------------------------------------------------------
    def _take(self, tl: TaskLog, record: LogRecord) -> None:
        """A task record came: hold it for a slot, or set it aside as a dead letter."""
        p, offset = record.partition, record.offset
        generation = self._generation.get(p, 0)
        self._offsets.take(p, offset)
        try:
            task = self.codec.decode(record.value)
            if not isinstance(task, StepTask):
                raise TypeError(f"a {task.AVRO} record, not a StepTask")
        except Exception as exc:  # any bytes at all: never crash on them
            self._dead_letter(tl, record, generation, f"undecodable task record: {exc}")
            return
        self._slots.submit(_Held(generation, p, offset, task, len(record.value or b"")))

    def _dead_letter(self, tl: TaskLog, rec: LogRecord, generation: int, reason: str) -> None:
        reason = tl.limits.clip(reason)
        log.warning("dead letter (%s) from %s: %s", Reason.UNDECODABLE, rec.topic, reason)
        letter = dead_letter(rec, Reason.UNDECODABLE, reason, tl.limits, _now_ms())
        self._count("dead_letters")
        ended = (generation, rec.partition, rec.offset)
        tl.send(
            self.topics.dlq, None, rec.key, self.codec.encode(letter), self._ender(ended, "dlq")
        )

    def _work(self, held: _Held) -> None:
        """On a slot's thread: run one task and send its result."""
        tl, task = self._log, held.task
        assert tl is not None  # slots start after the log
        ended = (held.generation, held.partition, held.offset)
        if task.deadline_ms is not None and _now_ms() > task.deadline_ms:
            self._skipped(task)
            self._ended.put(ended)
            return
        data = self._sent.get(task)
        if data is None:
            result = self._attempt(tl, task)
            self._count("results" if result.ok else "failed")
            data = self.codec.encode(result)
            self._sent.put(task, data)
        else:  # this process ran it already: the same result again, not a second body
            self._count("resent")
        key = task.run_id.encode()
        tl.send(
            self.topics.commands,
            partition_for(key, tl.partitions),
            key,
            data,
            self._ender(ended, f"the result of {task.run_id}/{task.seq}"),
        )

    def _attempt(self, tl: TaskLog, task: StepTask) -> StepResult:
        """Run the task's step once; its result, whatever happened."""
        served = self.served.get(task.name)
        if served is None:
            return self._refuse(tl, task, self._unknown(task.name))
        try:
            args = served.arguments(payload.loads(task.args))
        except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
            return self._refuse(tl, task, f"arguments of step {task.name!r} are invalid: {exc}")
        context = StepContext(
            task.run_id, task.seq, task.attempt, task.attempt_id, beat=_Beat(self, tl, task)
        )
        job = StepJob(
            -1, task.run_id, task.seq, task.attempt, served.step, args, headers=task.headers
        )
        if self._metered:
            self.metrics.started(task.name, task.sent_at_ms, _now_ms())
        outcome = execute(job, context, self.app.registry.interceptors)
        if self._metered:
            self.metrics.ran(task.name, outcome.ok, outcome.duration_ms)
        return self._result(tl, task, outcome)

    def _result(self, tl: TaskLog, task: StepTask, o: StepOutcome) -> StepResult:
        ok, output, error, retryable = o.ok, o.output, o.error, o.retryable
        if ok and tl.limits.big(len(output)):  # on the blobs topic before its result
            try:
                output = tl.write_blob(output)
            except RunstreamError as exc:  # not written: the attempt is tried again
                ok, output, error, retryable = False, b"null", f"the step's output: {exc}", True
        too_large = tl.limits.too_large("the step's output", len(output)) if ok else None
        if too_large:  # it could not travel; and the same body would return it again
            ok, output, error, retryable = False, b"null", too_large, False
        return StepResult(
            task.run_id,
            task.seq,
            attempt=task.attempt,
            ok=ok,
            output=output if ok else b"null",
            error=None if error is None else tl.limits.clip(error),
            traceback=None if o.traceback is None else tl.limits.clip(o.traceback),
            attempt_id=task.attempt_id,
            retryable=retryable,
            duration_ms=o.duration_ms,
            worker=self.worker_id,
        )

    def _refuse(self, tl: TaskLog, task: StepTask, error: str) -> StepResult:
        """A result that fails the attempt for good, without running anything."""
        outcome = StepOutcome(
            -1, task.run_id, task.seq, task.attempt, False, error=error, retryable=False
        )
        return self._result(tl, task, outcome)

    def _unknown(self, name: str) -> str:
        error = (
            f"task group {self.group!r} has no step {name!r} in this worker "
            f"(registered: {', '.join(sorted(self.served))})"
        )
        other = next((sd for sd in self.app.registry.steps.values() if sd.name == name), None)
        if other is not None:
            error += f"; step {name!r} is in group {other.policy.group or '(local)'!r} here"
        if name not in self._unknown_warned:  # once per name: a deployment mistake
            self._unknown_warned.add(name)
            log.warning("%s; its attempts fail as non-retryable", error)
        return error

    def _skipped(self, task: StepTask) -> None:
        now = time.monotonic()
        with self._stats_lock:
            self.stats["skipped"] += 1
            self._late += 1
            if now - self._late_warned_at < WARN_EVERY:
                return
            late, self._late, self._late_warned_at = self._late, 0, now
        log.warning(
            "skipped %d task(s) past their deadline, the engine has timed them out already "
            "(the latest: step %r of run %s, %d ms late)",
            late,
            task.name,
            task.run_id,
            _now_ms() - (task.deadline_ms or 0),
            extra={"run_id": task.run_id},
        )

    def _ender(self, ended: tuple[int, int, int], what: str) -> Callable[[str | None], None]:
        """The delivery callback of a record that settles a task: the task has ended."""

        def done(error: str | None) -> None:
            if error is not None:  # the engine times the attempt out and tries again
                log.error("Kafka refused %s (%s); the task is not answered", what, error)
            self._ended.put(ended)

        return done

    def _count(self, what: str) -> None:
        with self._stats_lock:
            self.stats[what] += 1

    def _heartbeat(self, tl: TaskLog, task: StepTask, details: Any) -> None:
        """Send a Heartbeat for ``task``'s attempt (unthrottled: see `_Beat`). Details that
        cannot travel are dropped with a warning; the heartbeat itself still goes."""
        data: bytes | None = None
        if details is not None:
            try:
                data = payload.dumps(details)
            except Exception as exc:  # not JSON-able
                log.warning("heartbeat details of step %r dropped: %s", task.name, exc)
            too_large = None if data is None else tl.limits.too_large("details", len(data))
            if too_large:
                log.warning("heartbeat details of step %r dropped: %s", task.name, too_large)
                data = None
        beat = Heartbeat(
            task.run_id, task.seq, attempt_id=task.attempt_id, details=data, sent_at_ms=_now_ms()
        )
        key = task.run_id.encode()
        tl.send(
            self.topics.commands, partition_for(key, tl.partitions), key, self.codec.encode(beat)
        )
        self._count("heartbeats")


class _Beat:
    """`StepContext.heartbeat` for one remote attempt: the first heartbeat goes at once,
    then at most one per third of the task's heartbeat interval (the rest are dropped;
    a body that keeps calling keeps the attempt alive)."""

    def __init__(self, worker: TaskWorker, tl: TaskLog, task: StepTask) -> None:
        self._worker, self._tl, self._task = worker, tl, task
        hb = task.heartbeat_ms
        self._every = hb / 3000 if hb else QUIET_HEARTBEAT
        self._last: float | None = None
        self._lock = threading.Lock()

    def __call__(self, details: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last < self._every:
                return
            self._last = now
        self._worker._heartbeat(self._tl, self._task, details)


@dataclass(frozen=True, slots=True)
class _Held:
    """A task taken from ``partition`` at ``offset`` during assignment ``generation``."""

    generation: int
    partition: int
    offset: int
    task: StepTask
    size: int  # bytes of its record


@dataclass(frozen=True)
class _Served:
    """A step this worker serves, and how to rebuild its positional arguments from JSON:
    each parameter's type hint validates its argument (a pydantic model arrives as the
    model), ``rest`` is the hint of ``*args``; None: taken as it is."""

    step: StepDef
    params: tuple[TypeAdapter[Any] | None, ...]
    rest: TypeAdapter[Any] | None

    @classmethod
    def of(cls, sd: StepDef) -> _Served:
        hints = type_hints(sd.fn)  # unresolvable: the arguments are taken as they are

        def adapter(name: str) -> TypeAdapter[Any] | None:
            hint = hints.get(name, Any)
            return None if hint is Any else TypeAdapter(hint)

        kinds = inspect.Parameter
        params, rest = [], None
        for p in inspect.signature(sd.fn).parameters.values():
            if p.name == sd.context_param:
                continue
            if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD):
                params.append(adapter(p.name))
            elif p.kind is kinds.VAR_POSITIONAL:
                rest = adapter(p.name)
        return cls(sd, tuple(params), rest)

    def arguments(self, values: Any) -> tuple[Any, ...]:
        """Raises ValueError (not a JSON array) or pydantic's ValidationError."""
        if not isinstance(values, list):
            raise ValueError(f"expected a JSON array of arguments, got {values!r:.200}")
        out = []
        for i, value in enumerate(values):
            adapter = self.params[i] if i < len(self.params) else self.rest
            out.append(value if adapter is None else adapter.validate_python(value))
        return tuple(out)


class _SentResults:
    """The results this process sent, by run and attempt id, the oldest forgotten past
    ``max_bytes``. A task delivered again to the same process (stopped after its result
    was sent and before the task's offset was committed, its partition then given back
    to it) gets the same result again instead of a second run of its body; the engine
    keeps the first one it receives of an attempt. Thread-safe (the slots' threads)."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self._max = max_bytes
        self._by: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, task: StepTask) -> bytes | None:
        with self._lock:
            return self._by.get((task.run_id, task.attempt_id)) if task.attempt_id else None

    def put(self, task: StepTask, data: bytes) -> None:
        key = (task.run_id, task.attempt_id)
        if not task.attempt_id or len(data) > self._max:
            return
        with self._lock:
            if key in self._by:
                return
            self._by[key] = data
            self._bytes += len(data)
            while self._bytes > self._max:
                self._bytes -= len(self._by.popitem(last=False)[1])


class _Offsets:
    """Per partition, the offsets of the tasks taken and not yet ended, in order. A
    partition's commit point is its first task not ended: a crash re-delivers exactly
    the tasks from there on."""

    def __init__(self) -> None:
        self._open: dict[int, OrderedDict[int, bool]] = {}  # offset -> ended
        self._next: dict[int, int] = {}  # the commit point, as far as it moved
        self._committed: dict[int, int] = {}

    @property
    def open(self) -> bool:
        """Some task taken has not ended yet."""
        return any(self._open.values())

    def take(self, p: int, offset: int) -> None:
        self._open.setdefault(p, OrderedDict())[offset] = False

    def finish(self, p: int, offset: int) -> None:
        held = self._open.get(p)
        if held is None or offset not in held:
            return
        held[offset] = True
        while held and held[next(iter(held))]:
            first, _ = held.popitem(last=False)
            self._next[p] = first + 1

    def positions(self) -> dict[int, int]:
        """Partition -> its commit point, where it moved since the partition came."""
        return dict(self._next)

    def uncommitted(self) -> dict[int, int]:
        """Partition -> its commit point, where that moved since the last commit."""
        return {p: n for p, n in self._next.items() if self._committed.get(p) != n}

    def committed(self, offsets: dict[int, int]) -> None:
        self._committed.update(offsets)

    def forget(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._open.pop(p, None)
            self._next.pop(p, None)
            self._committed.pop(p, None)


class _Slots:
    """``n`` threads that run the held tasks in the order they came.

    Daemon threads: a body still running when the process ends does not keep it alive
    (its task runs again elsewhere)."""

    def __init__(self, n: int, work: Callable[[_Held], None]) -> None:
        self._n, self._work = n, work
        self._cond = threading.Condition()
        self._waiting: deque[_Held] = deque()
        self._running = 0
        self._bytes = 0  # of the tasks waiting or running
        self._closed = False

    @property
    def held(self) -> tuple[int, int]:
        """Tasks waiting or running, and the bytes of their records."""
        with self._cond:
            return len(self._waiting) + self._running, self._bytes

    @property
    def running(self) -> int:
        with self._cond:
            return self._running

    def start(self) -> None:
        for i in range(self._n):
            threading.Thread(target=self._loop, name=f"task-{i}", daemon=True).start()

    def submit(self, held: _Held) -> None:
        with self._cond:
            self._waiting.append(held)
            self._bytes += held.size
            self._cond.notify()

    def drop(self, partitions: set[int] | None) -> int:
        """Forget the waiting tasks of ``partitions`` (None: all); how many."""
        with self._cond:
            before = len(self._waiting)
            kept = [
                h for h in self._waiting if partitions is not None and h.partition not in partitions
            ]
            self._bytes -= sum(h.size for h in self._waiting) - sum(h.size for h in kept)
            self._waiting.clear()
            self._waiting.extend(kept)
            return before - len(kept)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._waiting.clear()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                held = self._waiting.popleft()
                self._running += 1
            try:
                self._work(held)
            except Exception:  # a bug, or Kafka gone: the task is not answered; log, go on
                task = held.task
                log.exception(
                    "task %s/%d failed in the worker",
                    task.run_id,
                    task.seq,
                    extra={"run_id": task.run_id},
                )
            finally:
                with self._cond:
                    self._running -= 1
                    self._bytes -= held.size
