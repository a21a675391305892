"""Helpers for engine tests against the real broker: workers in threads or processes,
and reading a topic's records back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

import runstream
from chaos.check import partitions_lost
from runstream import App, Settings, Worker
from runstream.engine import payload
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4  # small: each test creates its own namespace


class ThreadWorker:
    """An engine instance on a thread of the test process."""

    def __init__(self, app: App, state_dir: Path, instance: str = "w1", **kw: Any) -> None:
        defaults: dict[str, Any] = {"partitions": PARTITIONS, "session_timeout_ms": 6000}
        # exit_on_hang=False: a hung call must never end pytest
        settings = Settings(
            instance_id=instance, state_dir=state_dir, exit_on_hang=False, **{**defaults, **kw}
        )
        self.worker = Worker(app, settings)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker did not stop within 30 s"


def spawn_worker(
    bootstrap: str,
    ns: str,
    state_dir: Path,
    instance: str,
    step_log: Path | None = None,
    app: str = "tests.kafka.flows:app",
    args: tuple[str, ...] = (),
    **env: str,
) -> subprocess.Popen[bytes]:
    """An engine instance in its own process, running ``app`` (tests.kafka.flows:app), with
    more ``args`` for `runstream worker`."""
    full_env = {
        **os.environ,
        "RUNSTREAM_TEST_NS": ns,
        "RUNSTREAM_BOOTSTRAP_SERVERS": bootstrap,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
        **env,
    }
    if step_log is not None:
        full_env["RUNSTREAM_TEST_STEP_LOG"] = str(step_log)
    with open(state_dir.parent / f"{instance}.log", "ab") as log:  # the child keeps its own fd
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runstream",
                "worker",
                app,
                "--instance",
                instance,
                "--state-dir",
                str(state_dir),
                "--partitions",
                str(PARTITIONS),
                *args,
            ],
            env=full_env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


def read_topic(bootstrap: str, topic: str, timeout: float = 10.0) -> list[tuple[str, dict, Any]]:
    """Every committed record of ``topic``, decoded: (type name, record, message)."""
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"read-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
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
                name, rec = codec.decode_raw(msg.value())
            except Exception:
                name, rec = "<undecodable>", {}
            out.append((name, rec, msg))
        return out
    finally:
        consumer.close()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    """``predicate()``'s first true value; a predicate that times out asking (no engine
    answers yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except TimeoutError:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# -- drills: load that keeps coming, step-log counts, projection copies ---------------------


class SteadyStarts(threading.Thread):
    """Starts ``run_ids`` of ``workflow`` at a steady rate over ``seconds``, on a thread with
    its own Client, so load keeps arriving while a drill kills things."""

    def __init__(
        self, bootstrap: str, ns: str, workflow: str, value: Any, run_ids: list[str], seconds: float
    ) -> None:
        super().__init__(daemon=True)
        self.client = runstream.Client(ns, bootstrap)
        self.workflow, self.value, self.run_ids, self.seconds = workflow, value, run_ids, seconds
        self.error: BaseException | None = None
        self.undelivered = ""  # what Kafka refused, reported by finish()
        self.start()

    def run(self) -> None:
        began = time.monotonic()
        try:
            for i, run_id in enumerate(self.run_ids):
                delay = began + i * self.seconds / len(self.run_ids) - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.client.start(self.workflow, self.value, run_id=run_id, wait=False)
            # librdkafka keeps retrying while a broker is away; wait as long as a drill may
            try:
                self.client.flush(120)
            except runstream.CommandNotDelivered as exc:  # a start lost while a broker died
                self.undelivered = str(exc)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self, timeout: float = 180) -> None:
        self.join(timeout)
        assert not self.is_alive(), "the load thread did not finish"
        try:
            self.client.close()
        except runstream.CommandNotDelivered as exc:  # a start lost while a broker died
            self.undelivered = str(exc)
        if self.error is not None:
            raise self.error


def results(client: runstream.Client, run_ids: list[str], timeout: float) -> dict[str, Any]:
    """run id -> its output, or the exception its result() raised, within one deadline
    (past it, the remaining runs are not asked: they map to a TimeoutError)."""
    deadline, out = time.monotonic() + timeout, {}
    for run_id in run_ids:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError(f"not asked about run {run_id!r}: {timeout}s passed")
            out[run_id] = client.result(run_id, timeout=left)
        except (runstream.RunstreamError, TimeoutError) as exc:
            out[run_id] = exc
    return out


#: tick n of workflow `sleepy` is the step at this sequence number (seq 2 is the sleep)
TICK_SEQ = {1: 1, 2: 3, 3: 4}


def check_ticks(step_log: Path, journal: list[tuple[str, dict, Any]], run_ids: list[str]) -> str:
    """Account for every execution of `sleepy`'s tick bodies (each logs and returns its own
    name, "pid-nonce"), against the journal's facts; returns a summary.

    - every tick of every run ran, and the journal recorded exactly one of its executions;
    - none ran after the recorded one: no committed step ran again;
    - within one process, a tick ran again only after a recovery of it (RunRecovered), or
      after that process lost the run's partition (the instance logs, next to the step
      log, name each partition a process lost). An execution the journal did not record
      may have run ahead of a commit its process never made (it died, or lost the
      partition): at least once.
    """
    runs: dict[tuple[str, int], list[str]] = {}
    lines = step_log.read_text().splitlines() if step_log.exists() else []
    for run, n, execution in (line.split() for line in lines):
        runs.setdefault((run, int(n)), []).append(execution)
    assert set(runs) == {(run, n) for run in run_ids for n in TICK_SEQ}, "a tick never ran"
    recorded: dict[tuple[str, int], list[str]] = {}
    partition: dict[str, int] = {}
    for name, r, msg in journal:
        partition[r["run_id"]] = msg.partition()
        if name == "StepCompleted":
            recorded.setdefault((r["run_id"], r["seq"]), []).append(payload.loads(r["output"]))
    recovered = Counter((r["run_id"], r["seq"]) for name, r, _ in journal if name == "RunRecovered")
    moved = partitions_lost(step_log.parent)
    again = ahead = 0
    for (run, n), executions in runs.items():
        key = (run, TICK_SEQ[n])
        assert len(recorded.get(key, [])) == 1, f"tick {n} of {run} recorded {recorded.get(key)}"
        execution = recorded[key][0]
        assert execution in executions, f"tick {n} of {run}: {execution} never ran"
        assert executions[-1] == execution, f"tick {n} of {run} ran after its commit: {executions}"
        for pid, count in Counter(e.split("-")[0] for e in executions).items():
            if (pid, partition[run]) not in moved:
                assert count <= 1 + recovered[key], (run, n, executions)
        again += len(executions) - 1
        ahead += len(executions) - 1 - min(len(executions) - 1, recovered[key])
    bodies = sum(len(e) for e in runs.values())
    return (
        f"{bodies} tick bodies ran for {len(runs)} ticks, none after its commit; {again} ran "
        f"again ({recovered.total()} recoveries in the journal, {ahead} re-runs of a tick "
        "that had run ahead of a commit that never came)"
    )


def journal_ends(bootstrap: str, ns: str) -> dict[int, int]:
    """Partition -> 1 + the offset of its last committed fact: what an up-to-date projection
    stores as its journal offset (the transaction markers after it are not facts)."""
    ends: dict[int, int] = {}
    for _, _, msg in read_topic(bootstrap, f"{ns}.journal", timeout=60):
        ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)
    return ends


def projection_copies(state: Path) -> dict[int, dict[str, tuple[int, list]]]:
    """Partition -> {instance: (stored journal offset, full dump)} for every projection under
    ``state`` (after churn a partition has a copy in each instance that ever owned it)."""
    from runstream.projections.store import PartitionStore

    copies: dict[int, dict[str, tuple[int, list]]] = {}
    for d in sorted(state.glob("*/*/p*")):
        store = PartitionStore(d, Codec.default(), read_only=True)
        try:
            copy = (store.journal_offset, store.dump())
            copies.setdefault(int(d.name[1:]), {})[d.parent.name] = copy
        finally:
            store.close()
    return copies


def owns(state, ns: str, instance: str) -> list[int]:
    """The partitions an instance says (health.json) it runs."""
    try:
        health = json.loads((state / ns / instance / "health.json").read_text())
    except (OSError, ValueError):
        return []
    return health["partitions"] if health["status"] == "running" else []


def client_or_none(ns: str, bootstrap: str) -> runstream.Client | None:
    """A Client of ``ns``, or None while its topics do not exist yet (for `wait_for`)."""
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def journal_facts(bootstrap: str, ns: str, run_id: str) -> list[Any]:
    """The committed journal facts of ``run_id``, decoded, in order."""
    codec = Codec.default()
    return [
        codec.decode(msg.value())
        for _, rec, msg in read_topic(bootstrap, f"{ns}.journal", timeout=30)
        if rec.get("run_id") == run_id
    ]


def fact_names(bootstrap: str, ns: str, run_id: str) -> list[str]:
    return [type(f).__name__ for f in journal_facts(bootstrap, ns, run_id)]
