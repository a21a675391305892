"""An engine instance: owns partitions of ``<ns>.commands`` and runs their workflows.

Per batch (ARCHITECTURE.md section 3): begin a Kafka transaction; decide every
command and internal work item (step outcomes, due timers) with the pure core;
produce the facts to ``journal``, their public form to ``lifecycle``, replies,
dead letters and self-addressed commands; send the consumed offsets; commit. Only
then write the facts to each partition's projection and start the step bodies that
became runnable. A crash before the commit leaves no trace; a crash after it leaves
the projection behind the journal, and restore catches it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from runstream.config import client_config, resolve_bootstrap
from runstream.engine import lifecycle, payload
from runstream.engine.decide import Decider, Effects, StepOutcome, StepTask, run_info
from runstream.engine.reducer import apply
from runstream.engine.state import Fact, RunState
from runstream.errors import (
    DecodeError,
    InvalidInput,
    RunNotFound,
    TerminalStepError,
    TopicError,
    WorkflowNotFound,
)
from runstream.projections.store import PartitionStore
from runstream.schemas.codec import Codec
from runstream.topics.admin import check_copartitioned, ensure_topics
from runstream.topics.consume import consume_ready
from runstream.topics.partitioner import partition_for
from runstream.topics.spec import Topics

if TYPE_CHECKING:
    from runstream.app import App

log = logging.getLogger("runstream.worker")

#: Exit status of an instance that ended itself because a Kafka call hung.
EXIT_HUNG = 75

#: Step outputs above this go to the run as a failure instead of an oversize record.
MAX_PAYLOAD_BYTES = 900 * 1024


@dataclass
class WorkerSettings:
    """Knobs of one engine instance; the defaults suit most deployments."""

    # Stable per instance: names its transactional.id, state dir and static group
    # membership, so a restart takes its partitions back at once. Never share one.
    instance_id: str = ""
    state_dir: Path = Path("./state")
    batch_size: int = 500  # commands consumed per transaction at most
    step_concurrency: int = 16  # local step bodies running at once
    transaction_timeout_ms: int = 10_000  # how long a crashed instance can hold its partitions
    session_timeout_ms: int = 10_000
    create_topics: bool = True
    exit_on_hang: bool = True  # end the process if a Kafka call hangs (see Worker._watchdog)
    partitions: int = 12  # only used when this instance creates the namespace's topics
    kafka: dict[str, Any] = field(default_factory=dict)  # extra librdkafka settings


@dataclass
class _Owned:
    store: PartitionStore
    generation: int
    position: int  # next command offset; committed by every transaction that writes p


class _Batch:
    """The working copies, effects and consumed offsets of one transaction."""

    def __init__(self) -> None:
        self.runs: dict[str, tuple[int, RunState, RunState]] = {}  # id -> (p, before, after)
        self.effects = Effects()
        self.consumed: dict[int, tuple[int, int]] = {}  # partition -> (first, last) offset
        self.raw: list[tuple[str, int | None, bytes | None, bytes]] = []  # forwards, replies
        self.encoded: dict[str, list[bytes]] = {}  # run id -> its new facts, as produced

    def state(self, owned: dict[int, _Owned], p: int, run_id: str) -> RunState:
        entry = self.runs.get(run_id)
        if entry is None:
            before = owned[p].store.get(run_id)
            entry = self.runs[run_id] = (p, before, before.copy())
        return entry[2]


class Worker:
    """Runs an App's workflows; ``run()`` blocks until SIGTERM/SIGINT or ``stop()``."""

    def __init__(
        self, app: App, settings: WorkerSettings | None = None, bootstrap: str | None = None
    ) -> None:
        self.app = app
        self.settings = s = settings or WorkerSettings()
        self.instance_id = s.instance_id or f"{socket.gethostname()}-{os.getpid()}"
        self.bootstrap = resolve_bootstrap(bootstrap or app.bootstrap)
        self.topics = Topics(app.namespace)
        self._journal_topic = self.topics.journal  # compared per delivery report
        self.codec = Codec.default()
        self.decider = Decider(app.registry, app.max_recovery_attempts)
        self.state_dir = Path(s.state_dir) / app.namespace / self.instance_id
        self._owned: dict[int, _Owned] = {}
        self._to_restore: list[int] = []
        self._generation = 0
        self._timers: list[tuple[int, int, int, str, int]] = []  # due, p, gen, run, seq
        self._outcomes: queue.SimpleQueue[tuple[int, int, StepTask, StepOutcome]] = (
            queue.SimpleQueue()
        )
        self._requeued: list[tuple[Any, ...]] = []
        self._early: list[tuple[int, int, StepTask, StepOutcome]] = []  # taken while waiting
        self._in_flight = 0
        self._journal_end: dict[int, int] = {}
        self.stats: Counter[str] = Counter()  # transactions, aborted, commands, facts
        self._stopping = threading.Event()
        self._blocked: tuple[str, float] | None = None  # a Kafka call under way, deadline
        self._executor = ThreadPoolExecutor(s.step_concurrency, thread_name_prefix="step")
        self.partitions = 0
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._restorer: Consumer | None = None

    # -- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        if self.settings.exit_on_hang:
            threading.Thread(target=self._watchdog, name="watchdog", daemon=True).start()
        self._connect()
        log.info(
            "instance %s of %s started on %s (%d partitions)",
            self.instance_id,
            self.app.namespace,
            self.bootstrap,
            self.partitions,
        )
        try:
            while not self._stopping.is_set():
                self._restore_assigned()
                self._process(self._poll())
            self._drain_in_flight(deadline=time.monotonic() + 10)
        finally:
            self._close()

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None
        return self._consumer

    @property
    def producer(self) -> Producer:
        assert self._producer is not None
        return self._producer

    def _connect(self) -> None:
        s, ns = self.settings, self.app.namespace
        try:
            self.partitions = check_copartitioned(self.bootstrap, ns)
        except TopicError:
            if not s.create_topics:
                raise
            ensure_topics(self.bootstrap, ns, s.partitions)  # a new namespace
            self.partitions = check_copartitioned(self.bootstrap, ns)
        base = {**client_config(self.bootstrap), **s.kafka}
        self._producer = Producer(
            {
                **base,
                "transactional.id": f"{ns}.engine.{self.instance_id}",
                "transaction.timeout.ms": s.transaction_timeout_ms,
                "linger.ms": 1,
                # Right after a commit the coordinator answers CONCURRENT_TRANSACTIONS
                # until its markers are written; the default 100 ms retry backoff then
                # costs ~100 ms per transaction (measured), 5 ms costs ~3 ms.
                "retry.backoff.ms": 5,
                "partitioner": "murmur2_random",
                "on_delivery": self._delivered,
            }
        )
        with self._watch("init_transactions", 75):
            self.producer.init_transactions(60)
        static = {"group.instance.id": self.instance_id} if s.instance_id else {}
        self._consumer = Consumer(
            {
                **base,
                **static,
                "group.id": f"{ns}.engine",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": s.session_timeout_ms,
                "fetch.wait.max.ms": 50,
                "client.id": f"{ns}.engine.{self.instance_id}",
            }
        )
        self._restorer = Consumer(
            {
                **base,
                "group.id": f"{ns}.restore",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 50,
            }
        )
        self.consumer.subscribe(
            [self.topics.commands],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )

    def _close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._consumer is not None:
            self._consumer.close()  # leaves the group; on_revoke closes the projections
        for owned in self._owned.values():
            owned.store.close()
        self._owned.clear()
        if self._restorer is not None:
            self._restorer.close()
        log.info("instance %s stopped: %s", self.instance_id, dict(self.stats))

    # -- partition ownership (these run inside consume(), on this thread) -------------
    def _on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        consumer.incremental_assign(tps)
        consumer.pause(tps)  # no commands until the projection has caught up
        self._to_restore.extend(tp.partition for tp in tps)

    def _on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        for tp in tps:
            owned = self._owned.pop(tp.partition, None)
            if owned is not None:
                owned.store.close()
            if tp.partition in self._to_restore:
                self._to_restore.remove(tp.partition)
        consumer.incremental_unassign(tps)

    def _restore_assigned(self) -> None:
        """Catch every newly assigned partition up with its journal, all in one pass."""
        if not self._to_restore:
            return
        started = time.monotonic()
        tps = [TopicPartition(self.topics.commands, p) for p in self._to_restore]
        self._to_restore = []
        # Waits while another instance's transaction holds offsets of these partitions
        # (KIP-447): only then is the journal's end final.
        with self._watch("committed", 75):
            committed = self.consumer.committed(tps, timeout=60)
        for tp in committed:
            position = tp.offset
            if position < 0:  # nothing committed yet: the partition's first offset
                position = self.consumer.get_watermark_offsets(tp, timeout=30)[0]
            store = PartitionStore(self.state_dir / f"p{tp.partition}", self.codec)
            self._generation += 1
            self._owned[tp.partition] = _Owned(store, self._generation, position)
        restored = {tp.partition: self._owned[tp.partition] for tp in tps}
        facts = self._catch_up({p: owned.store for p, owned in restored.items()})
        for p, owned in restored.items():
            store, gen = owned.store, owned.generation
            for due, run_id, seq in store.timers():
                heapq.heappush(self._timers, (due, p, gen, run_id, seq))
            self._requeued += [("recover", p, gen, r) for r in store.running()]
            self._requeued += [("resume", p, gen, r) for r in store.parked()]
        self.consumer.resume(tps)
        log.info(
            "partitions %s restored: %d facts in %.2fs",
            sorted(restored),
            facts,
            time.monotonic() - started,
        )

    def _catch_up(self, stores: dict[int, PartitionStore]) -> int:
        """Apply each journal partition from its projection's offset to its (stable) end."""
        assert self._restorer is not None
        self._restorer.assign(
            [TopicPartition(self.topics.journal, p, s.journal_offset) for p, s in stores.items()]
        )
        changes: dict[int, dict[str, tuple[RunState, RunState, list[bytes]]]] = {
            p: {} for p in stores
        }
        offsets = {p: s.journal_offset for p, s in stores.items()}
        count, open_partitions = 0, set(stores)
        while open_partitions:
            msg = self._restorer.poll(1.0)
            if msg is None:
                continue
            err, p = msg.error(), msg.partition()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                open_partitions.discard(p)
                continue
            name, rec = self.codec.decode(msg.value())
            run_id, runs = rec["run_id"], changes[p]
            if run_id not in runs:
                before = stores[p].get(run_id)
                runs[run_id] = (before, before.copy(), [])
            _, after, encoded = runs[run_id]
            apply(after, Fact(name, rec))
            encoded.append(msg.value())
            count, offsets[p] = count + 1, msg.offset() + 1
            if len(runs) >= 2000:
                stores[p].commit(runs.values(), offsets[p])
                changes[p] = {}
        for p, runs in changes.items():
            if runs:
                stores[p].commit(runs.values(), offsets[p])
        self._restorer.unassign()
        return count

    # -- the loop ---------------------------------------------------------------------
    def _poll(self) -> list[Message]:
        """The next commands; returns early when internal work is ready."""
        limit = self.settings.batch_size
        if self._requeued or self._early or not self._outcomes.empty():
            return consume_ready(self.consumer, 0, limit)
        if self._in_flight:
            # consume() can't be woken by a finishing step: look at Kafka without
            # waiting, then wait on the step outcomes (woken at once) for a moment.
            msgs = consume_ready(self.consumer, 0, limit)
            if not msgs:
                with contextlib.suppress(queue.Empty):
                    self._early.append(self._outcomes.get(timeout=0.002))
                    self._gather_wave()
            return msgs
        wait = 0.5
        if self._timers:
            wait = max(0.0, min(wait, self._timers[0][0] / 1000 - time.time()))
        return consume_ready(self.consumer, wait, limit)

    def _gather_wave(self) -> None:
        """Steps started by one transaction tend to end together: wait up to 1 ms for the
        rest of them, so their outcomes share the next transaction instead of two."""
        deadline = time.monotonic() + 0.001
        while len(self._early) < self._in_flight:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._early.append(self._outcomes.get(timeout=remaining))

    def _take_internal(self, now: int) -> list[tuple[Any, ...]]:
        items, self._requeued = self._requeued, []
        outcomes, self._early = self._early, []
        with contextlib.suppress(queue.Empty):
            while True:
                outcomes.append(self._outcomes.get_nowait())
        for p, gen, task, outcome in outcomes:
            self._in_flight -= 1
            items.append(("outcome", p, gen, task, outcome))
        while self._timers and self._timers[0][0] <= now and len(items) < 5000:
            _due, p, gen, run_id, seq = heapq.heappop(self._timers)
            items.append(("timer", p, gen, run_id, seq))
        return items

    def _process(self, msgs: list[Message]) -> None:
        now = int(time.time() * 1000)
        items = self._take_internal(now)
        if not msgs and not items:
            return
        batch = _Batch()
        for msg in msgs:
            self._handle_message(batch, msg, now)
        for item in items:
            self._handle_item(batch, item, now)
        for dead in batch.effects.dead_letters:
            self._dead_letter(batch, None, dead["reason"], now, dead["run_id"])
        if not batch.consumed and not batch.effects.facts and not batch.raw:
            return
        if self._commit(batch):
            self.stats["transactions"] += 1
            self.stats["commands"] += sum(
                last - first + 1 for first, last in batch.consumed.values()
            )
            self.stats["facts"] += len(batch.effects.facts)
            self._apply(batch)
        else:
            self.stats["aborted"] += 1
            self._requeued = items + self._requeued

    def _handle_message(self, batch: _Batch, msg: Message, now: int) -> None:
        err = msg.error()
        if err is not None:
            log.warning("consume error: %s", err)
            return
        p, offset = msg.partition(), msg.offset()
        if p not in self._owned:
            return  # revoked within this poll; the new owner reads it again
        first, _ = batch.consumed.get(p, (offset, offset))
        batch.consumed[p] = (first, offset)
        value = msg.value() or b""
        try:
            name, rec = self.codec.decode(value)
        except DecodeError as exc:
            return self._dead_letter(batch, msg, f"undecodable record ({exc})", now)
        handler = _COMMANDS.get(name)
        if handler is None:
            return self._dead_letter(batch, msg, f"{name} is not a command", now)
        run_id = rec["run_id"]
        expected = partition_for(run_id.encode(), self.partitions)
        if expected != p:  # a producer with another partitioner: route it to its owner
            batch.raw.append((self.topics.commands, expected, run_id.encode(), value))
            return
        state = batch.state(self._owned, p, run_id)
        self._decide(
            batch,
            p,
            state,
            lambda: handler(self, batch, state, rec, now),
            msg,
            now,
            workflow=rec.get("workflow", ""),
        )

    def _decide(
        self,
        batch: _Batch,
        p: int,
        state: RunState,
        decision: Callable[[], None],
        msg: Message | None,
        now: int,
        workflow: str = "",
    ) -> None:
        """Run one decision; if it raises, undo its effects and dead-letter its cause."""
        mark, snapshot = batch.effects.mark(), state.copy()
        try:
            decision()
        except (WorkflowNotFound, InvalidInput, RunNotFound) as exc:
            self._undo(batch, state.run_id, mark, snapshot)
            self._dead_letter(batch, msg, str(exc), now, state.run_id)
            if not isinstance(exc, RunNotFound):
                ev = lifecycle.rejected(state.run_id, now, workflow, str(exc))
                batch.raw.append(
                    (
                        self.topics.lifecycle,
                        p,
                        state.run_id.encode(),
                        self.codec.encode("LifecycleEvent", ev),
                    )
                )
        except Exception as exc:  # a bug must not block the partition: park the cause
            log.exception("decision failed for run %s", state.run_id)
            self._undo(batch, state.run_id, mark, snapshot)
            self._dead_letter(batch, msg, f"internal error: {exc!r}", now, state.run_id)

    @staticmethod
    def _undo(batch: _Batch, run_id: str, mark: tuple[int, ...], snapshot: RunState) -> None:
        batch.effects.rollback(mark)
        p, before, _ = batch.runs[run_id]
        batch.runs[run_id] = (p, before, snapshot)

    def _handle_item(self, batch: _Batch, item: tuple[Any, ...], now: int) -> None:
        kind, p, gen = item[0], item[1], item[2]
        owned = self._owned.get(p)
        if owned is None or owned.generation != gen:
            return  # the partition moved away since: its new owner recovers the run
        if kind == "outcome":
            task, outcome = item[3], item[4]
            state = batch.state(self._owned, p, task.run_id)
            fn: Callable[[], None] = lambda: self.decider.step_outcome(  # noqa: E731
                state, outcome, task.step, now, batch.effects
            )
        else:
            state = batch.state(self._owned, p, item[3])
            if kind == "timer":
                fn = lambda: self.decider.timer_due(state, item[4], now, batch.effects)  # noqa: E731
            elif kind == "recover":
                fn = lambda: self.decider.recover(state, now, batch.effects)  # noqa: E731
            else:
                fn = lambda: self.decider.resume(state, now, batch.effects)  # noqa: E731
        self._decide(batch, p, state, fn, None, now)

    def _dead_letter(
        self, batch: _Batch, msg: Message | None, reason: str, now: int, run_id: str | None = None
    ) -> None:
        # Without a message, the cause is a run (e.g. dead): point at its journal partition.
        rec = {
            "reason": reason,
            "source_topic": msg.topic() if msg else self.topics.journal,
            "partition": msg.partition() if msg else batch.runs[run_id][0] if run_id else -1,
            "offset": msg.offset() if msg else -1,
            "key": msg.key() if msg else None,
            "value": msg.value() if msg else None,
            "run_id": run_id,
            "at_ms": now,
        }
        log.warning("dead letter: %s", reason)
        key = msg.key() if msg else (run_id or "").encode()
        batch.raw.append((self.topics.dlq, None, key, self.codec.encode("DeadLetter", rec)))

    # -- the transaction -------------------------------------------------------------
    def _commit(self, batch: _Batch) -> bool:
        """Produce everything the batch decided and commit it with the consumed offsets.
        False when the transaction had to be aborted (the batch is then redone)."""
        producer, encode = self.producer, self.codec.encode
        journal, lifecycle_topic = self._journal_topic, self.topics.lifecycle
        fx = batch.effects
        self._journal_end.clear()
        producer.begin_transaction()
        try:
            for fact in fx.facts:
                run_id = fact.rec["run_id"]
                p = batch.runs[run_id][0]
                data = encode(fact.name, fact.rec)
                batch.encoded.setdefault(run_id, []).append(data)
                self._produce(journal, p, run_id.encode(), data)
            for ev in fx.lifecycle:
                run_id = ev["run_id"]
                self._produce(
                    lifecycle_topic,
                    batch.runs[run_id][0],
                    run_id.encode(),
                    encode("LifecycleEvent", ev),
                )
            for key, name, rec in fx.commands:
                self._produce(
                    self.topics.commands,
                    partition_for(key.encode(), self.partitions),
                    key.encode(),
                    encode(name, rec),
                )
            for topic, partition, key, value in batch.raw:
                self._produce(topic, partition, key, value)
            # Offsets of every partition this transaction writes to, consumed from or
            # not: the group generation they carry fences a zombie that lost p (KIP-447)
            # even when its batch holds only step outcomes or timers.
            written = {batch.runs[f.rec["run_id"]][0] for f in fx.facts}
            offsets = [
                TopicPartition(self.topics.commands, p, self._next_offset(batch, p))
                for p in written | batch.consumed.keys()
            ]
            if offsets:
                metadata = self.consumer.consumer_group_metadata()
                self._txn_call(
                    "send_offsets_to_transaction",
                    lambda: producer.send_offsets_to_transaction(offsets, metadata, 30),
                )
            self._txn_call("commit_transaction", lambda: producer.commit_transaction(30))
        except KafkaException as exc:
            err = exc.args[0]
            if not err.txn_requires_abort():
                raise  # fatal (e.g. fenced by a newer instance): this process must restart
            log.warning("transaction aborted (%s); redoing the batch", err)
            self._txn_call("abort_transaction", lambda: producer.abort_transaction(30))
            for p, (first, _) in batch.consumed.items():
                if p in self._owned:
                    self.consumer.seek(TopicPartition(self.topics.commands, p, first))
            return False
        return True

    def _txn_call(self, what: str, call: Callable[[], object], limit: float = 45.0) -> None:
        """Call a transactional API, again while librdkafka says the error is retriable.
        Past ``limit`` seconds the watchdog ends the process (see `_watchdog`)."""
        with self._watch(what, limit):
            while True:
                try:
                    call()
                    return
                except KafkaException as exc:
                    if not exc.args[0].retriable():
                        raise
                    log.warning("%s: %s; retrying", what, exc.args[0])
                    time.sleep(0.1)

    @contextlib.contextmanager
    def _watch(self, what: str, limit: float) -> Iterator[None]:
        self._blocked = (what, time.monotonic() + limit)
        try:
            yield
        finally:
            self._blocked = None

    def _watchdog(self) -> None:
        """End the process when a Kafka call outlives its deadline.

        librdkafka can block in a transactional call forever when the group or
        transaction coordinator dies at the wrong moment (librdkafka issues 5456 and
        5511). Nothing can cancel the call, and a hung instance holds its partitions:
        exiting is safe (nothing uncommitted counts) and lets the supervisor of
        `runstream worker` start the instance again, which aborts the open transaction.
        """
        while True:
            time.sleep(1.0)
            blocked = self._blocked
            if blocked is not None and time.monotonic() > blocked[1]:
                log.critical("%s did not return; exiting so this instance restarts", blocked[0])
                logging.shutdown()
                os._exit(EXIT_HUNG)

    def _next_offset(self, batch: _Batch, p: int) -> int:
        consumed = batch.consumed.get(p)
        return consumed[1] + 1 if consumed else self._owned[p].position

    def _produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:  # local queue full: let librdkafka send some
                self.producer.poll(0.05)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        # A failed delivery needs nothing here: commit_transaction then fails as abortable.
        if err is None and msg.topic() == self._journal_topic:
            p, end = msg.partition(), msg.offset() + 1
            if end > self._journal_end.get(p, 0):
                self._journal_end[p] = end

    def _apply(self, batch: _Batch) -> None:
        """After the commit: project the facts, arm timers, start the steps."""
        for p, (_, last) in batch.consumed.items():
            self._owned[p].position = last + 1
        by_partition: dict[int, list[tuple[RunState, RunState, list[bytes]]]] = {}
        for run_id, data in batch.encoded.items():
            p, before, after = batch.runs[run_id]
            by_partition.setdefault(p, []).append((before, after, data))
        for p, changes in by_partition.items():
            owned = self._owned[p]
            end = self._journal_end.get(p)
            if end is None:  # delivery reports are served inside commit; never expected
                self.producer.flush(10)
                end = self._journal_end[p]
            owned.store.commit(changes, end)
            for _, after, _ in changes:
                for due, seq in after.timers():
                    heapq.heappush(self._timers, (due, p, owned.generation, after.run_id, seq))
        for task in batch.effects.steps:
            p = batch.runs[task.run_id][0]
            self._in_flight += 1
            self._executor.submit(self._execute, p, self._owned[p].generation, task)

    # -- steps ------------------------------------------------------------------------
    def _execute(self, p: int, gen: int, task: StepTask) -> None:
        """Run one step attempt (on an executor thread) and queue its outcome."""
        started = time.monotonic()
        step = task.step
        try:
            if step.is_async:
                result = asyncio.run(asyncio.wait_for(step.fn(*task.args), step.policy.timeout))
            else:
                result = step.fn(*task.args)
            output = payload.dumps(result)
            if len(output) > MAX_PAYLOAD_BYTES:
                raise TerminalStepError(
                    f"step output is {len(output)} bytes; the limit is {MAX_PAYLOAD_BYTES}"
                )
            outcome = StepOutcome(task.run_id, task.seq, task.attempt, True, output)
        except BaseException as exc:
            final = (TerminalStepError, *step.policy.non_retryable)
            outcome = StepOutcome(
                task.run_id,
                task.seq,
                task.attempt,
                False,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
                retryable=not isinstance(exc, final),
            )
        outcome.duration_ms = int((time.monotonic() - started) * 1000)
        self._outcomes.put((p, gen, task, outcome))

    def _drain_in_flight(self, deadline: float) -> None:
        """On shutdown: take no new commands, but record the steps still running."""
        self.consumer.pause(self.consumer.assignment())
        while self._in_flight and time.monotonic() < deadline:
            self._process(consume_ready(self.consumer, 0.01))
        self._process([])


def _start(w: Worker, batch: _Batch, state: RunState, rec: dict[str, Any], now: int) -> None:
    w.decider.start(state, rec, now, batch.effects)


def _signal(w: Worker, batch: _Batch, state: RunState, rec: dict[str, Any], now: int) -> None:
    w.decider.signal(state, rec, now, batch.effects)


def _cancel(w: Worker, batch: _Batch, state: RunState, rec: dict[str, Any], now: int) -> None:
    w.decider.cancel(state, rec, now, batch.effects)


def _step_result(w: Worker, batch: _Batch, state: RunState, rec: dict[str, Any], now: int) -> None:
    o = StepOutcome(
        rec["run_id"],
        rec["seq"],
        rec["attempt"],
        rec["ok"],
        rec["output"],
        rec["error"],
        rec["traceback"],
    )
    w.decider.step_outcome(state, o, None, now, batch.effects)


def _query(w: Worker, batch: _Batch, state: RunState, rec: dict[str, Any], now: int) -> None:
    info = w.codec.encode("RunInfo", run_info(state, rec["request_id"]))
    batch.raw.append((w.topics.replies, None, rec["reply_to"].encode(), info))


_COMMANDS: dict[str, Callable[[Worker, _Batch, RunState, dict[str, Any], int], None]] = {
    "StartRun": _start,
    "Signal": _signal,
    "Cancel": _cancel,
    "StepResult": _step_result,
    "Query": _query,
}
