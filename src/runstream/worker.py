"""An engine instance: owns partitions of ``<ns>.commands`` and runs their workflows.

Per batch (ARCHITECTURE.md section 3): decide every command and internal work item
(step outcomes, due timers, recoveries) with the pure core (`engine.decide`); in one
Kafka transaction produce the facts to ``journal``, their public form to ``lifecycle``,
replies, dead letters and self-addressed commands, with the consumed offsets; commit.
Only then write the facts to each partition's projection and start the step bodies
that became runnable. A crash before the commit leaves no trace; a crash after it
leaves the projection behind the journal, and restore catches it up.

This module keeps partition ownership and the loop; Kafka is behind `topics.base.EngineLog`,
the rules are in `engine`, step bodies run in `engine.steps`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runstream.engine.budget import ActivationBudget
from runstream.engine.decide import Decider
from runstream.engine.replay import Overrun
from runstream.engine.state import RunState
from runstream.engine.steps import StepRunner, chain
from runstream.engine.timers import TimerQueue
from runstream.engine.waiters import Waiters
from runstream.engine.work import (
    Attempt,
    Batch,
    HandOver,
    LogRecord,
    Recover,
    Resume,
    StepJob,
    StepOutcome,
    Work,
)
from runstream.errors import KafkaUnavailable
from runstream.instance import STUCK, InstanceFiles
from runstream.projections.store import PartitionStore, catch_up
from runstream.schemas.codec import Codec
from runstream.schemas.records import StepHandedOver
from runstream.settings import Settings
from runstream.supervisor import stop_on_signals
from runstream.topics.base import EngineLog, TransactionAborted
from runstream.topics.kafka import open_engine_log
from runstream.topics.outbox import outbox
from runstream.topics.spec import Topics
from runstream.topics.watchdog import EXIT_HUNG, Watchdog

if TYPE_CHECKING:
    from runstream.app import App

log = logging.getLogger("runstream.worker")


#: Under load, how long a poll may wait for more commands to share one transaction.
LINGER = 0.01


@dataclass
class _Owned:
    store: PartitionStore
    position: int  # next command offset; committed by every transaction that writes p
    fresh_from: int  # commands from here on no former owner can have seen


class Worker:
    """Runs an App's workflows; ``run()`` blocks until SIGTERM/SIGINT or ``stop()``.

    Args:
        app: the workflows and steps, and the namespace.
        settings: see `runstream.Settings`; ``app``'s bootstrap, if given, wins.
        log: the log to use instead of Kafka (component tests only).
    """

    def __init__(
        self, app: App, settings: Settings | None = None, *, log: EngineLog | None = None
    ) -> None:
        self.app, self.settings = app, (settings or Settings()).with_bootstrap(app.bootstrap)
        s = self.settings
        self.instance_id = s.instance_id or f"{socket.gethostname()}-{os.getpid()}"
        self.topics, self.codec = Topics(app.namespace), Codec.default()
        self.state_dir = s.state_dir / app.namespace / self.instance_id
        self.stats: Counter[str] = Counter()  # transactions, aborted, commands, facts
        # where the loop's time goes, by phase (logged at stop)
        self.seconds: dict[str, float] = dict.fromkeys(("poll", "decide", "commit", "apply"), 0.0)
        self.status = "stopped"  # connecting, restoring, running, draining, stopped
        self._log = log
        self._decider: Decider | None = None
        self._owned: dict[int, _Owned] = {}
        self._leaving: set[int] = set()  # owned partitions being handed over: start no steps
        self._to_restore: list[int] = []
        self._timers = TimerQueue()
        self._waiters = Waiters()
        self._outcomes: queue.SimpleQueue[StepOutcome] = queue.SimpleQueue()
        self._requeued: list[Work] = []
        self._busy = False  # the last poll brought more than one command
        self._recovering: deque[Recover] = deque()  # one at a time: see Rules.recover
        self._steps = StepRunner(s.step_concurrency, self._outcomes.put)
        self._stopping, self._hurry = threading.Event(), threading.Event()
        self._watchdog = Watchdog(s.exit_on_hang)
        self._budget = ActivationBudget(s.activation_budget, on_stuck=self._stuck)
        self._files = InstanceFiles(self.state_dir, self.instance_id)
        self._parked: dict[str, str] = self._files.read_stuck()

    # -- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the instance to stop (thread-safe); asked again, it stops without waiting
        for the steps in flight."""
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()
        self._watchdog.stop_requested()

    def run(self) -> None:
        """Connect (waiting out an outage), then process until stopped."""
        if threading.current_thread() is threading.main_thread():
            stop_on_signals(self.stop)
        try:
            engine_log = self._connect()
            if engine_log is None:
                return
            self._set_status("running")
            while not self._stopping.is_set():
                self._restore_assigned(engine_log)
                polled = time.perf_counter()
                records = self._poll(engine_log)
                self.seconds["poll"] += time.perf_counter() - polled
                self._process(engine_log, records)
            self._drain(engine_log)
        finally:
            self._close()

    def _connect(self) -> EngineLog | None:
        """The log, started; None when stopped first. While Kafka is away, try again and
        again, each attempt waiting longer (up to 30 s) and saying so in one line."""
        self._set_status("connecting")
        delay = 1.0
        while not self._stopping.is_set():
            try:
                self._log = self._log or open_engine_log(
                    self.settings,
                    self.topics,
                    self.instance_id,
                    self._watchdog,
                    self._stopping.is_set,
                    connect_timeout=delay,
                )
                self._decider = Decider(
                    self.app.registry,
                    partitions=self._log.partitions,
                    journal_topic=self.topics.journal,
                    limits=self._log.limits,
                    max_recovery_attempts=self.app.max_recovery_attempts,
                    activation=self._budget,
                )
                if not self._log.start(self, self._stopping.is_set):
                    return None
                log.info(
                    "instance %s of %s started (%d partitions)",
                    self.instance_id,
                    self.app.namespace,
                    self._log.partitions,
                )
                return self._log
            except KafkaUnavailable as exc:
                if self._stopping.is_set():
                    break
                log.warning("%s; trying again", exc)
                delay = min(delay * 2, 30.0)
        return None

    def _close(self) -> None:
        self._set_status("stopped")
        self._steps.close()
        self._budget.close()
        if self._log is not None:
            self._log.close()  # revokes: the projections close
        for owned in self._owned.values():
            owned.store.close()
        self._owned.clear()
        log.info(
            "instance %s stopped: %s; seconds in %s",
            self.instance_id,
            dict(self.stats),
            {k: round(v, 1) for k, v in self.seconds.items()},
        )

    # -- partition ownership (called inside poll(), on this thread) ----------------------
    def assigned(self, partitions: list[int]) -> None:
        """Kafka gave us ``partitions``: restore them before taking their commands."""
        self._to_restore.extend(partitions)

    def revoked(self, partitions: list[int], lost: bool) -> None:
        """``partitions`` go to another instance. Revoked, not lost, they are handed over
        first (`_hand_over`); then forgotten, with any step still running on them."""
        if not lost and self._log is not None and not self._stopping.is_set():
            self._hand_over(self._log, set(partitions), self.settings.handover_timeout)
        for p in partitions:
            owned = self._owned.pop(p, None)
            if owned is not None:
                owned.store.close()
            if p in self._to_restore:
                self._to_restore.remove(p)
        self._timers.drop(set(partitions))
        self._waiters.drop(set(partitions))
        self._steps.forget(set(partitions))
        self._recovering = deque(r for r in self._recovering if r.partition not in partitions)
        self._leaving -= set(partitions)
        how = "lost" if lost else "revoked"
        log.info("partitions %s %s (process %d)", sorted(partitions), how, os.getpid())
        self._set_status(self.status)

    def _hand_over(self, engine_log: EngineLog, partitions: set[int], timeout: float) -> None:
        """Let ``partitions`` go as a deploy or a rebalance should, not as a crash: start
        none of their steps anymore, give the running ones up to ``timeout`` seconds to end
        and commit their outcomes, then record each step still open on them as handed over
        (StepHandedOver), which the next owner starts again at once, charging nothing."""
        partitions &= self._owned.keys()
        if not partitions:
            return
        began_at = time.monotonic()
        self._leaving |= partitions
        self._timers.drop(partitions)  # the next owner arms them again
        # Runs restored with a crashed step keep it as it is: the next owner recovers them.
        crashed = {r.run_id for r in self._recovering if r.partition in partitions}
        self._recovering = deque(r for r in self._recovering if r.partition not in partitions)
        # Outcomes set back by an aborted commit are of bodies that ran: keep them.
        self._requeued = [
            w for w in self._requeued if w.partition not in partitions or isinstance(w, StepOutcome)
        ]
        self._steps.drop_queued(partitions)  # not begun: handed over below
        running = self._steps.began(partitions)
        while time.monotonic() - began_at < timeout and not self._hurry.is_set():
            self._process(engine_log, [])  # commits the outcomes that came
            if not self._steps.began(partitions) and self._outcomes.empty():
                break
            with contextlib.suppress(queue.Empty):
                self._requeued.append(self._outcomes.get(timeout=0.05))
        still = self._steps.began(partitions)
        handovers = [
            HandOver(p, run_id, frozenset(seq for r, seq, _ in still if r == run_id))
            for p in sorted(partitions)
            for run_id in self._owned[p].store.running()
            if run_id not in crashed
        ]
        b = self._process(engine_log, [], then=handovers)
        handed = sum(isinstance(f, StepHandedOver) for f in b.effects.facts) if b else 0
        self.stats["handed_over"] += handed
        log.info(
            "handover of partitions %s in %.2fs: %d running steps ended here, %d handed "
            "over (%d of them had begun and run again on the next owner)",
            sorted(partitions),
            time.monotonic() - began_at,
            len(running - still),
            handed,
            len(still),
        )

    def _restore_assigned(self, engine_log: EngineLog) -> None:
        """Catch every newly assigned partition up with its journal, all in one pass."""
        if not self._to_restore:
            return
        self._set_status("restoring")
        started, partitions = time.monotonic(), sorted(self._to_restore)
        self._to_restore = []
        positions = engine_log.committed(partitions)
        ends = engine_log.end_offsets(partitions)
        stores = {p: PartitionStore(self.state_dir / f"p{p}", self.codec) for p in partitions}
        facts = catch_up(
            stores,
            engine_log.read_journal(
                {p: s.journal_offset for p, s in stores.items()}, self._stopping.is_set
            ),
        )
        if self._stopping.is_set():
            for store in stores.values():
                store.close()
            return
        for p, store in stores.items():
            self._owned[p] = _Owned(store, positions[p], ends[p])
            for due, run_id, seq in store.timers():
                self._timers.add(p, run_id, seq, due)
            crashed = store.running()
            self._recovering.extend(Recover(p, r) for r in crashed)
            # steps handed over (not crashed) start again at once, side by side
            handed = set(store.handed_over()).difference(crashed)
            self._requeued += [Recover(p, r) for r in sorted(handed)]
            self._requeued += [Resume(p, r) for r in store.parked()]
        engine_log.resume(partitions)
        log.info(
            "partitions %s restored: %d facts in %.2fs",
            partitions,
            facts,
            time.monotonic() - started,
        )
        self._set_status("running")

    # -- the loop ---------------------------------------------------------------------
    def _poll(self, engine_log: EngineLog) -> list[LogRecord]:
        """The next commands; returns early when internal work is ready."""
        limit = self.settings.batch_size
        if self._requeued or self._recovering or not self._outcomes.empty():
            return engine_log.poll(0, limit)
        if self._steps.in_flight:
            # poll() can't be woken by a finishing step: look at Kafka without waiting,
            # then wait on the step outcomes (woken at once) for a moment.
            records = engine_log.poll(0, limit)
            if not records:
                with contextlib.suppress(queue.Empty):
                    self._requeued.append(self._outcomes.get(timeout=0.002))
            return records
        wait = 0.5
        due = self._timers.next_due()
        if due is not None:
            wait = max(0.0, min(wait, due / 1000 - time.time()))
        records = engine_log.poll(wait, limit)
        if self._busy and records:  # under load: gather a bigger batch, fewer transactions
            until = time.monotonic() + LINGER
            while len(records) < limit and (left := until - time.monotonic()) > 0:
                records += engine_log.poll(left, limit - len(records))
        self._busy = len(records) > 1
        return records

    def _take_internal(self, now: int) -> list[Work]:
        items, self._requeued = self._requeued, []
        # Recover runs one by one, each alone in the process once the others drained.
        self._steps.hold = bool(self._recovering)
        if self._recovering and self._steps.running == 0:
            items.append(self._recovering.popleft())
        while True:
            try:
                items.append(self._outcomes.get_nowait())
            except queue.Empty:
                break
        items.extend(self._timers.pop_due(now, 5000))
        return items

    def _process(
        self, engine_log: EngineLog, records: list[LogRecord], then: Sequence[Work] = ()
    ) -> Batch | None:
        """Decide ``records``, the internal work that is ready, and ``then``, in that order,
        and commit what they decided in one transaction; the batch, once committed."""
        began, now = time.perf_counter(), int(time.time() * 1000)
        items: list[Work] = [*records, *self._take_internal(now), *then]
        if not items:
            return None
        assert self._decider is not None
        b, decider = Batch(self._load, now, self._parked), self._decider
        careful: set[str] = set()  # runs touched by work a former process may have seen
        started: dict[Attempt, StepJob] = {}  # by the chain, ahead of the commit
        decided: list[StepOutcome] = []  # by the chain
        try:
            for item in items:
                if item.partition in self._owned:
                    run_id = decider.handle(b, item)
                    if run_id and not self._fresh(item):
                        careful.add(run_id)
            if self.settings.chain_budget and not (self._stopping.is_set() or self._leaving):
                chain(
                    b,
                    lambda o: decider.handle(b, o) if o.partition in self._owned else None,
                    self._steps,
                    self._outcomes,
                    careful,
                    self.settings.chain_budget,
                    started,
                    decided,
                )
        except Overrun:  # delivered after its activation ended: nothing is lost, redo
            self._redo(engine_log, b, items, started, decided)
            return None
        if b.empty:
            return None
        answered = self._waiters.answer(b, decider.rules.run_info)
        decided_at = time.perf_counter()
        written = self._commit(engine_log, b)
        committed_at = time.perf_counter()
        if written is None:
            self._redo(engine_log, b, items, started, decided)
        else:
            self._waiters.committed(b, answered)
            self._apply(b, *written, started)
        self.seconds["decide"] += decided_at - began
        self.seconds["commit"] += committed_at - decided_at
        self.seconds["apply"] += time.perf_counter() - committed_at
        return None if written is None else b

    def _fresh(self, item: Work) -> bool:
        """Work no former process of this partition can have seen: its steps may run
        before their start is committed (`engine.steps.chain`)."""
        if isinstance(item, LogRecord):
            return item.offset >= self._owned[item.partition].fresh_from
        return isinstance(item, StepOutcome) and not item.isolated

    def _redo(
        self,
        engine_log: EngineLog,
        b: Batch,
        items: list[Work],
        started: dict[Attempt, StepJob],
        decided: list[StepOutcome],
    ) -> None:
        """Drop the batch: its commands are read again, its internal work is requeued, and
        what its chain ran is kept for when the redone batch schedules it again."""
        self.stats["aborted"] += 1
        if self._decider is not None:
            self._decider.forget(b.runs)
        for p, (first, _) in b.consumed.items():
            if p in self._owned:
                engine_log.seek(p, first)
        self._steps.keep(started.values(), [o for o in decided if o.key in started])
        self._recovering.extendleft(w for w in items if isinstance(w, Recover))
        self._requeued[:0] = [w for w in items if not isinstance(w, LogRecord | Recover)]
        self._requeued += [o for o in decided if o.key not in started]

    def _load(self, p: int, run_id: str) -> RunState:
        return self._owned[p].store.get(run_id)

    # -- the transaction -------------------------------------------------------------
    def _commit(
        self, engine_log: EngineLog, b: Batch
    ) -> tuple[dict[str, list[bytes]], dict[int, int]] | None:
        """Produce everything the batch decided and commit it with the consumed offsets:
        each run's facts as produced, and the journal's end per partition. None when the
        transaction had to be aborted (the batch is then redone)."""
        records, encoded = outbox(b, self.topics, self.codec, engine_log.partitions)
        engine_log.begin()
        try:
            for record in records:
                engine_log.produce(*record)
            # Offsets of every partition this transaction writes to, consumed from or not:
            # the group generation they carry fences a zombie that lost p (KIP-447).
            written = {b.partition_of(f.run_id) for f in b.effects.facts} | b.consumed.keys()
            engine_log.send_offsets({p: self._next_offset(b, p) for p in written})
            ends = engine_log.commit()
        except TransactionAborted as exc:
            log.warning("transaction aborted (%s); redoing the batch", exc)
            engine_log.abort()
            return None
        self.stats["transactions"] += 1
        self.stats["commands"] += sum(last - first + 1 for first, last in b.consumed.values())
        self.stats["facts"] += len(b.effects.facts)
        return encoded, ends

    def _next_offset(self, b: Batch, p: int) -> int:
        consumed = b.consumed.get(p)
        return consumed[1] + 1 if consumed else self._owned[p].position

    def _apply(
        self,
        b: Batch,
        encoded: dict[str, list[bytes]],
        ends: dict[int, int],
        started: dict[Attempt, StepJob],
    ) -> None:
        """After the commit: project the facts, arm timers, start the steps."""
        for p, (_, last) in b.consumed.items():
            self._owned[p].position = last + 1
        by_partition: dict[int, list[tuple[RunState, RunState, list[bytes]]]] = {}
        for run_id, data in encoded.items():
            w = b.runs[run_id]
            by_partition.setdefault(w.partition, []).append((w.before, w.after, data))
        for p, changes in by_partition.items():
            self._owned[p].store.commit(changes, ends[p])
            for before, after, _ in changes:
                self._timers.update(p, after.run_id, before.timers(), after.timers())
        if self._parked and any(r in b.runs for r in self._parked):
            self._parked = {r: why for r, why in self._parked.items() if r not in b.runs}
            self._files.write_stuck(self._parked)
        # Stopping, or on a partition being handed over, no step starts (the handover
        # records it); one that ran ahead of an aborted commit gets its outcome delivered.
        steps, stopping = self._steps, self._stopping.is_set()
        steps.submit(
            [
                j
                for j in b.effects.steps
                if j.key not in started
                and (not (stopping or j.partition in self._leaving) or steps.ran_ahead(j.key))
            ]
        )

    def _drain(self, engine_log: EngineLog) -> None:
        """On stop: take no new commands, and hand every partition over (`_hand_over`),
        giving the steps still running ``stop_timeout`` to end."""
        self._set_status("draining")
        engine_log.pause(list(self._owned))
        self._hand_over(engine_log, set(self._owned), self.settings.stop_timeout)

    # -- health, stuck workflow code ---------------------------------------------------
    def _set_status(self, status: str) -> None:
        if status != self.status:
            log.info("instance %s: %s", self.instance_id, status)
        self.status = status
        self._files.write_health(status, sorted(self._owned))

    def _stuck(self, run_id: str) -> None:
        """Workflow code of ``run_id`` blocks in a call nothing can interrupt: remember the
        run (the restarted instance parks it before running it again), then restart."""
        self._parked[run_id] = STUCK
        self._files.write_stuck(self._parked)
        if self.settings.exit_on_hang:
            logging.shutdown()
            os._exit(EXIT_HUNG)
