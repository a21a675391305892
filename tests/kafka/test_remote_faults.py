"""Remote steps under faults, on the real broker: a task worker killed, no worker at
all, results that must change nothing, and liveness by heartbeat.

The engine runs on a thread of the test (it never runs a remote body); task workers
run `tests.kafka.remote_app:app` in their own processes, so one can be SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

import runstream
from runstream.audit.rules import check_run
from runstream.cli.main import cli
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.schemas.records import StepResult
from runstream.topics.admin import client_config

from .kit import PARTITIONS, ROOT, ThreadWorker, owns, read_topic, results, wait_for

pytestmark = pytest.mark.kafka


@pytest.fixture
def remote(kafka_bootstrap, ns, tmp_path, monkeypatch):
    """An engine for tests.kafka.remote_app (namespace ``ns``), a way to start task
    workers in processes, and the step log their bodies write."""
    log = tmp_path / "steps.log"
    monkeypatch.setenv("RUNSTREAM_TEST_NS", ns)
    sys.modules.pop("tests.kafka.remote_app", None)  # its App takes the namespace now
    from tests.kafka import remote_app

    app = runstream.App(ns, kafka_bootstrap)
    app.registry = remote_app.app.registry
    engines = [ThreadWorker(app, tmp_path / "state")]
    # Running: its task topics exist (an engine creates them before it takes partitions).
    wait_for(lambda: owns(tmp_path / "state", ns, "w1"), timeout=60, what="the engine")
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engine's topics")
    workers: list[subprocess.Popen[bytes]] = []

    def serve(name: str, concurrency: int = 8) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "RUNSTREAM_TEST_NS": ns,
            "RUNSTREAM_TEST_STEP_LOG": str(log),
            "RUNSTREAM_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
        }
        args = ["tasks", "serve", "tests.kafka.remote_app:app", "--group", "work"]
        with open(tmp_path / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runstream", *args, "--concurrency", str(concurrency)],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        workers.append(proc)
        return proc

    def restart() -> None:
        """Stop the engine and start it again (same instance, same projection)."""
        engines[-1].stop()
        engines.append(ThreadWorker(app, tmp_path / "state"))

    yield SimpleNamespace(client=client, serve=serve, log=log, app=app, restart=restart)
    for proc in workers:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    client.close()
    engines[-1].stop()


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _executions(log: Path) -> list[tuple[str, str, str, str, str]]:
    """(begin|end, run, seq, attempt id, pid) of every body, in order."""
    if not log.exists():
        return []
    return [tuple(line.split()) for line in log.read_text().splitlines()]  # type: ignore[misc]


def _journal_by_run(bootstrap: str, ns: str) -> dict[str, list]:
    runs: dict[str, list] = {}
    codec = Codec.default()
    for _name, _rec, msg in read_topic(bootstrap, f"{ns}.journal"):
        fact = codec.decode(msg.value())
        runs.setdefault(fact.run_id, []).append(fact)
    return runs


def test_a_task_worker_killed_mid_way_loses_no_run_and_reruns_only_its_unfinished_tasks(
    remote, kafka_bootstrap, ns
):
    client, log = remote.client, remote.log
    first = remote.serve("w1", concurrency=8)
    run_ids = [client.start("double_twice", n, run_id=f"r{n}") for n in range(200)]
    wait_for(lambda: sum(e[0] == "end" for e in _executions(log)) >= 120, timeout=120, what="work")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed_at = len(_executions(log))
    remote.serve("w2", concurrency=8)

    done = results(client, run_ids, timeout=180)
    assert done == {f"r{n}": n * 4 for n in range(200)}
    runs = _journal_by_run(kafka_bootstrap, ns)
    for run_id in run_ids:  # one attempt per step, each settled once, in the history
        facts = runs[run_id]
        assert check_run(facts, expect_finished=True) == []
        started = [f for f in facts if type(f).__name__ == "StepStarted"]
        assert [(f.seq, f.attempt) for f in started] == [(1, 1), (2, 1)]
    executions = _executions(log)
    began = Counter((e[1], e[2], e[3]) for e in executions if e[0] == "begin")
    assert len(began) == 400  # every attempt ran
    twice = {attempt for attempt, n in began.items() if n > 1}
    killed_pid = str(first.pid)
    first_runs = {(e[1], e[2], e[3]): e[4] for e in reversed(executions) if e[0] == "begin"}
    # Only attempts the killed worker held (begun there, result or commit not through)
    # ran again; it holds at most 2 x concurrency tasks.
    assert all(first_runs[a] == killed_pid for a in twice)
    assert all(began[a] == 2 for a in twice)
    assert len(twice) <= 16
    assert all(e[4] != killed_pid for e in executions[killed_at:])


def test_with_no_task_worker_runs_wait_without_retrying_then_complete_when_one_comes(
    remote, kafka_bootstrap, ns
):
    client = remote.client
    run_ids = [client.start("double_twice", n, run_id=f"q{n}") for n in range(20)]
    wait_for(lambda: _status(kafka_bootstrap, ns)["in_flight"] == 20, timeout=30, what="dispatch")
    time.sleep(30)  # no worker for 30 s
    status = _status(kafka_bootstrap, ns)
    assert status["lag"] >= 20 and status["in_flight"] == 20 and status["workers"] == []
    assert status["oldest_waiting"]["age_ms"] >= 30_000
    runs = _journal_by_run(kafka_bootstrap, ns)
    names = Counter(type(f).__name__ for r in run_ids for f in runs[r])
    assert names == {"RunStarted": 20, "StepStarted": 20}  # waiting, not retrying
    remote.serve("late")
    assert results(client, run_ids, timeout=120) == {f"q{n}": n * 4 for n in range(20)}


def _status(bootstrap: str, ns: str) -> dict:
    out = CliRunner().invoke(
        cli, ["tasks", "status", "-n", ns, "--bootstrap", bootstrap, "--group", "work", "--json"]
    )
    assert out.exit_code == 0, out.output
    [group] = json.loads(out.output)
    return group


def test_results_for_no_open_attempt_change_nothing_and_say_why(remote, kafka_bootstrap, ns):
    client = remote.client
    remote.serve("w1")
    assert client.result(client.start("double_twice", 1, run_id="done"), timeout=60) == 4
    runs = _journal_by_run(kafka_bootstrap, ns)
    settled = next(f for f in runs["done"] if type(f).__name__ == "StepStarted")
    stale = [
        StepResult(  # ended
            "done", settled.seq, attempt=1, ok=True, output=b"99", attempt_id=settled.attempt_id
        ),
        StepResult("done", 7, attempt=1, ok=True, output=b"99", attempt_id="7.1.0"),  # no such step
        StepResult(  # no such run
            "nobody", 1, attempt=1, ok=True, output=b"99", attempt_id="1.1.0"
        ),
    ]
    producer = Producer({**client_config(kafka_bootstrap), "partitioner": "murmur2_random"})
    codec = Codec.default()
    for result in stale:
        producer.produce(f"{ns}.commands", codec.encode(result), key=result.run_id.encode())
    key = b"done"
    producer.produce(
        f"{ns}.commands", b"\xc3\x01 not avro", key=key, partition=partition_for(key, PARTITIONS)
    )
    producer.flush(10)

    def told():
        lifecycle = read_topic(kafka_bootstrap, f"{ns}.lifecycle", timeout=2)
        ignored = [r for n, r, _ in lifecycle if r["type"] == "step.result_ignored"]
        return ignored if len(ignored) >= 2 else None

    ignored = wait_for(told, timeout=30, what="two results told as ignored")
    assert {(r["run_id"], r["seq"]) for r in ignored} == {("done", settled.seq), ("done", 7)}
    assert all("ignored: " in r["reason"] for r in ignored)

    def dead():
        letters = read_topic(kafka_bootstrap, f"{ns}.dlq", timeout=2)
        return letters if len(letters) >= 2 else None

    codes = sorted(r["code"] for _, r, _ in wait_for(dead, timeout=30, what="two dead letters"))
    # The garbage starts with the single-object marker: a schema this engine does not know.
    assert codes == ["unknown-run", "unknown-schema"]
    assert client.result("done", timeout=10) == 4  # unchanged
    assert [type(f).__name__ for f in _journal_by_run(kafka_bootstrap, ns)["done"]] == [
        type(f).__name__ for f in runs["done"]
    ]


def test_heartbeats_keep_a_long_attempt_alive_and_silence_times_it_out(remote):
    client = remote.client
    remote.serve("w1")
    client.start("wait_on", {"seconds": 5, "beat": True}, run_id="beating")
    client.start("wait_on", {"seconds": 5, "beat": False}, run_id="silent")
    assert client.result("beating", timeout=60) == "attempt 1"  # 5 s, heartbeat every 2 s
    assert client.result("silent", timeout=60) == "attempt 2"
    info = client.get_run("silent")
    assert info.status == "completed"


def test_an_attempt_nobody_serves_times_out_after_the_engine_restarts(remote, kafka_bootstrap, ns):
    """Heartbeat 4 s, timeout 12 s, no task worker, the engine restarted as soon as the
    attempt started: the new owner grants one heartbeat interval from its takeover, then
    the attempt times out and its run fails (no retries). Nothing is sent to the engine
    meanwhile: a command decided with the grace would have hidden the defect."""

    def facts(*names: str) -> list | None:
        run = _journal_by_run(kafka_bootstrap, ns).get("alone", [])
        return run if {type(f).__name__ for f in run} >= set(names) else None

    remote.client.start("left_alone", 1, run_id="alone")
    wait_for(lambda: facts("StepStarted"), timeout=30, what="the attempt")
    remote.restart()
    assert not facts("StepFailed")  # the old owner stopped within the attempt's interval
    # its timeout plus slack for the restart (before the fix: it never timed out)
    run = wait_for(lambda: facts("RunFailed"), timeout=40, what="the attempt to time out")
    names = [type(f).__name__ for f in run]
    assert names == ["RunStarted", "StepStarted", "StepFailed", "RunFailed"]
    assert "StepTimeout: remote step 'unserved'" in run[2].error
    assert check_run(run, expect_finished=True) == []
