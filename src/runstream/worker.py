"""An engine instance: owns partitions of ``<ns>.commands`` and runs their workflows.

Per batch (ARCHITECTURE.md section 3): decide every command and internal work item
(step outcomes, due timers, recoveries) with the pure core (`engine.decide`); in one
Kafka transaction produce the facts to ``journal``, their public form to ``lifecycle``,
replies, dead letters and self-addressed commands, with the consumed offsets; commit.
Only then write the facts to each partition's projection and start the step bodies
that became runnable. A crash before the commit leaves no trace; a crash after it
leaves the projection behind the journal, and restore catches it up.

This module keeps partition ownership and the loop; Kafka is behind `topics.base.EngineLog`
and the transaction in `topics.outbox`, the rules are in `engine`, internal work waits in
`runtime.inbox`, step bodies run in `runtime.steps`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from runstream.engine.decide import Decider
from runstream.engine.interceptors import ended, tell_ended
from runstream.engine.requests import Overrun
from runstream.engine.state import LimitState, RunState, State
from runstream.engine.waiters import Waiters
from runstream.engine.work import Attempt, Batch, HandOver, LogRecord, StepJob, StepOutcome, Work
from runstream.errors import ConfigError
from runstream.instance import InstanceFiles, StuckRuns
from runstream.metrics import EngineMetrics, MetricsServer, Snapshot, serve
from runstream.ownership import Partitions
from runstream.runtime.budget import ActivationBudget
from runstream.runtime.inbox import Inbox
from runstream.runtime.membership import Membership
from runstream.runtime.steps import StepRunner, chain
from runstream.schemas.codec import Codec
from runstream.schemas.records import END_FACTS, LIMIT_PREFIX, StepHandedOver
from runstream.settings import Settings
from runstream.snapshots import Snapshots
from runstream.standby import Standbys
from runstream.supervisor import stop_on_signals
from runstream.topics import lifecycle_wire
from runstream.topics.admin import client_config
from runstream.topics.base import EngineLog
from runstream.topics.blobstore import KafkaBlobs
from runstream.topics.kafka import KafkaLog, open_engine_log
from runstream.topics.outbox import Committed, commit
from runstream.topics.spec import Topics
from runstream.topics.watchdog import EXIT_HUNG, Watchdog

if TYPE_CHECKING:
    from runstream.app import App

log = logging.getLogger("runstream.worker")


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
        registry = app.registry
        self.metrics = EngineMetrics(
            lambda step: registry.step_by_name(step).policy.group or "", self.stats, self.seconds
        )
        self._metrics_server: MetricsServer | None = None
        self._taken_ms: dict[int, int] = {}  # partition -> timestamp of the last command taken
        self._log = log
        self._decider: Decider | None = None
        self._lifecycle: lifecycle_wire.Wire | None = None  # set at connect (a registry id)
        self._owned = Partitions(self.state_dir, self.codec)
        self._inbox = Inbox()
        self._waiters = Waiters()
        self._steps = StepRunner(
            s.step_concurrency, self._inbox.outcomes.put, app.registry.interceptors
        )
        self._stopping, self._hurry = threading.Event(), threading.Event()
        self._watchdog = Watchdog(s.exit_on_hang)
        self._budget = ActivationBudget(s.activation_budget, on_stuck=self._stuck)
        self._blobs = KafkaBlobs(client_config(s.bootstrap(), s.kafka), self.topics.blobs)
        self._files = InstanceFiles(self.state_dir, self.instance_id)
        self._parked = StuckRuns(self._files)
        self._membership = Membership(s.group_session())  # how long steps may run ahead
        self._snapshots = Snapshots(None, 0, 0)  # set at connect, once the topic is known

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
            self._serve_metrics()
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
                if self._metrics_server is not None:
                    self.metrics.partitions(self._figures(engine_log))
            self._drain(engine_log)
        finally:
            self._close()

    def _connect(self) -> EngineLog | None:
        """The log, started; None when stopped first (Kafka may be away for a while)."""
        self._set_status("connecting")
        s = self.settings  # registered before anything is written in that format
        self._lifecycle = lifecycle_wire.for_engine(
            s.lifecycle_format, s.schema_registry_url, self.topics.lifecycle, self.codec
        )
        self._log = self._log or open_engine_log(
            self.settings,
            self.topics,
            self.instance_id,
            self._watchdog,
            self._stopping.is_set,
            self.app.registry.groups(),
        )
        if self._log is None or not self._log.start(self, self._stopping.is_set):
            return None
        if self.settings.standbys and isinstance(self._log, KafkaLog):
            self._owned.standbys = Standbys.of(self._log, self.state_dir, self.settings.standbys)
        self._snapshots = Snapshots(
            self._log.state_topic,
            s.snapshot_interval,
            s.finished_retention,
            self.topics,
            self.codec,
            self._lifecycle,
        )
        self._decider = Decider(
            self.app.registry,
            partitions=self._log.partitions,
            journal_topic=self.topics.journal,
            limits=self._log.limits,
            max_recovery_attempts=self.app.max_recovery_attempts,
            activation=self._budget,
            blobs=self._blobs,
        )
        log.info(
            "instance %s of %s started (%d partitions)",
            self.instance_id,
            self.app.namespace,
            self._log.partitions,
        )
        return self._log

    def _close(self) -> None:
        self._set_status("stopped")
        if self._metrics_server is not None:
            self._metrics_server.close()
        self._steps.close()
        self._budget.close()
        if self._owned.standbys is not None:
            self._owned.standbys.stop()
        self._blobs.close()
        if self._log is not None:
            self._log.close()  # revokes: the projections close
        self._owned.close()
        log.info(
            "instance %s stopped: %s; seconds in %s",
            self.instance_id,
            dict(self.stats),
            {k: round(v, 1) for k, v in self.seconds.items()},
        )

    # -- partition ownership (called inside poll(), on this thread) ----------------------
    def assigned(self, partitions: list[int]) -> None:
        """Kafka gave us ``partitions``: restore them before taking their commands."""
        self._membership.proved()  # the group's answer: a member now
        self._owned.assigned(partitions)

    def revoked(self, partitions: list[int], lost: bool) -> None:
        """``partitions`` go to another instance. Revoked, not lost, they are handed over
        first (`_hand_over`); then forgotten, with any step still running on them."""
        if not lost and self._log is not None and not self._stopping.is_set():
            self._hand_over(self._log, set(partitions), self.settings.handover_timeout)
        self._owned.release(partitions)
        self._inbox.drop(set(partitions))
        self._waiters.drop(set(partitions))
        self._steps.forget(set(partitions))
        self.metrics.released(partitions)
        for p in partitions:
            self._taken_ms.pop(p, None)
        how = "lost" if lost else "revoked"
        log.info("partitions %s %s (process %d)", sorted(partitions), how, os.getpid())
        self._set_status(self.status)

    def _hand_over(self, engine_log: EngineLog, partitions: set[int], timeout: float) -> None:
        """Let ``partitions`` go as a deploy or a rebalance should, not as a crash: start
        none of their steps anymore, give the running ones up to ``timeout`` seconds to end
        and commit their outcomes, then record each step still open on them as handed over
        (StepHandedOver), which the next owner starts again at once, charging nothing."""
        partitions = {p for p in partitions if p in self._owned}
        if not partitions:
            return
        began_at = time.monotonic()
        self._owned.leaving |= partitions
        crashed = self._inbox.let_go(partitions)  # kept as they are: the next owner recovers
        self._steps.drop_queued(partitions)  # not begun: handed over below
        running = self._steps.began(partitions)
        while time.monotonic() - began_at < timeout and not self._hurry.is_set():
            self._process(engine_log, [])  # commits the outcomes that came
            if not self._steps.began(partitions) and not self._inbox.ready():
                break
            self._inbox.wait(0.05)
        still = self._steps.began(partitions)
        handovers = [
            HandOver(p, run_id, frozenset(seq for r, seq, _ in still if r == run_id))
            for p in sorted(partitions)
            for run_id in self._owned.running(p)
            if run_id not in crashed
        ]
        self._snapshots.soon()  # the next owner restores from it, with a short tail
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
        if not self._owned.restoring:
            return
        self._set_status("restoring")
        began = time.perf_counter()
        restored = self._owned.restore(engine_log, self._stopping.is_set)
        if restored:
            self.metrics.restore_seconds.observe(time.perf_counter() - began)
        for p, store in restored.items():
            crashed = store.running()
            alone = {r for r in crashed if _recovers_alone(store.get(r))}
            self._inbox.restored(
                p, store.timers(), crashed, alone, store.handed_over(), store.parked()
            )
            if self._metrics_server is not None:  # the limits' figures from the start
                for limit in store.ids(LIMIT_PREFIX):
                    state = store.get(limit)
                    if isinstance(state, LimitState):
                        self.metrics.limit(p, state)
        self._set_status("running")

    # -- the loop ---------------------------------------------------------------------
    def _poll(self, engine_log: EngineLog) -> list[LogRecord]:
        in_flight, owning = bool(self._steps.in_flight), bool(self._owned)
        return self._inbox.poll(engine_log.poll, self.settings.batch_size, in_flight, owning)

    def _process(
        self, engine_log: EngineLog, records: list[LogRecord], then: Sequence[Work] = ()
    ) -> Batch | None:
        """Decide ``records``, the internal work that is ready, and ``then``, in that order,
        and commit what they decided in one transaction; the batch, once committed."""
        began, now = time.perf_counter(), int(time.time() * 1000)
        items: list[Work] = [*records, *self._inbox.take(now, self._steps), *then]
        if not items and not self._snapshots.due(now):
            return None
        assert self._decider is not None
        b, decider = Batch(self._owned.load, now, self._parked, self._owned.since), self._decider
        careful: set[str] = set()  # runs touched by work a former process may have seen
        started: dict[Attempt, StepJob] = {}  # by the chain, ahead of the commit
        decided: list[StepOutcome] = []  # by the chain
        try:
            for item in items:
                if item.partition in self._owned:
                    run_id = decider.handle(b, item)
                    if run_id and not self._owned.fresh(item):
                        careful.add(run_id)
            # No longer than membership is proved: a freeze during the chain shows as
            # its budget spent, and starts nothing more.
            budget = min(self.settings.chain_budget, self._membership.left())
            if budget > 0 and not (self._stopping.is_set() or self._owned.leaving):
                chain(
                    b,
                    lambda o: decider.handle(b, o) if o.partition in self._owned else None,
                    self._steps,
                    self._inbox.outcomes,
                    careful,
                    budget,
                    started,
                    decided,
                )
        except Overrun:  # delivered after its activation ended: nothing is lost, redo
            self._redo(engine_log, b, items, started, decided)
            return None
        snapshot = self._snapshots.take(now, self._owned.stores(), b.runs)  # none unless due
        if b.empty and not snapshot:
            if b.changed:  # nothing to commit, but a state change to keep (Batch.changed)
                self._project(b, Committed({}, {}))
            return None
        answered = self._waiters.answer(b, decider.run_info)
        decided_at, sent_at = time.perf_counter(), time.monotonic()
        written = commit(
            engine_log, b, self.topics, self.codec, self._owned.position, self._lifecycle, snapshot
        )
        committed_at = time.perf_counter()
        if written is None:
            self._snapshots.aborted()
            self._redo(engine_log, b, items, started, decided)
        else:
            self._snapshots.committed()
            self._waiters.committed(b, answered)
            self._apply(b, written, started, sent_at)
            if self._metrics_server is not None:  # metrics off: they cost nothing
                self.metrics.committed(b, committed_at - decided_at)
                self._taken_ms.update((r.partition, r.timestamp_ms) for r in records)
        self.seconds["decide"] += decided_at - began
        self.seconds["commit"] += committed_at - decided_at
        self.seconds["apply"] += time.perf_counter() - committed_at
        return None if written is None else b

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
        self._membership.doubted()  # a zombie's commit aborts: start nothing ahead
        if self._decider is not None:
            self._decider.forget(b.runs)
        first: dict[int, int] = {}  # every command taken, decided or not (an overrun)
        for item in items:
            if isinstance(item, LogRecord) and item.partition in self._owned:
                first.setdefault(item.partition, item.offset)
        for p, offset in first.items():
            engine_log.seek(p, offset)
        self._steps.keep(started.values(), [o for o in decided if o.key in started])
        self._inbox.put_back(items, [o for o in decided if o.key not in started])

    def _apply(
        self, b: Batch, written: Committed, started: dict[Attempt, StepJob], sent_at: float
    ) -> None:
        """After the commit (begun at ``sent_at``): count it, project the facts, arm
        timers, start the steps."""
        self.stats["transactions"] += 1
        if b.consumed or b.effects.facts:  # it sent offsets (`outbox.commit`), which the
            self._membership.proved(sent_at)  # group's coordinator took: a member then
        self.stats["commands"] += sum(last - first + 1 for first, last in b.consumed.values())
        self.stats["facts"] += len(b.effects.facts)
        self._project(b, written)
        self._parked.release(b.runs)
        if self.app.registry.interceptors:
            self._tell_ended(b)
        # Stopping, or on a partition being handed over, no step starts (the handover
        # records it); one that ran ahead of an aborted commit gets its outcome delivered.
        steps, stopping = self._steps, self._stopping.is_set()
        steps.submit(
            [
                j
                for j in b.effects.steps
                if j.key not in started
                and (not (stopping or j.partition in self._owned.leaving) or steps.ran_ahead(j.key))
            ]
        )

    def _tell_ended(self, b: Batch) -> None:
        """Tell the interceptors of each run this committed batch ended (once: a redone
        batch is a new one, and only a committed one comes here)."""
        for fact in b.effects.facts:
            status = END_FACTS.get(type(fact))
            work = b.runs.get(fact.run_id)
            if status is None or work is None or not isinstance(work.after, RunState):
                continue
            run = ended(work.after, getattr(fact, "at_ms", b.now))
            tell_ended(self.app.registry.interceptors, run)

    def _project(self, b: Batch, written: Committed) -> None:
        """Write what ``b`` changed to the projections and arm its runs' timers."""
        for p, before, after in self._owned.project(b, written):
            self._inbox.timers.update(p, after.run_id, before.timers(), after.timers())

    def _drain(self, engine_log: EngineLog) -> None:
        """On stop: take no new commands, and hand every partition over (`_hand_over`),
        giving the steps still running ``stop_timeout`` to end."""
        self._set_status("draining")
        engine_log.pause(list(self._owned))
        self._hand_over(engine_log, set(self._owned), self.settings.stop_timeout)

    # -- metrics ----------------------------------------------------------------------
    def _serve_metrics(self) -> None:
        s = self.settings
        try:
            self._metrics_server = serve(self.metrics.registry, s.metrics_host, s.metrics_port)
        except OSError as exc:  # the port is taken, say: one line that says so
            where = f"{s.metrics_host}:{s.metrics_port}"
            raise ConfigError(f"cannot serve metrics on {where}: {exc}") from exc
        if self._metrics_server is not None:
            log.info("metrics on http://%s:%d/metrics", s.metrics_host, self._metrics_server.port)

    def _figures(self, engine_log: EngineLog) -> Snapshot:
        """The per-partition figures now (no request to Kafka: cheap at every turn)."""
        lag = engine_log.lag({p: self._owned.position(p) for p in self._owned})
        wall_ms = time.time() * 1000
        age = {
            p: (wall_ms - self._taken_ms.get(p, self._owned.since(p))) / 1000 if n else 0.0
            for p, n in lag.items()
        }
        return Snapshot(lag, age, len(self._inbox.timers), len(self._owned))

    # -- health, stuck workflow code ---------------------------------------------------
    def _set_status(self, status: str) -> None:
        if status != self.status:
            log.info("instance %s: %s", self.instance_id, status)
        self.status = status
        self._files.write_health(status, list(self._owned))

    def _stuck(self, run_id: str) -> None:
        """Workflow code of ``run_id`` blocks in a call nothing can interrupt: remember the
        run (the restarted instance parks it before running it again), then restart."""
        self._parked.add(run_id)
        if self.settings.exit_on_hang:
            logging.shutdown()
            os._exit(EXIT_HUNG)


def _recovers_alone(state: State) -> bool:
    return isinstance(state, RunState) and state.recovers_alone()
