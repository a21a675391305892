"""``--metrics-port``: Prometheus text from a running engine and a running task worker,
scraped over HTTP as Prometheus would, while real workflows run on the real broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import runstream

from .kit import PARTITIONS, ROOT, ThreadWorker, results, spawn_worker, terminate, wait_for

pytestmark = pytest.mark.kafka

#: What the issue lists, as the engine names it (counters without their _total).
ENGINE_METRICS = {
    "runstream_command_lag_records",
    "runstream_command_backlog_age_seconds",
    "runstream_transaction_commit_seconds",
    "runstream_transaction_commands",
    "runstream_transaction_facts",
    "runstream_runs_started",
    "runstream_runs_completed",
    "runstream_runs_failed",
    "runstream_runs_cancelled",
    "runstream_runs_dead",
    "runstream_step_duration_seconds",
    "runstream_step_retries",
    "runstream_timers_pending",
    "runstream_restore_seconds",
    "runstream_limit_permits_held",
    "runstream_limit_permits_waiting",
    "runstream_dead_letters",
    "runstream_steps_handed_over",
    "runstream_recoveries",
    "runstream_transactions",
    "runstream_partitions_owned",
}
TASK_METRICS = {
    "runstream_task_duration_seconds",
    "runstream_task_schedule_to_start_seconds",
    "runstream_task_results",
    "runstream_tasks_running",
    "runstream_tasks_held",
}


class Scrape:
    """One scrape of ``/metrics``: its families, and its samples by name."""

    def __init__(self, text: str) -> None:
        families = list(text_string_to_metric_families(text))
        self.names = {f.name for f in families}
        self.samples = [s for f in families for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples ``name`` whose labels include ``labels``."""
        return sum(
            s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items()
        )

    def by(self, name: str, label: str) -> dict[str, float]:
        return {s.labels[label]: s.value for s in self.samples if s.name == name}


def scrape(port: int) -> Scrape | None:
    """The metrics on ``port``, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return Scrape(r.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return None


def _counted(port: int, name: str, n: float, **labels: str) -> Scrape | None:
    """A scrape once the sample ``name`` has reached ``n``."""
    s = scrape(port)
    return s if s is not None and s.value(name, **labels) >= n else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _owning_all(port: int) -> Scrape | None:
    s = scrape(port)
    return s if s is not None and s.value("runstream_partitions_owned") == PARTITIONS else None


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            terminate(proc)


def test_a_worker_and_a_task_worker_serve_the_metrics_of_the_runs_they_ran(
    kafka_bootstrap, ns, tmp_path, processes
):
    """`runstream worker --metrics-port` and `runstream tasks serve --metrics-port`, as an
    operator starts them; 20 runs of two remote steps each."""
    engine_port, tasks_port = free_port(), free_port()
    processes.append(
        spawn_worker(
            kafka_bootstrap,
            ns,
            tmp_path / "state",
            "w1",
            app="tests.kafka.remote_app:app",
            args=("--metrics-port", str(engine_port)),
        )
    )
    before = wait_for(lambda: _owning_all(engine_port), timeout=90, what="the engine's metrics")
    env = {
        **os.environ,
        "RUNSTREAM_TEST_NS": ns,
        "RUNSTREAM_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
    }
    serve = ["tasks", "serve", "tests.kafka.remote_app:app", "--group", "work"]
    with open(tmp_path / "tasks.log", "ab") as out:
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "runstream", *serve, "--metrics-port", str(tasks_port)],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engine's topics")
    run_ids = [f"r{i}" for i in range(20)]
    for i, run_id in enumerate(run_ids):
        client.start("double_twice", i, run_id=run_id, wait=False)
    assert results(client, run_ids, timeout=120) == {f"r{i}": i * 4 for i in range(20)}
    client.close()

    # A client may see a run's end before the engine's thread has counted its commit.
    wf = {"workflow": "double_twice"}
    after = wait_for(
        lambda: _counted(engine_port, "runstream_runs_completed_total", 20, **wf),
        what="the 20 runs counted",
    )
    assert after.names >= ENGINE_METRICS, ENGINE_METRICS - after.names
    commits = "runstream_transaction_commit_seconds_count"
    assert after.value(commits) > before.value(commits)
    assert after.value("runstream_runs_started_total", **wf) == 20
    crunch = {"step": "crunch", "group": "work"}
    assert after.value("runstream_step_duration_seconds_count", **crunch) == 40
    assert set(after.by("runstream_command_lag_records", "partition")) == {
        str(p) for p in range(PARTITIONS)
    }
    assert after.value("runstream_restore_seconds_count") >= 1

    tasks = scrape(tasks_port)
    assert tasks is not None
    assert tasks.names >= TASK_METRICS, TASK_METRICS - tasks.names
    assert tasks.value("runstream_task_duration_seconds_count", **crunch, outcome="ok") >= 40
    assert tasks.value("runstream_task_schedule_to_start_seconds_count", **crunch) >= 40
    assert tasks.value("runstream_task_results_total", group="work", outcome="ok") >= 40


def _slow_app(ns: str, bootstrap: str) -> runstream.App:
    app = runstream.App(ns, bootstrap)

    @app.workflow
    async def slow(ctx: runstream.Context, n: int) -> int:
        # Workflow code runs on the engine's loop: each run holds it up a moment, so
        # commands taken one at a time (batch_size=1) pile up behind it.
        time.sleep(0.05)
        return n

    return app


def _lag(port: int, *, drained: bool) -> Scrape | None:
    """A scrape once commands wait (or, ``drained``, once none waits)."""
    s = scrape(port)
    if s is None:
        return None
    waiting = s.value("runstream_command_lag_records")
    return s if (waiting == 0 if drained else waiting > 0) else None


def test_command_lag_and_commit_latency_move_under_load(kafka_bootstrap, ns, tmp_path):
    """100 starts at once, taken one per transaction: the lag says how many wait on each
    partition, and how old; then it drains to 0, and each commit was timed."""
    port = free_port()
    worker = ThreadWorker(
        _slow_app(ns, kafka_bootstrap), tmp_path / "state", metrics_port=port, batch_size=1
    )
    try:
        before = wait_for(lambda: _owning_all(port), timeout=90, what="the engine's metrics")
        assert before.value("runstream_command_lag_records") == 0
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engine's topics")
        run_ids = [f"s{i}" for i in range(100)]
        for i, run_id in enumerate(run_ids):
            client.start("slow", i, run_id=run_id, wait=False)
        client.flush(30)

        busy = wait_for(lambda: _lag(port, drained=False), what="commands to wait")
        lag = busy.by("runstream_command_lag_records", "partition")
        ages = busy.by("runstream_command_backlog_age_seconds", "partition")
        assert all(ages[p] > 0 for p, n in lag.items() if n > 0), (lag, ages)

        assert results(client, run_ids, timeout=120) == {f"s{i}": i for i in range(100)}
        client.close()
        wait_for(lambda: _lag(port, drained=True), what="the lag to drain")
        after = wait_for(
            lambda: _counted(port, "runstream_runs_completed_total", 100, workflow="slow"),
            what="the 100 runs counted",
        )
        assert after.value("runstream_command_lag_records") == 0
        assert set(after.by("runstream_command_backlog_age_seconds", "partition").values()) == {0}
        commits = "runstream_transaction_commit_seconds_count"
        assert after.value(commits) - before.value(commits) >= 100  # one command each
        assert after.value("runstream_transaction_commands_sum") >= 100  # and the queries
        assert after.value("runstream_runs_completed_total", workflow="slow") == 100
    finally:
        worker.stop()
