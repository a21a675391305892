"""The Kafka floor: what the same broker does for bare confluent-kafka clients, with no
runstream code on the measured path (the harness only starts the broker).

* txn commit: one transactional producer; begin, produce one record, commit.
* hop: that producer produces one record and commits; a read_committed consumer assigned
  to the partition receives it. From before produce() until poll() returned it.
* batched transactions: sequential transactions of ``batch`` records each, spread over a
  12-partition topic (as the engine's batches touch many partitions); records/s, txns/s.
* round trip: W3's shape with no engine. A client produces a command and waits for its
  reply; a processor process consumes the command (read_committed, a group member) and in
  one transaction (of two producers taking turns, as the engine's) writes a journal, a
  lifecycle and a reply record, sends the consumed offset with the group's metadata
  (KIP-447) and commits. From before the command's produce until its reply was polled.
* round trip, position in the journal: the same, but the consumed offset travels as a
  header of the journal record instead of `send_offsets_to_transaction` (no
  AddOffsetsToTxn or TxnOffsetCommit): the ceiling of keeping the offsets out of the
  engine's commits, a design whose zombie fence is not built (the group's generation
  check that fences a zombie owner comes with the offsets).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from runstream.topics.spec import EVERY_TOPIC

from .harness import (
    PARTITIONS,
    Bench,
    base_record,
    finish_record,
    fmt_spread,
    latency_stats,
    log,
    spread,
)

VALUE = os.urandom(100)  # about the size of a journal fact

# The engine's producer settings that matter for latency (see "settings" in W1.json).
# retry.backoff.ms: right after a commit the coordinator answers the next transaction's
# AddPartitionsToTxn with CONCURRENT_TRANSACTIONS until its markers are written; with
# librdkafka's default 100 ms backoff back-to-back transactions cost ~100 ms each.
PRODUCER = {
    "linger.ms": 1,
    "retry.backoff.ms": 5,
    "transaction.timeout.ms": 10_000,
    "partitioner": "murmur2_random",
}
CONSUMER = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "fetch.wait.max.ms": 20,
}


def _conf(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "broker.address.family": "v4"}


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-floor-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(_conf(bootstrap))
    # Runstream's own topic configs (small index files: see `topics.spec`), so the floor
    # does not pay a stall its topics would not.
    topic = NewTopic(name, partitions, 1, config=dict(EVERY_TOPIC))
    admin.create_topics([topic])[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=10).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return name
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} not visible")


def _producer(bootstrap: str) -> Producer:
    p = Producer(
        {**_conf(bootstrap), **PRODUCER, "transactional.id": f"bench-floor-{uuid.uuid4().hex}"}
    )
    p.init_transactions(30)
    return p


def txn_commit(bootstrap: str, n: int, warmup: int) -> list[float]:
    topic = _topic(bootstrap, 1)
    p = _producer(bootstrap)
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        p.begin_transaction()
        p.produce(topic, VALUE, b"k", partition=0)
        p.commit_transaction(30)
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
    return out


def hop(bootstrap: str, n: int, warmup: int) -> list[float]:
    topic = _topic(bootstrap, 1)
    p = _producer(bootstrap)
    c = Consumer({**_conf(bootstrap), **CONSUMER, "group.id": f"bench-floor-{uuid.uuid4().hex}"})
    try:
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), 30)
        c.assign([TopicPartition(topic, 0, high)])

        def send(key: bytes) -> None:
            p.begin_transaction()
            p.produce(topic, VALUE, key, partition=0)
            p.commit_transaction(30)

        return _timed_trips("hop", send, c, n, warmup)
    finally:
        c.close()


def _timed_trips(
    what: str, send: Callable[[bytes], None], c: Consumer, n: int, warmup: int
) -> list[float]:
    """ms from before ``send(key)`` until ``c`` polled a record with that key, for each of
    ``warmup + n`` keys in turn; the first ``warmup`` are not kept."""
    out = []
    for i in range(warmup + n):
        key = f"{what}-{i}".encode()
        t0 = time.perf_counter()
        send(key)
        while True:
            msg = c.poll(10)
            if msg is None:
                raise RuntimeError(f"{what} {i}: no record with its key within 10 s")
            if msg.error() is None and msg.key() == key:
                break
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
    return out


def batched(bootstrap: str, txns: int, batch: int) -> dict[str, float]:
    topic = _topic(bootstrap, PARTITIONS)
    p = _producer(bootstrap)
    keys = [uuid.uuid4().hex.encode() for _ in range(batch * 4)]
    for _ in range(10):  # warm-up: metadata, partitions added to transactions
        p.begin_transaction()
        for k in keys[:batch]:
            p.produce(topic, VALUE, k)
        p.commit_transaction(30)
    t0 = time.perf_counter()
    for t in range(txns):
        p.begin_transaction()
        for j in range(batch):
            p.produce(topic, VALUE, keys[(t * batch + j) % len(keys)])
        p.commit_transaction(30)
    wall = time.perf_counter() - t0
    return {
        "txns": txns,
        "records": txns * batch,
        "wall_s": round(wall, 3),
        "txns_per_s": round(txns / wall, 1),
        "records_per_s": round(txns * batch / wall, 1),
    }


def _round_trip_processor(
    bootstrap: str, topics: dict[str, str], offsets: bool, ready: Any, stop: Any
) -> None:
    """The processor of `round_trip`, in its own process: what the engine does for one
    command, bare; without ``offsets`` the position goes in the journal record's header."""
    c = Consumer(
        {
            **_conf(bootstrap),
            **CONSUMER,
            "group.id": f"bench-floor-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,  # as the engine's consumer
        }
    )
    producers = [_producer(bootstrap), _producer(bootstrap)]
    c.subscribe([topics["commands"]], on_assign=lambda _c, _parts: ready.set())
    try:
        while not stop.is_set():
            msg = c.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            producers.reverse()  # take turns, as the engine's two producers do
            p, part = producers[0], msg.partition()
            position = msg.offset() + 1
            p.begin_transaction()
            headers = None if offsets else [("position", str(position).encode())]
            p.produce(topics["journal"], VALUE, msg.key(), partition=part, headers=headers)
            p.produce(topics["lifecycle"], VALUE, msg.key(), partition=part)
            p.produce(topics["replies"], VALUE[:60], msg.key(), partition=part)
            if offsets:
                offset = TopicPartition(topics["commands"], part, position)
                p.send_offsets_to_transaction([offset], c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
    finally:
        c.close()


def round_trip(bootstrap: str, n: int, warmup: int, offsets: bool = True) -> list[float]:
    topics = {
        t: _topic(bootstrap, PARTITIONS) for t in ("commands", "journal", "lifecycle", "replies")
    }
    mp = multiprocessing.get_context("spawn")  # librdkafka's threads do not survive a fork
    ready, stop = mp.Event(), mp.Event()
    proc = mp.Process(target=_round_trip_processor, args=(bootstrap, topics, offsets, ready, stop))
    proc.start()
    client = Producer({**_conf(bootstrap), "enable.idempotence": True, "linger.ms": 0})
    replies = Consumer(
        {**_conf(bootstrap), **CONSUMER, "group.id": f"bench-floor-{uuid.uuid4().hex}"}
    )
    try:
        if not ready.wait(60):
            raise RuntimeError("round trip: the processor was not assigned within 60 s")
        ends = []
        for p in range(PARTITIONS):
            _, high = replies.get_watermark_offsets(TopicPartition(topics["replies"], p), 30)
            ends.append(TopicPartition(topics["replies"], p, high))
        replies.assign(ends)

        def send(key: bytes) -> None:
            client.produce(topics["commands"], VALUE, key)
            client.flush(30)

        return _timed_trips(
            "round trip" if offsets else "round trip, position in the journal",
            send,
            replies,
            n,
            warmup,
        )
    finally:
        stop.set()
        replies.close()
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def floor(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    n = args.runs or 500
    warmup = 20 if args.warmup is None else args.warmup
    batch = args.batch or 64
    txns = max(200, n * 4)
    record = base_record(bench, "floor", "bare confluent-kafka on the same broker", argv)
    record["instances"] = 0
    record["params"] = {
        "iterations": n,
        "warmup": warmup,
        "batch_records": batch,
        "batch_txns": txns,
        "repeat": args.repeat,
        "value_bytes": len(VALUE),
        "producer": PRODUCER,
        "consumer": CONSUMER,
    }
    reps = []
    for r in range(args.repeat):
        bench.sampler.reset()
        rep: dict[str, Any] = {"repeat": r}
        try:
            rep["txn_commit_ms"] = latency_stats(txn_commit(bench.bootstrap, n, warmup))
            rep["hop_ms"] = latency_stats(hop(bench.bootstrap, n, warmup))
            rep["batched"] = batched(bench.bootstrap, txns, batch)
            rep["round_trip_ms"] = latency_stats(round_trip(bench.bootstrap, n, warmup))
            rep["round_trip_journal_position_ms"] = latency_stats(
                round_trip(bench.bootstrap, n, warmup, offsets=False)
            )
        except KafkaException as exc:
            rep["error"] = str(exc)
            raise
        finally:
            rep["peak_rss_mb"] = bench.sampler.peaks_mb()
            reps.append(rep)
        log(
            f"floor repeat {r + 1}: txn p50 {rep['txn_commit_ms']['p50']:.2f} ms, hop p50 "
            f"{rep['hop_ms']['p50']:.2f} ms, {rep['batched']['txns_per_s']} txns/s, "
            f"round trip p50 {rep['round_trip_ms']['p50']:.2f} ms, position in the journal "
            f"{rep['round_trip_journal_position_ms']['p50']:.2f} ms"
        )
    record["repeats"] = reps
    summary = {
        "txn_commit_ms": {k: spread(r["txn_commit_ms"][k] for r in reps) for k in ("p50", "p99")},
        "hop_ms": {k: spread(r["hop_ms"][k] for r in reps) for k in ("p50", "p99")},
        "batch_txns_per_s": spread(r["batched"]["txns_per_s"] for r in reps),
        "batch_records_per_s": spread(r["batched"]["records_per_s"] for r in reps),
        "round_trip_ms": {k: spread(r["round_trip_ms"][k] for r in reps) for k in ("p50", "p99")},
        "round_trip_journal_position_ms": {
            k: spread(r["round_trip_journal_position_ms"][k] for r in reps) for k in ("p50", "p99")
        },
    }
    record["summary"] = summary
    record["peak_rss_mb"] = {"broker": max(r["peak_rss_mb"].get("broker", 0) for r in reps)}
    record = finish_record(record)
    line = (
        f"floor: txn commit p50 {fmt_spread(summary['txn_commit_ms']['p50'], ' ms', 2)}, "
        f"p99 {fmt_spread(summary['txn_commit_ms']['p99'], ' ms', 2)}; hop p50 "
        f"{fmt_spread(summary['hop_ms']['p50'], ' ms', 2)}, p99 "
        f"{fmt_spread(summary['hop_ms']['p99'], ' ms', 2)}; {batch}-record txns "
        f"{fmt_spread(summary['batch_txns_per_s'], ' txns/s')}, "
        f"{fmt_spread(summary['batch_records_per_s'], ' records/s', 0)}; round trip p50 "
        f"{fmt_spread(summary['round_trip_ms']['p50'], ' ms', 2)}, p99 "
        f"{fmt_spread(summary['round_trip_ms']['p99'], ' ms', 2)}; position in the journal "
        f"p50 {fmt_spread(summary['round_trip_journal_position_ms']['p50'], ' ms', 2)}; "
        f"x {args.repeat}"
    )
    return record, line
