"""Prometheus metrics of an engine instance and of a task worker (``--metrics-port``).

Every metric Runstream exposes is defined here, on a registry of its own per instance
(several engines may share a process, as in the tests). The shells update them where the
figure is known: `Worker` after each commit (from the facts committed, so an aborted
batch counts nothing), around its commit and restore; `TaskWorker` around each task.
Running totals the shells keep anyway (``stats``, the seconds per phase) and the
per-partition figures (the `Snapshot` the engine's loop takes after each turn) are read
when Prometheus scrapes; the server's thread calls nothing of Kafka's (a consumer called
from two threads can deadlock). Labels stay
bounded: workflow, step, group, limit and code names come from the code, partitions
from the namespace; never a run id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runstream.engine.state import LimitState, RunState
from runstream.schemas.records import (
    LIMIT_PREFIX,
    RunCancelled,
    RunCompleted,
    RunDead,
    RunFailed,
    RunRecovered,
    RunRejected,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepHandedOver,
)

if TYPE_CHECKING:
    from runstream.engine.work import Batch

#: Latencies, from a fast commit (ms) to a slow step (minutes).
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Records per transaction.
SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def limit_name(entity_id: str) -> str:
    """The label of a limit entity: the limit's name (a workflow's concurrency limit: the
    workflow's, all its keys together, so keys never become labels)."""
    rest = entity_id.removeprefix(LIMIT_PREFIX)
    if rest.startswith("//"):  # escaped parts (`records.entity_id`)
        return rest[2:].split("/")[0].replace("%2F", "/").replace("%25", "%")
    if len(rest) == 64 and "/" not in rest:  # too long for a key: hashed, name unknown
        return "(hashed)"
    return rest.split("/")[0]


@dataclass
class Snapshot:
    """Per-partition figures of an engine instance, as its loop last saw them."""

    lag: dict[int, int] = field(default_factory=dict)  # commands not yet taken
    backlog_age: dict[int, float] = field(default_factory=dict)  # seconds
    timers: int = 0  # due times armed: timers, retries, timeouts
    partitions: int = 0  # owned


class EngineMetrics:
    """The metrics of one engine instance.

    Args:
        group_of: a step's task group by its name ("" for a local step).
        stats: the instance's running totals (transactions, aborted, commands, facts).
        seconds: the instance's seconds in each phase of its loop.
    """

    def __init__(
        self,
        group_of: Callable[[str], str] = lambda _name: "",
        stats: Mapping[str, int] | None = None,
        seconds: Mapping[str, float] | None = None,
    ) -> None:
        r = self.registry = CollectorRegistry()
        self._group_of = group_of
        self.commit_seconds = Histogram(
            "runstream_transaction_commit_seconds",
            "Time to produce and commit one transaction.",
            buckets=SECONDS,
            registry=r,
        )
        self.batch_commands = Histogram(
            "runstream_transaction_commands",
            "Commands consumed per committed transaction.",
            buckets=SIZES,
            registry=r,
        )
        self.batch_facts = Histogram(
            "runstream_transaction_facts",
            "Journal facts written per committed transaction.",
            buckets=SIZES,
            registry=r,
        )
        wf = ["workflow"]
        self.runs_started = Counter("runstream_runs_started", "Runs started.", wf, registry=r)
        self.runs_completed = Counter("runstream_runs_completed", "Runs completed.", wf, registry=r)
        self.runs_failed = Counter(
            "runstream_runs_failed", "Runs failed, by failure code.", [*wf, "code"], registry=r
        )
        self.runs_cancelled = Counter("runstream_runs_cancelled", "Runs cancelled.", wf, registry=r)
        self.runs_dead = Counter(
            "runstream_runs_dead", "Runs dead (past max_recovery_attempts).", wf, registry=r
        )
        self.runs_rejected = Counter(
            "runstream_runs_rejected", "Starts refused, by code.", [*wf, "code"], registry=r
        )
        step = ["step", "group"]
        self.step_seconds = Histogram(
            "runstream_step_duration_seconds",
            "Duration of step attempts that completed (the body's time; group '' is local).",
            step,
            buckets=SECONDS,
            registry=r,
        )
        self.step_retries = Counter(
            "runstream_step_retries", "Step attempts failed and retried.", step, registry=r
        )
        self.step_failures = Counter(
            "runstream_step_failures", "Steps failed for good (retries spent).", step, registry=r
        )
        self.handed_over = Counter(
            "runstream_steps_handed_over",
            "Steps handed over to the next owner of their partition.",
            registry=r,
        )
        self.recoveries = Counter(
            "runstream_recoveries", "Runs recovered after a crash (each attempt).", registry=r
        )
        self.dead_letters = Counter(
            "runstream_dead_letters", "Records sent to the dead-letter topic.", ["code"], registry=r
        )
        self.restore_seconds = Histogram(
            "runstream_restore_seconds",
            "Time to restore newly assigned partitions (one pass over their journal).",
            buckets=SECONDS,
            registry=r,
        )
        self._snapshot = Snapshot()
        # limit entity -> (partition, held, waiting), for the owned partitions
        self._limits: dict[str, tuple[int, int, int]] = {}
        # `is None`: the shell's totals start empty (falsy) and fill up later
        stats, seconds = {} if stats is None else stats, {} if seconds is None else seconds
        r.register(_EngineLive(self, stats, seconds))

    # -- updates, on the instance's thread -------------------------------------------
    def committed(self, b: Batch, commit_seconds: float | None = None) -> None:
        """A transaction with ``b``'s effects committed (in ``commit_seconds``)."""
        if commit_seconds is not None:
            self.commit_seconds.observe(commit_seconds)
        self.batch_commands.observe(sum(last - first + 1 for first, last in b.consumed.values()))
        self.batch_facts.observe(len(b.effects.facts))
        for fact in b.effects.facts:
            match fact:
                case RunStarted():
                    self.runs_started.labels(fact.workflow).inc()
                case RunCompleted():
                    self.runs_completed.labels(self._workflow(b, fact.run_id)).inc()
                case RunFailed():
                    wf = self._workflow(b, fact.run_id)
                    self.runs_failed.labels(wf, fact.code or "workflow-error").inc()
                case RunCancelled():
                    self.runs_cancelled.labels(self._workflow(b, fact.run_id)).inc()
                case RunDead():
                    self.runs_dead.labels(self._workflow(b, fact.run_id)).inc()
                case RunRejected():
                    self.runs_rejected.labels(fact.workflow, fact.code).inc()
                case StepCompleted():
                    step = self.step_seconds.labels(fact.name, self._group_of(fact.name))
                    step.observe(fact.duration_ms / 1000)
                case StepFailed():
                    labels = (fact.name, self._group_of(fact.name))
                    final = fact.retry_at_ms is None
                    (self.step_failures if final else self.step_retries).labels(*labels).inc()
                case StepHandedOver():
                    self.handed_over.inc()
                case RunRecovered():
                    self.recoveries.inc()
        for letter in b.effects.dead_letters:
            self.dead_letters.labels(letter.code or "unknown").inc()
        for w in b.runs.values():
            if isinstance(w.after, LimitState):
                self.limit(w.partition, w.after)

    def limit(self, partition: int, state: LimitState) -> None:
        """The limit entity is now in ``state`` (changed, or restored)."""
        self._limits[state.run_id] = (partition, len(state.held), len(state.queue))

    def released(self, partitions: Iterable[int]) -> None:
        """``partitions`` are no longer owned: forget their limits."""
        gone = set(partitions)
        self._limits = {k: v for k, v in self._limits.items() if v[0] not in gone}

    def partitions(self, snapshot: Snapshot) -> None:
        """The instance's per-partition figures now."""
        self._snapshot = snapshot

    @staticmethod
    def _workflow(b: Batch, run_id: str) -> str:
        w = b.runs.get(run_id)
        return w.after.workflow if w is not None and isinstance(w.after, RunState) else ""


class _EngineLive(Collector):
    """What Prometheus reads at scrape time: the shell's totals and its last snapshot."""

    def __init__(
        self, m: EngineMetrics, stats: Mapping[str, int], seconds: Mapping[str, float]
    ) -> None:
        self._m, self._stats, self._seconds = m, stats, seconds

    def collect(self) -> Iterator[Metric]:
        stats, seconds, snap = dict(self._stats), dict(self._seconds), self._m._snapshot
        for name, key, doc in (
            ("transactions", "transactions", "Transactions committed."),
            ("transactions_aborted", "aborted", "Transactions aborted (their batch redone)."),
            ("commands", "commands", "Commands consumed by committed transactions."),
            ("facts", "facts", "Journal facts committed."),
        ):
            yield CounterMetricFamily(f"runstream_{name}", doc, value=stats.get(key, 0))
        phases = CounterMetricFamily(
            "runstream_loop_seconds", "Seconds the loop spent in each phase.", labels=["phase"]
        )
        for phase, s in sorted(seconds.items()):
            phases.add_metric([phase], s)
        yield phases
        lag = GaugeMetricFamily(
            "runstream_command_lag_records",
            "Commands on the partition not yet taken by this instance (as of its last fetch).",
            labels=["partition"],
        )
        age = GaugeMetricFamily(
            "runstream_command_backlog_age_seconds",
            "While commands wait on the partition: the age of the last one taken (an upper "
            "bound of the oldest waiting one's); 0 when none waits.",
            labels=["partition"],
        )
        for p, n in sorted(snap.lag.items()):
            lag.add_metric([str(p)], n)
            age.add_metric([str(p)], snap.backlog_age.get(p, 0.0))
        yield lag
        yield age
        yield GaugeMetricFamily(
            "runstream_timers_pending",
            "Due times armed on the owned partitions (timers, step retries, timeouts).",
            value=snap.timers,
        )
        yield GaugeMetricFamily(
            "runstream_partitions_owned", "Command partitions owned.", value=snap.partitions
        )
        held = GaugeMetricFamily(
            "runstream_limit_permits_held", "Permits held, per limit.", labels=["limit"]
        )
        waiting = GaugeMetricFamily(
            "runstream_limit_permits_waiting", "Requests waiting for a permit.", labels=["limit"]
        )
        by_name: dict[str, list[int]] = {}
        for entity, (_p, h, w) in dict(self._m._limits).items():
            totals = by_name.setdefault(limit_name(entity), [0, 0])
            totals[0] += h
            totals[1] += w
        for name, (h, w) in sorted(by_name.items()):
            held.add_metric([name], h)
            waiting.add_metric([name], w)
        yield held
        yield waiting


class TaskMetrics:
    """The metrics of one task worker, serving task group ``group``.

    Args:
        stats: the worker's running totals (results, failed, skipped, dead_letters,
            heartbeats).
        held: the tasks running and the tasks held (running or waiting for a slot).
    """

    def __init__(
        self, group: str, stats: Mapping[str, int], held: Callable[[], tuple[int, int]]
    ) -> None:
        r = self.registry = CollectorRegistry()
        self.group = group
        labels = ["step", "group"]
        self.task_seconds = Histogram(
            "runstream_task_duration_seconds",
            "Duration of the step bodies this worker ran, by outcome.",
            [*labels, "outcome"],
            buckets=SECONDS,
            registry=r,
        )
        self.schedule_to_start = Histogram(
            "runstream_task_schedule_to_start_seconds",
            "From the engine sending a task to its body starting here.",
            labels,
            buckets=SECONDS,
            registry=r,
        )
        r.register(_TaskLive(group, stats, held))

    def ran(self, step: str, ok: bool, duration_ms: int) -> None:
        outcome = "ok" if ok else "failed"
        self.task_seconds.labels(step, self.group, outcome).observe(duration_ms / 1000)

    def started(self, step: str, sent_at_ms: int, now_ms: int) -> None:
        """A body of ``step`` starts at ``now_ms``, its task sent at ``sent_at_ms``."""
        if sent_at_ms > 0:  # 0: a producer that does not say
            wait = max(0, now_ms - sent_at_ms) / 1000
            self.schedule_to_start.labels(step, self.group).observe(wait)


class _TaskLive(Collector):
    def __init__(
        self, group: str, stats: Mapping[str, int], held: Callable[[], tuple[int, int]]
    ) -> None:
        self._group, self._stats, self._held = group, stats, held

    def collect(self) -> Iterator[Metric]:
        stats, g = dict(self._stats), [self._group]
        results = CounterMetricFamily(
            "runstream_task_results", "Results sent, by outcome.", labels=["group", "outcome"]
        )
        results.add_metric([*g, "ok"], stats.get("results", 0))
        results.add_metric([*g, "failed"], stats.get("failed", 0))
        yield results
        for name, key, doc in (
            ("tasks_skipped", "skipped", "Tasks skipped: past their deadline when they came."),
            ("task_heartbeats", "heartbeats", "Heartbeats sent."),
        ):
            family = CounterMetricFamily(f"runstream_{name}", doc, labels=["group"])
            family.add_metric(g, stats.get(key, 0))
            yield family
        letters = CounterMetricFamily(
            "runstream_dead_letters", "Records sent to the dead-letter topic.", labels=["code"]
        )
        letters.add_metric(["undecodable"], stats.get("dead_letters", 0))
        yield letters
        running, held = self._held()
        for name, value, doc in (
            ("tasks_running", running, "Step bodies running."),
            ("tasks_held", held, "Tasks taken: running or waiting for a slot."),
        ):
            gauge = GaugeMetricFamily(f"runstream_{name}", doc, labels=["group"])
            gauge.add_metric(g, value)
            yield gauge


class MetricsServer:
    """Serves ``registry`` as Prometheus text on ``http://host:port/metrics``, on a daemon
    thread, until `close`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, host, registry)
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve(registry: CollectorRegistry, host: str, port: int) -> MetricsServer | None:
    """A server of ``registry`` on ``host:port``; None when ``port`` is 0 (metrics off)."""
    return MetricsServer(registry, host, port) if port else None
