"""W5S: W5 with snapshots (issue 24). A journal of many finished W1 runs and a few live
ones (`wait_signal`, waiting); with a 1 s ``finished_retention`` the engine purges the
finished runs and its snapshots in ``<ns>.state`` hold only the live ones. Then, on an
empty disk each time, the engine restores once from the snapshots (and the journal's
tail) and once from the whole journal (snapshots off), and the ratio of the two restore
times is the figure (the goal: at least 20 times faster for 1,000,000 facts and 1,000
live runs)."""

from __future__ import annotations

import re
import shutil
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

import runstream
from runstream.projections.snapshot import Image
from runstream.topics.admin import client_config, consume_ready

from .harness import PARTITIONS, Bench, Engine, base_record, finish_record, fmt_spread, log, spread
from .workloads import FACTS_PER_W1_RUN, _new_rep, _record_common, _settings, engines, throughput

_RESTORED = re.compile(r"partitions \[[\d, ]*\] restored: (\d+) facts in ([\d.]+)s")
_SNAPSHOT = {"RUNSTREAM_SNAPSHOT_INTERVAL": "1", "RUNSTREAM_FINISHED_RETENTION": "1"}
_OFF = {"RUNSTREAM_SNAPSHOT_INTERVAL": "0"}  # a new owner reads the whole journal


def w5s(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    runs = args.runs or -(-1_000_000 // FACTS_PER_W1_RUN)
    live = max(1, runs // 125)  # 1,000 live runs for 1,000,000 facts
    in_flight = args.in_flight or 256
    record = base_record(bench, "W5S", "restore from the snapshots vs from the journal", argv)
    record["instances"] = 1
    record["params"] = {
        "runs": runs,
        "live_runs": live,
        "facts_target": runs * FACTS_PER_W1_RUN,
        "repeat": args.repeat,
        "settings": _SNAPSHOT,
        "measure": "start the live runs (waiting for a signal), fill the journal with W1 runs; "
        "wait until <ns>.state holds only the live runs; then twice on an empty state dir: "
        "restart with snapshots (restore from them and the journal's tail) and with "
        "snapshots off (the whole journal); restore time = the engine's logged restore "
        "seconds (partitions [..] restored: n facts in s), summed",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W5S", r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        with engines(bench, ns, rep, env=dict(_SNAPSHOT)) as (engine,):
            with runstream.Client(ns, bench.bootstrap) as client:
                for i in range(live):
                    client.start("wait_signal", None, run_id=f"w5s-live-{r}-{i}", wait=False)
            log(f"W5S repeat {r + 1}: {live} live runs, filling with {runs} W1 runs")
            rep["fill"] = throughput(bench, ns, runs, in_flight, f"w5s-{r}-", timeout=120)
            began = time.perf_counter()
            rep["snapshot_runs"] = _wait_snapshot(bench, ns, live, args.timeout or 1800)
            rep["purge_s"] = round(time.perf_counter() - began, 1)
            engine.stop()
            for mode, env in (("snapshot", _SNAPSHOT), ("journal", _OFF)):
                shutil.rmtree(engine.state_dir / ns / engine.instance)
                engine.env = dict(env)
                rep[mode] = _restore(bench, ns, engine, f"w5s-live-{r}-0")
                engine.stop()
            # as the log cleaner leaves <ns>.state in steady state: compacted
            rep["state_records_as_written"] = _records(bench.bootstrap, ns)
            _compact(bench, ns, engine, r, live)
            rep["state_records_compacted"] = _records(bench.bootstrap, ns)
            shutil.rmtree(engine.state_dir / ns / engine.instance)
            engine.env = dict(_SNAPSHOT)
            rep["snapshot_compacted"] = _restore(bench, ns, engine, f"w5s-live-{r}-0")
        journal_s = rep["journal"]["restore_s"]
        rep["ratio"] = round(journal_s / rep["snapshot"]["restore_s"], 1)
        rep["ratio_compacted"] = round(journal_s / rep["snapshot_compacted"]["restore_s"], 1)
        log(f"W5S repeat {r + 1}: {rep['snapshot']} vs {rep['journal']}: x{rep['ratio']}")
    _record_common(record, reps)
    summary = {
        "snapshot_restore_s": spread(rep["snapshot"]["restore_s"] for rep in reps),
        "journal_restore_s": spread(rep["journal"]["restore_s"] for rep in reps),
        "ratio": spread(rep["ratio"] for rep in reps),
        "snapshot_compacted_restore_s": spread(
            rep["snapshot_compacted"]["restore_s"] for rep in reps
        ),
        "ratio_compacted": spread(rep["ratio_compacted"] for rep in reps),
    }
    record["summary"] = summary
    record = finish_record(record)
    line = (
        f"W5S: {runs * FACTS_PER_W1_RUN:,} facts, {live} live runs: restore from the "
        f"snapshots {fmt_spread(summary['snapshot_restore_s'], ' s', 2)}, from the journal "
        f"{fmt_spread(summary['journal_restore_s'], ' s', 2)}: "
        f"x{fmt_spread(summary['ratio'], '', 1)}; once <ns>.state is compacted "
        f"{fmt_spread(summary['snapshot_compacted_restore_s'], ' s', 2)}: "
        f"x{fmt_spread(summary['ratio_compacted'], '', 1)}; x{args.repeat}"
    )
    return record, line


def _records(bootstrap: str, ns: str) -> int:
    """How many records ``<ns>.state`` holds now (compaction keeps the offsets: counted)."""
    return sum(image.records for image in _images(bootstrap, ns).values())


def _compact(bench: Bench, ns: str, engine: Engine, r: int, live: int) -> None:
    """Have the log cleaner compact ``<ns>.state`` now (it would within the hour): roll
    segments at once, clean at any dirt, drop tombstones at once; a few more runs make the
    segments roll; wait until the records are about the live runs'."""
    admin = AdminClient(client_config(bench.bootstrap))
    configs = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"}
    resource = ConfigResource(
        ResourceType.TOPIC,
        f"{ns}.state",
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    shutil.rmtree(engine.state_dir / ns / engine.instance)
    engine.env = dict(_SNAPSHOT)
    engine.start()
    deadline = time.monotonic() + 300
    with runstream.Client(ns, bench.bootstrap) as client:
        i = 0
        while time.monotonic() < deadline:
            for _ in range(PARTITIONS):  # appends: the active segments roll
                client.start("w1", 1, run_id=f"w5s-roll-{r}-{i}", wait=False)
                i += 1
            client.flush(30)
            time.sleep(5)
            count = _records(bench.bootstrap, ns)
            log(f"  <ns>.state: {count} records")
            if count <= 4 * live + 200:
                break
    engine.stop()


def _wait_snapshot(bench: Bench, ns: str, live: int, timeout: float) -> int:
    """Wait until ``<ns>.state`` holds ``live`` runs (the finished ones purged)."""
    deadline = time.monotonic() + timeout
    while True:
        count = sum(len(list(image.runs())) for image in _images(bench.bootstrap, ns).values())
        log(f"  <ns>.state holds {count} runs")
        if count <= live or time.monotonic() > deadline:
            return count
        time.sleep(5)


def _images(bootstrap: str, ns: str) -> dict[int, _Counted]:
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"w5s-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(f"{ns}.state", p, 0) for p in range(PARTITIONS)])
        images, at_end = {p: _Counted() for p in range(PARTITIONS)}, set()
        while len(at_end) < PARTITIONS:
            for msg in consume_ready(consumer, 1.0, 10_000):
                if msg.error() is None:
                    images[msg.partition()].add(msg.key(), msg.value())
                    images[msg.partition()].records += 1
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
        return images
    finally:
        consumer.close()


class _Counted(Image):
    def __init__(self) -> None:
        super().__init__()
        self.records = 0


def _restore(bench: Bench, ns: str, engine: Engine, live_run: str) -> dict[str, Any]:
    """Start the engine on an empty state dir; once it answers about a live run, the
    restore it logged."""
    t0 = time.perf_counter()
    engine.start()
    with runstream.Client(ns, bench.bootstrap) as client:
        status = client.get_run(live_run, timeout=600).status
    wall = time.perf_counter() - t0
    found = _RESTORED.findall(engine.logs[-1].read_text(errors="replace"))
    return {
        "facts": sum(int(f) for f, _ in found),
        "restore_s": round(sum(float(s) for _, s in found), 3),
        "restart_to_answer_s": round(wall, 3),
        "live_run_status": status,
    }
