"""The engine's metrics follow the facts of each committed batch (`runstream.metrics`), and
the task worker's its tasks; no broker: the pure core decides, `Core` commits."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import cast

from prometheus_client import generate_latest

from runstream import App
from runstream.engine.limits import Limits
from runstream.engine.state import new_state
from runstream.engine.work import Batch, Work
from runstream.metrics import EngineMetrics, Snapshot, TaskMetrics, limit_name
from runstream.projections.store import PartitionStore
from runstream.schemas.codec import Codec
from runstream.schemas.records import LIMIT_PREFIX, StepTask, limit_id
from runstream.taskworker import TaskWorker
from runstream.topics.tasklog import TaskLog

from .corehelp import Core

ROOT = Path(__file__).resolve().parents[2]
app = App("unit")
app.limit("payments", concurrency=1)
tries: list[int] = []


@app.step(retries=2, backoff=0.001)
def flaky(n: int) -> int:
    tries.append(n)
    if tries.count(n) < 2:
        raise RuntimeError("not yet")
    return n


@app.step(group="payments")
def charge(order: str) -> str:
    raise AssertionError("remote")


@app.workflow
async def ok(ctx, n: int) -> int:
    return await ctx.step(flaky, n)


@app.workflow
async def broken(ctx, n: int) -> int:
    raise ValueError("no")


@app.workflow
async def waits(ctx, n: int) -> str:
    return await ctx.wait_for_signal("go")


@app.workflow
async def pay(ctx, order: str) -> str:
    return await ctx.step(charge, order)


class MeteredCore(Core):
    """`Core`, whose every committed batch the metrics see, as the worker's `_process`."""

    def __init__(self, metrics: EngineMetrics) -> None:
        super().__init__(app.registry)
        self.metrics = metrics

    def handle(self, work: Work) -> Batch:
        b = super().handle(work)
        self.metrics.committed(b, 0.004)
        return b

    def pump(self) -> None:
        while self.commands:
            self.command(self.commands.pop(0))


def _metrics() -> EngineMetrics:
    stats = {"transactions": 7, "aborted": 1, "commands": 9, "facts": 30}
    return EngineMetrics(
        lambda step: app.registry.step_by_name(step).policy.group or "",
        stats,
        {"poll": 1.5, "commit": 0.5},
    )


def test_committed_batches_count_runs_steps_retries_and_dead_letters():
    metrics = _metrics()
    value = metrics.registry.get_sample_value
    core = MeteredCore(metrics)
    core.start("a", "ok", 1)
    core.advance(1)  # the retry's backoff
    core.start("b", "ok", 2)
    core.advance(1)
    core.start("c", "broken", 0)
    core.start("d", "waits", 0)
    core.cancel("d")
    core.record(b"not avro", b"e")

    assert core.state("a").status == core.state("b").status == "completed"
    assert value("runstream_runs_started_total", {"workflow": "ok"}) == 2
    assert value("runstream_runs_completed_total", {"workflow": "ok"}) == 2
    assert value("runstream_runs_failed_total", {"workflow": "broken", "code": "workflow-error"})
    assert value("runstream_runs_cancelled_total", {"workflow": "waits"}) == 1
    step = {"step": "flaky", "group": ""}
    assert value("runstream_step_duration_seconds_count", step) == 2
    assert value("runstream_step_retries_total", step) == 2
    assert value("runstream_step_failures_total", step) is None
    assert value("runstream_dead_letters_total", {"code": "undecodable"}) == 1
    transactions = value("runstream_transaction_commit_seconds_count")
    assert transactions == value("runstream_transaction_facts_count") > 0
    assert value("runstream_transaction_facts_sum") == len(core.journal)
    # one command consumed per start, signal, cancel and record, none by a step or a timer
    assert value("runstream_transaction_commands_sum") == core.offset


def test_limits_report_their_permits_held_and_waiting_by_name():
    metrics = _metrics()
    core = MeteredCore(metrics)
    for i in range(3):
        core.start(f"o{i}", "pay", f"order-{i}")
    core.pump()
    value = metrics.registry.get_sample_value
    assert value("runstream_limit_permits_held", {"limit": "payments"}) == 1
    assert value("runstream_limit_permits_waiting", {"limit": "payments"}) == 2
    assert value("runstream_runs_started_total", {"workflow": "pay"}) == 3
    metrics.released([0])  # the partition went: its limits are no one's here
    assert value("runstream_limit_permits_held", {"limit": "payments"}) is None


def test_a_limit_entity_is_labelled_by_its_name_never_by_a_key():
    assert limit_name(limit_id("payments")) == "payments"
    assert limit_name(limit_id("checkout", "customer-17")) == "checkout"
    assert limit_name(limit_id("a/b", "k/1")) == "a/b"
    assert limit_name(limit_id("x", "k" * 300)) == "(hashed)"


def test_totals_and_the_loops_last_partition_figures_are_read_at_scrape_time():
    metrics = _metrics()
    metrics.partitions(Snapshot({0: 3, 4: 0}, {0: 2.5}, timers=5, partitions=2))
    value = metrics.registry.get_sample_value
    assert value("runstream_transactions_total") == 7
    assert value("runstream_transactions_aborted_total") == 1
    assert value("runstream_loop_seconds_total", {"phase": "poll"}) == 1.5
    assert value("runstream_command_lag_records", {"partition": "0"}) == 3
    assert value("runstream_command_lag_records", {"partition": "4"}) == 0
    assert value("runstream_command_backlog_age_seconds", {"partition": "0"}) == 2.5
    assert value("runstream_command_backlog_age_seconds", {"partition": "4"}) == 0
    assert value("runstream_timers_pending") == 5
    assert value("runstream_partitions_owned") == 2
    assert b"# TYPE runstream_command_lag_records gauge" in generate_latest(metrics.registry)


def test_the_totals_are_the_shells_own_counters_however_empty_they_start():
    stats: Counter[str] = Counter()
    metrics = EngineMetrics(stats=stats)
    stats["transactions"] += 3
    assert metrics.registry.get_sample_value("runstream_transactions_total") == 3


def test_two_instances_in_one_process_keep_their_own_metrics():
    one, two = _metrics(), _metrics()
    MeteredCore(one).start("a", "waits", 0)
    assert one.registry.get_sample_value("runstream_runs_started_total", {"workflow": "waits"})
    assert (
        two.registry.get_sample_value("runstream_runs_started_total", {"workflow": "waits"}) is None
    )


def test_a_task_worker_without_a_metrics_port_times_no_bodies():
    """Metrics off (the default), a body's histograms are not even filled: they cost a
    fifth of a trivial task's Python time in the worker."""

    class Log:  # what `_attempt` asks of the task log
        limits = Limits(1_000_000)

    worker = TaskWorker(app, "payments")
    task = StepTask(
        "run-1", 1, attempt=1, name="charge", args=b'["o-1"]', attempt_id="1.1.a", sent_at_ms=1
    )
    result = worker._attempt(cast(TaskLog, Log()), task)
    assert not result.ok and "remote" in (result.error or "")  # the body ran
    value = worker.metrics.registry.get_sample_value
    step = {"step": "charge", "group": "payments"}
    assert value("runstream_task_duration_seconds_count", {**step, "outcome": "failed"}) is None
    assert value("runstream_task_schedule_to_start_seconds_count", step) is None


def test_task_metrics_time_the_bodies_and_their_wait_for_a_slot():
    stats = {"results": 3, "failed": 1, "skipped": 2, "dead_letters": 1, "heartbeats": 4}
    metrics = TaskMetrics("payments", stats, lambda: (2, 5))
    metrics.started("charge", sent_at_ms=1_000, now_ms=1_250)
    metrics.started("charge", sent_at_ms=0, now_ms=1_250)  # a producer that does not say
    metrics.ran("charge", ok=True, duration_ms=40)
    value = metrics.registry.get_sample_value
    step = {"step": "charge", "group": "payments"}
    assert value("runstream_task_schedule_to_start_seconds_count", step) == 1
    assert value("runstream_task_schedule_to_start_seconds_sum", step) == 0.25
    assert value("runstream_task_duration_seconds_count", {**step, "outcome": "ok"}) == 1
    group = {"group": "payments"}
    assert value("runstream_task_results_total", {**group, "outcome": "failed"}) == 1
    assert value("runstream_tasks_skipped_total", group) == 2
    assert value("runstream_task_heartbeats_total", group) == 4
    assert value("runstream_dead_letters_total", {"code": "undecodable"}) == 1
    assert value("runstream_tasks_running", group) == 2
    assert value("runstream_tasks_held", group) == 5


def test_a_restored_partition_reports_the_limits_its_projection_holds(tmp_path):
    """What the worker does after a restore: every limit entity of the projection, found
    with `PartitionStore.ids` (one seek per entity), gives its figures."""
    core = MeteredCore(_metrics())
    for i in range(3):
        core.start(f"o{i}", "pay", f"order-{i}")
    core.pump()
    codec = Codec.default()
    store = PartitionStore(tmp_path / "p0", codec)
    runs = [
        (new_state(run_id), state, [codec.encode(f) for f in core.facts(run_id)])
        for run_id, state in core.states.items()
    ]
    store.commit(runs, journal_offset=len(core.journal))
    assert list(store.ids(LIMIT_PREFIX)) == [limit_id("payments")]
    assert list(store.ids("o")) == ["o0", "o1", "o2"]
    restored = _metrics()
    for entity in store.ids(LIMIT_PREFIX):
        restored.limit(0, store.get(entity))
    store.close()
    value = restored.registry.get_sample_value
    assert value("runstream_limit_permits_held", {"limit": "payments"}) == 1
    assert value("runstream_limit_permits_waiting", {"limit": "payments"}) == 2


def test_the_grafana_dashboard_asks_only_for_metrics_runstream_exposes():
    dashboard = json.loads((ROOT / "docs" / "grafana" / "runstream.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    asked = {name for e in exprs for name in re.findall(r"runstream_[a-z_]+", e)}
    exposed = set()
    registries = [_metrics().registry, TaskMetrics("g", {}, lambda: (0, 0)).registry]
    for family in (f for r in registries for f in r.collect()):
        suffixes = {
            "counter": ["_total"],
            "histogram": ["_bucket", "_sum", "_count"],
            "gauge": [""],
        }[family.type]
        exposed |= {family.name + s for s in suffixes}
    assert asked <= exposed, asked - exposed
    assert len(asked) >= 25  # every family, near enough: a panel per figure
