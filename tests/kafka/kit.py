"""Helpers for engine tests against the real broker: workers in threads or processes,
and reading a topic's records back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from runstream import App, Worker, WorkerSettings
from runstream.config import client_config
from runstream.schemas.codec import Codec

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4  # small: each test creates its own namespace


class ThreadWorker:
    """An engine instance on a thread of the test process."""

    def __init__(self, app: App, state_dir: Path, instance: str = "w1", **kw: Any) -> None:
        settings = WorkerSettings(instance_id=instance, state_dir=state_dir,
                                  partitions=PARTITIONS, session_timeout_ms=6000, **kw)  # fmt: skip
        self.worker = Worker(app, settings)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker did not stop within 30 s"


def spawn_worker(bootstrap: str, ns: str, state_dir: Path, instance: str,
                 step_log: Path | None = None, **env: str) -> subprocess.Popen[bytes]:  # fmt: skip
    """An engine instance in its own process, running tests.kafka.flows:app."""
    full_env = {**os.environ, "RUNSTREAM_TEST_NS": ns, "RUNSTREAM_BOOTSTRAP_SERVERS": bootstrap,
                "PYTHONPATH": str(ROOT), **env}  # fmt: skip
    if step_log is not None:
        full_env["RUNSTREAM_TEST_STEP_LOG"] = str(step_log)
    with open(state_dir.parent / f"{instance}.log", "ab") as log:  # the child keeps its own fd
        return subprocess.Popen(
            [sys.executable, "-m", "runstream", "worker", "tests.kafka.flows:app",
             "--instance", instance, "--state-dir", str(state_dir), "--partitions",
             str(PARTITIONS)],
            env=full_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


def read_topic(bootstrap: str, topic: str, timeout: float = 10.0) -> list[tuple[str, dict, Any]]:
    """Every committed record of ``topic``, decoded: (type name, record, message)."""
    consumer = Consumer({**client_config(bootstrap), "group.id": f"read-{time.time_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(md.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        codec, out, at_end = Codec.default(), [], set()
        deadline = time.monotonic() + timeout
        while len(at_end) < len(parts) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                continue
            try:
                name, rec = codec.decode(msg.value())
            except Exception:
                name, rec = "<undecodable>", {}
            out.append((name, rec, msg))
        return out
    finally:
        consumer.close()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
