"""When Kafka is not there: one clear message, a prompt stop, no flood of log lines.

Real processes (`runstream ...` commands and supervised workers) against an address
where nothing listens, and against the session broker for the quiet-output checks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from runstream.cli import exits
from runstream.errors import KafkaUnavailable
from runstream.topics.admin import client_config, ensure_topics, max_record_bytes

from .flows import make_app
from .kit import PARTITIONS, ROOT, ThreadWorker, spawn_worker

pytestmark = pytest.mark.kafka

NOWHERE = "127.0.0.1:1"  # a port where nothing listens


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "BOOTSTRAP" not in k}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]), **extra}


def _runstream(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    "args",
    [["start", "three_steps", '{"x": 1}', "-n", "t1"], ["get", "x", "-n", "t1"]],
    ids=["start", "get"],
)
def test_a_command_without_kafka_says_so_in_one_line_and_exits_4(args):
    began = time.monotonic()
    done = _runstream(*args, "--bootstrap", NOWHERE)
    took = time.monotonic() - began
    lines = done.stderr.strip().splitlines()
    assert done.returncode == exits.KAFKA_UNREACHABLE == 4, done.stderr
    assert len(lines) <= 5 and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith("KafkaUnavailable: cannot reach Kafka at 127.0.0.1:1")
    assert "runstream kafka status" in lines[-1]
    assert not any(line.startswith("%") for line in lines)  # no raw librdkafka lines
    assert took < 15, f"gave up only after {took:.1f}s"  # the connect timeout is 10 s


def test_verbose_shows_the_traceback_and_librdkafka():
    done = _runstream("-v", "get", "x", "-n", "t1", "--bootstrap", NOWHERE)
    assert done.returncode == exits.KAFKA_UNREACHABLE
    assert "Traceback" in done.stderr and "runstream.librdkafka" in done.stderr


def _worker_without_kafka(tmp_path: Path) -> subprocess.Popen[str]:
    with open(tmp_path / "worker.log", "w") as log:  # the child keeps its own fd
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runstream",
                "worker",
                "tests.kafka.flows:app",
                "--instance",
                "w1",
                "--state-dir",
                str(tmp_path / "state"),
                "--bootstrap",
                NOWHERE,
            ],
            env=_env(RUNSTREAM_TEST_NS="t1"),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_without_kafka_waits_quietly_and_stops_when_told(tmp_path, sig):
    proc = _worker_without_kafka(tmp_path)
    time.sleep(5)  # attempts of 1 s, 2 s, 4 s...: two or three have failed by now
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert tree, "the supervisor runs the engine in a child process"
    proc.send_signal(sig)
    began = time.monotonic()
    code = proc.wait(timeout=10)
    took = time.monotonic() - began
    gone = psutil.wait_procs(tree, timeout=1)[1]
    lines = (tmp_path / "worker.log").read_text().splitlines()
    assert took < 2, f"stopped {took:.1f}s after {sig.name}"
    assert code == 0 and not gone, (code, gone)
    assert not any(line.startswith("%") for line in lines), lines
    unreachable = [line for line in lines if "cannot reach Kafka at 127.0.0.1:1" in line]
    assert 1 <= len(unreachable) <= 3, lines  # one line per attempt, no flood
    assert "no broker answered within 1s" in unreachable[0]
    assert "within 2s" in unreachable[1] if len(unreachable) > 1 else True
    assert len(lines) <= len(unreachable) + 4, lines  # connecting, stopped: nothing else


def test_a_normal_run_prints_no_raw_librdkafka_lines(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        done = _runstream(
            "start", "three_steps", "1", "-n", ns, "--bootstrap", kafka_bootstrap, "--wait"
        )
    finally:
        worker.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "4"
    assert not [line for line in done.stderr.splitlines() if line.startswith("%")], done.stderr


def test_runstream_workers_shows_what_each_instance_does(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    state = tmp_path / "state"
    proc = spawn_worker(kafka_bootstrap, ns, state, "w1")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = _runstream("workers", "-n", ns, "--state-dir", str(state))
            if "running" in out.stdout and "partitions 0,1,2,3" in out.stdout:
                break
            time.sleep(0.5)
        assert "w1" in out.stdout and "running" in out.stdout, out.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    out = _runstream("workers", "-n", ns, "--state-dir", str(state))
    assert "stopped" in out.stdout, out.stdout


def test_reading_the_record_limit_with_no_broker_answering_is_unavailable_not_a_topic_error():
    """An engine starting while its broker is paused: reading the topics'
    max.message.bytes timed out as a TopicError, which ends the instance, where
    KafkaUnavailable makes it try again (seen in the chaos suite)."""
    with pytest.raises(KafkaUnavailable, match=r"max\.message\.bytes"):
        max_record_bytes(client_config(NOWHERE), ["any.commands"], timeout=2)
