"""The invariants a chaos run must keep, checked from what the system left behind: the
runs' outputs, the journal, and the step log every body appended to.

- every run finished with the output its input implies;
- every step the journal recorded ran, and none of its bodies started after the fact that
  recorded it (a committed step never runs again);
- a body ran more than once only where at-least-once allows it: the process of an earlier
  execution was killed or stopped between its start and the recorded execution's commit,
  died (the watchdog ends a process whose Kafka call hangs), lost the run's partition, or the
  engine failed that attempt (a remote attempt timed
  out, a retry);
- at most `app.GATE` bodies of the limited step ran at once (executions of a process that
  was killed or stopped meanwhile are zombies the limit cannot stop, and are left out);
- each run received its event exactly once, the one published for it;
- a `read_committed` tail that followed the journal during the run (`JournalTail`) saw
  nothing the final journal does not hold, and no record of a transaction that the
  journal's own evidence names aborted (a delayed EndTxn, KAFKA-17754).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from runstream.audit.txns import TxnLedger
from runstream.engine import payload
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config
from runstream.topics.catchup import PartitionReader
from runstream.topics.txn import TXN, WRITER

from .app import GATE, expected

#: (type name, record, partition, the record's timestamp: when the engine produced it, after
#: the decision and before its commit; a fact's own ``at_ms`` is when its batch began).
Fact = tuple[str, dict[str, Any], int, float]


def read_journal(bootstrap: str, ns: str) -> list[Fact]:
    """Every committed fact of the namespace's journal, decoded."""
    reader = PartitionReader(client_config(bootstrap), f"{ns}.journal")
    codec, out = Codec.default(), []
    try:
        layout = reader.layout()
        assert layout is not None, f"no journal for {ns}"
        for records, _ in reader.read({p: 0 for p in layout.bounds}):
            for rec in records:
                name, fact = codec.decode_raw(rec.value or b"")
                out.append((name, fact, rec.partition, rec.timestamp_ms / 1000))
    finally:
        reader.close()
    return out


def outputs(results: dict[int, Any]) -> list[str]:
    return [
        f"order-{i} ended with {got!r}, not {expected(i)!r}"
        for i, got in sorted(results.items())
        if got != expected(i)
    ]


def events(journal: list[Fact], run_ids: list[str]) -> list[str]:
    received: dict[str, list[Any]] = defaultdict(list)
    for name, fact, _, _ in journal:
        if name == "EventReceived":
            received[fact["run_id"]].append(payload.loads(fact["payload"]))
    return [
        f"{rid} received its event {len(received[rid])} times: {received[rid]}"
        for rid in run_ids
        if len(received[rid]) != 1 or received[rid][0] != {"i": int(rid.split("-")[1])}
    ]


def steps(
    step_log: Path,
    journal: list[Fact],
    faulted: dict[int, list[tuple[float, float]]],
    survivors: set[int],
    out: Path,
) -> tuple[list[str], dict[str, Any]]:
    """The step invariants, and figures about re-executions. ``survivors``: the engine and
    task worker processes alive at the end; any other process died during the run (killed,
    or ended by itself, e.g. the watchdog ending a hung Kafka call), and its unrecorded
    executions may run again."""
    runs: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(dict)  # -> exec -> times
    lines = step_log.read_text().splitlines() if step_log.exists() else []
    for line in lines:
        step, run, execution, _mark, at = line.split()
        runs[(step, run)].setdefault(execution, []).append(float(at))
    completed: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    failed: Counter[tuple[str, str]] = Counter()
    partition_of: dict[str, int] = {}
    recoveries = 0
    for name, fact, p, produced in journal:
        partition_of[fact["run_id"]] = p
        if name == "StepCompleted" and fact["seq"] > 0:
            execution = payload.loads(fact["output"])["x"]
            completed[(fact["name"], fact["run_id"])].append((execution, produced))
        elif name == "StepFailed":
            failed[(fact["name"], fact["run_id"])] += 1
        elif name == "RunRecovered":
            recoveries += 1
    lost = partitions_lost(out)

    def faulted_during(pid: int, start: float, end: float) -> bool:
        return any(a <= end and start <= b for a, b in faulted.get(pid, []))

    violations, again = [], Counter[str]()
    for key, records in completed.items():
        step, run = key
        if len(records) != 1:
            violations.append(f"{step} of {run} recorded {len(records)} times")
            continue
        execution, at = records[0]
        executions = runs.get(key, {})
        if execution not in executions:
            violations.append(f"{step} of {run}: the recorded execution {execution} never ran")
        for other, times in executions.items():
            if times[0] >= at + 0.001:  # record timestamps are whole milliseconds
                late = times[0] - at
                violations.append(f"{step} of {run}: {other} started {late:.3f}s after its commit")
            if other == execution:
                continue
            pid = int(other.split("-")[0])
            if faulted_during(pid, times[0], at):  # before its result could be recorded
                again["its process was killed or stopped"] += 1
            elif pid not in survivors:
                again["its process died (watchdog, crash)"] += 1
            elif (str(pid), partition_of[run]) in lost:
                again["its process lost the partition"] += 1
            elif failed[key]:
                again["the engine failed that attempt"] += 1
            else:
                violations.append(f"{step} of {run} ran again for no reason: {other}")
    gated = [
        (times[0], times[1])
        for (step, _), execs in runs.items()
        if step == "gated"
        for execution, times in execs.items()
        if len(times) == 2 and not faulted_during(int(execution.split("-")[0]), *times)
    ]
    most = _most_at_once(gated)
    if most > GATE:
        violations.append(f"{most} bodies of the limited step ran at once (limit {GATE})")
    bodies = sum(len(e) for e in runs.values())
    figures = {
        "step bodies": bodies,
        "re-executions": dict(again) or 0,
        "recoveries": recoveries,
        "most limited bodies at once": most,
    }
    return violations, figures


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = now = 0
    for _, delta in edges:
        now += delta
        most = max(most, now)
    return most


def partitions_lost(log_dir: Path) -> set[tuple[str, int]]:
    """(pid, partition) for every partition an engine process logged it lost or gave up."""
    found = set()
    for path in log_dir.glob("*.log"):
        text = path.read_text(errors="replace")
        for m in re.finditer(r"partitions \[([\d, ]*)\] (?:lost|revoked) \(process (\d+)\)", text):
            found |= {(m[2], int(p)) for p in m[1].split(",") if p.strip()}
    return found


#: A journal record as a tail sees it: (partition, offset) -> (writer, txn) from its headers.
Seen = dict[tuple[int, int], tuple[str, str]]


def _read_committed(bootstrap: str, topic: str) -> Consumer:
    return Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"chaos-tail-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def _seen(msg: Any) -> tuple[tuple[int, int], tuple[str, str]]:
    h = {k: v for k, v in (msg.headers() or [])}
    return (msg.partition(), msg.offset()), (
        h.get(WRITER, b"").decode(),
        h.get(TXN, b"").decode(),
    )


class JournalTail(threading.Thread):
    """Follows the journal with `read_committed` while the faults go on, keeping what it
    saw; `stop` ends it."""

    def __init__(self, bootstrap: str, ns: str, partitions: int) -> None:
        super().__init__(name="journal-tail", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, f"{ns}.journal", partitions
        self.seen: Seen = {}
        self._halt = threading.Event()

    def run(self) -> None:
        consumer = _read_committed(self.bootstrap, self.topic)
        tps = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)]
        consumer.assign(tps)
        try:
            while not self._halt.is_set():
                for msg in consumer.consume(500, 0.5):
                    if msg.error() is None:
                        where, txn = _seen(msg)
                        self.seen[where] = txn
        finally:
            consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


def tail_problems(bootstrap: str, ns: str, partitions: int, live: Seen) -> list[str]:
    """What the live tail saw against the final journal: every record it saw is there,
    with the same transaction, and none of a transaction named aborted."""
    topic = f"{ns}.journal"
    consumer = _read_committed(bootstrap, topic)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    final: Seen = {}
    ledger, done = TxnLedger(), set[int]()
    try:
        while len(done) < partitions:
            for msg in consumer.consume(500, 5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(msg.partition())
                    continue
                where, txn = _seen(msg)
                final[where] = txn
                ledger.add(msg.key(), msg.partition(), msg.offset(), msg.headers() or [])
    finally:
        consumer.close()
    out = []
    for (p, offset), (writer, seq) in sorted(live.items()):
        if final.get((p, offset)) != (writer, seq):
            out.append(
                f"the live tail saw p{p}@{offset} of transaction {seq} of writer {writer}; "
                f"the final journal has {final.get((p, offset))} there"
            )
        elif seq and int(seq) in ledger.aborted.get(writer, {}):
            out.append(
                f"the live tail saw p{p}@{offset} of transaction {seq} of writer {writer}, "
                "which the journal names aborted"
            )
    return out
