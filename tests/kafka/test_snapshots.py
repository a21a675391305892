"""Snapshots in ``<ns>.state`` and retention of finished runs (issue 24), on a real broker:
a new owner with an empty disk restores from the snapshot topic and the journal's tail,
with only the live runs; a snapshot of an older format restores; an unreadable one falls
back to the journal."""

from __future__ import annotations

import json
import logging
import shutil
import time

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

import runstream
from runstream.cli.main import cli
from runstream.engine.partitioner import partition_for
from runstream.projections.snapshot import Image
from runstream.schemas.codec import Codec
from runstream.schemas.records import RunStarted, SignalAwaited
from runstream.topics.admin import client_config, ensure_topics

from .flows import make_app
from .kit import (
    PARTITIONS,
    ThreadWorker,
    check_ticks,
    client_or_none,
    kill,
    owns,
    read_topic,
    spawn_worker,
    terminate,
    wait_for,
)

pytestmark = pytest.mark.kafka

SNAPSHOTS = {"RUNSTREAM_SNAPSHOT_INTERVAL": "0.5", "RUNSTREAM_FINISHED_RETENTION": "1"}


def _state_images(bootstrap: str, ns: str) -> dict[int, Image]:
    """Each partition's image as ``<ns>.state`` holds it now (read_committed)."""
    topic = f"{ns}.state"
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
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        images, at_end = {p: Image() for p in range(PARTITIONS)}, set()
        deadline = time.monotonic() + 30
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                continue
            images[msg.partition()].add(msg.key(), msg.value())
        return images
    finally:
        consumer.close()


def _snapshot_runs(bootstrap: str, ns: str) -> set[str]:
    return {r.run_id for image in _state_images(bootstrap, ns).values() for r in image.runs()}


def test_a_new_owner_with_an_empty_disk_restores_only_live_runs_from_the_snapshots(
    kafka_bootstrap, ns, tmp_path
):
    """Finished runs past a 1 s retention are purged and tombstoned; w1 is SIGKILLed (steps
    running, timers set, signals awaited), its disk deleted; w2 restores the live runs from
    ``<ns>.state`` (the finished ones are not read again), and they finish with no
    committed step body run again."""
    log = tmp_path / "steps.log"
    state = tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", log, **SNAPSHOTS)
    w2 = None
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
    try:
        done = [f"done-{i}" for i in range(20)]
        finished = set()
        for run_id in done:  # its result asked at once: past the 1 s retention it is gone
            client.start("three_steps", 1, run_id=run_id, wait=False)
            finished.add(client.result(run_id, timeout=60))
        sleepy = [f"sleepy-{i}" for i in range(4)]
        for run_id in sleepy:
            client.start("sleepy", 25, run_id=run_id, wait=False)
        waiting = [f"approval-{i}" for i in range(4)]
        for run_id in waiting:
            client.start("approval", None, run_id=run_id, wait=False)
        working = [f"steady-{i}" for i in range(3)]  # a step running at the kill
        for run_id in working:
            client.start("steady", 20, run_id=run_id, wait=False)
        assert finished == {4}
        # the finished runs purged, the live ones in the snapshot topic
        live = set(sleepy) | set(waiting) | set(working)
        wait_for(
            lambda: _snapshot_runs(kafka_bootstrap, ns) == live,
            timeout=60,
            what="a snapshot of only the live runs",
        )
        with pytest.raises(runstream.RunNotFound):  # purged from the projection
            client.get_run("done-0")
        kill(w1)
        shutil.rmtree(state / ns / "w1")  # the new owner has an empty disk
        w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", log, **SNAPSHOTS)
        for run_id in waiting:
            client.signal(run_id, "approve", "ann")
        for run_id in waiting:
            assert client.result(run_id, timeout=90) == {"approved": True, "by": "ann"}
        for run_id in sleepy:
            assert client.result(run_id, timeout=90) == "rested"
        for run_id in working:  # recovered: its running step was restored from the snapshot
            assert client.result(run_id, timeout=90) == run_id
        with pytest.raises(runstream.RunNotFound):  # not restored from the journal either
            client.get_run("done-1")
    finally:
        client.close()
        for w in (w1, w2):
            if w is not None and w.poll() is None:
                terminate(w)
    w2_log = (tmp_path / "w2.log").read_text()
    restored = [line for line in w2_log.splitlines() if "restored from its snapshot" in line]
    assert restored, w2_log
    restored_runs = sum(int(line.split(": ")[-1].split()[0]) for line in restored)
    assert restored_runs == len(live)
    print("\n" + "\n".join(restored))
    # the read model learned of the purge (run.purged): `runs show` says so
    args = ["runs", "show", "done-0", "-n", ns, "--bootstrap", kafka_bootstrap]
    shown = CliRunner().invoke(cli, [*args, "--cache-dir", str(tmp_path / "cache"), "--json"])
    assert shown.exit_code == 0, shown.output
    row = json.loads(shown.stdout)["run"]
    assert row["status"] == "completed" and row["purged_at_ms"] is not None
    text = CliRunner().invoke(cli, [*args, "--cache-dir", str(tmp_path / "cache2")]).output
    assert "purged" in text and "past finished_retention" in text
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=30)
    ticks = [line for line in log.read_text().splitlines() if line.startswith("sleepy-")]
    log.write_text("".join(f"{line}\n" for line in ticks))  # three_steps' lines aside
    print(check_ticks(log, journal, sleepy))


def test_a_handover_to_an_instance_with_an_empty_disk_restores_from_the_snapshots(
    kafka_bootstrap, ns, tmp_path
):
    """w2 joins: w1 hands half the partitions over (gracefully) and w2, with an empty disk,
    restores them from ``<ns>.state``: the live runs only, a paused one still paused. Then
    the live runs are signalled, unpaused and cancelled across both owners."""
    state = tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", **SNAPSHOTS)
    w2 = None
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
    try:
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        done = [f"done-{i}" for i in range(12)]
        finished = set()
        for run_id in done:  # its result asked at once: past the 1 s retention it is gone
            client.start("three_steps", 1, run_id=run_id, wait=False)
            finished.add(client.result(run_id, timeout=60))
        waiting = [f"approval-{i}" for i in range(12)]
        for run_id in waiting:
            client.start("approval", None, run_id=run_id, wait=False)
        assert finished == {4}
        client.pause("approval-0", reason="hold")
        wait_for(
            lambda: _snapshot_runs(kafka_bootstrap, ns) == set(waiting),
            timeout=60,
            what="a snapshot of only the live runs",
        )
        w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", **SNAPSHOTS)
        taken = wait_for(lambda: owns(state, ns, "w2"), timeout=90, what="w2 to take some")
        assert client.get_run("approval-0").status == "paused"
        for run_id in waiting[1:]:
            client.signal(run_id, "approve", "ann")
        client.cancel("approval-1")  # approved already: the cancel changes nothing
        client.unpause("approval-0")
        client.cancel("approval-0")
        for run_id in waiting[1:]:
            assert client.result(run_id, timeout=60) == {"approved": True, "by": "ann"}
        with pytest.raises(runstream.RunCancelled):
            client.result("approval-0", timeout=60)
    finally:
        client.close()
        for w in (w1, w2):
            if w is not None and w.poll() is None:
                terminate(w)
    w2_log = (tmp_path / "w2.log").read_text()
    restored = [line for line in w2_log.splitlines() if "restored from its snapshot" in line]
    on_w2 = [r for r in waiting if partition_for(r.encode(), PARTITIONS) in taken]
    total = sum(int(line.split(": ")[-1].split()[0]) for line in restored)
    assert restored and len(on_w2) <= total <= len(waiting)  # live runs only
    assert "handover of partitions" in (tmp_path / "w1.log").read_text()


def _produce(bootstrap: str, topic: str, partition: int, records: list[tuple[bytes, bytes]]):
    producer = Producer(client_config(bootstrap))
    for key, value in records:
        producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


def _approval_facts(run_id: str) -> list[bytes]:
    codec, now = Codec.default(), int(time.time() * 1000)
    return [
        codec.encode(RunStarted(run_id, now, workflow="approval", version="1", input=b"null")),
        codec.encode(SignalAwaited(run_id, now, seq=1, name="approve", timeout_at_ms=None)),
    ]


def test_a_snapshot_in_format_1_restores(kafka_bootstrap, ns, tmp_path):
    """A snapshot written byte for byte in format 1 (the first one: a newer engine must keep
    reading it) holds a run the journal does not: the engine knows it from the snapshot
    alone, and the run goes on."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    run_id = "legacy"
    p = partition_for(run_id.encode(), PARTITIONS)
    started, awaited = _approval_facts(run_id)
    chunk = b"\x01C" + len(started).to_bytes(4, "big") + started
    chunk += len(awaited).to_bytes(4, "big") + awaited
    _produce(
        kafka_bootstrap,
        f"{ns}.state",
        p,
        [
            (b"legacy\x00\x00\x00\x00\x00", chunk),  # its facts from the first on
            (b"legacy", b"\x01H\x00\x00\x00\x02"),  # two facts, no heartbeats
            (b"\x00journal", b"\x01M" + bytes(8)),  # the journal from offset 0
        ],
    )
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the client")
    try:
        assert client.get_run(run_id).status == "running"
        client.signal(run_id, "approve", "bob")
        assert client.result(run_id, timeout=60) == {"approved": True, "by": "bob"}
    finally:
        client.close()
        worker.stop()


def test_an_unreadable_snapshot_falls_back_to_the_journal(kafka_bootstrap, ns, tmp_path, caplog):
    """A snapshot of a format this engine does not know (99) is not used: the partition is
    restored from its journal, which has the run, and says so in the log."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    run_id = "journaled"
    p = partition_for(run_id.encode(), PARTITIONS)
    _produce(
        kafka_bootstrap, f"{ns}.journal", p, [(run_id.encode(), f) for f in _approval_facts(run_id)]
    )
    _produce(
        kafka_bootstrap,
        f"{ns}.state",
        p,
        [
            (b"other", b"\x63H\x00\x00\x00\x01"),
            (b"\x00journal", b"\x63M" + (99).to_bytes(8, "big")),
        ],
    )
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the client")
    try:
        assert client.get_run(run_id).status == "running"
        client.signal(run_id, "approve", "cy")
        assert client.result(run_id, timeout=60) == {"approved": True, "by": "cy"}
    finally:
        client.close()
        worker.stop()
    assert f"snapshot of partition {p} unreadable (snapshot format 99" in caplog.text


def test_an_owner_whose_disk_is_current_reads_no_snapshot(kafka_bootstrap, ns, tmp_path, caplog):
    """A restart on the same disk catches its projection up from its own offset, as
    before: the snapshots are for an empty disk only (as a third start, on a deleted
    disk, shows)."""
    caplog.set_level(logging.INFO, logger="runstream.snapshots")
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    settings = {"snapshot_interval": 0.5}
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state", **settings)
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the client")
    try:
        client.start("approval", None, run_id="kept")
        wait_for(lambda: "kept" in _snapshot_runs(kafka_bootstrap, ns), what="a snapshot")
        worker.stop()
        restored = f"partition {partition_for(b'kept', PARTITIONS)} restored from its snapshot"
        assert restored not in caplog.text  # a new namespace: none
        worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state", **settings)
        client.signal("kept", "approve", "dee")
        assert client.result("kept", timeout=60) == {"approved": True, "by": "dee"}
        worker.stop()
        assert restored not in caplog.text
        shutil.rmtree(tmp_path / "state")
        worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state", **settings)
        assert client.get_run("kept").status == "completed"
        assert restored in caplog.text
    finally:
        client.close()
        worker.stop()
