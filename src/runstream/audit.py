"""Audit a namespace's journal: prove its invariants hold, run by run.

`audit()` reads every committed record of ``<ns>.journal`` and ``<ns>.dlq`` and
checks, per run (ARCHITECTURE.md section 7):

- the first fact is RunStarted, and there is exactly one;
- the positive sequence numbers used are 1..k with no gap, the negative ones
  (compensations) -1..-m;
- each (run, seq) is settled at most once (StepCompleted, a final StepFailed,
  TimerFired, SignalReceived, SignalTimedOut, ValueRecorded), and nothing
  starts it again once settled: a completed step never runs again;
- a StepCompleted or StepFailed answers the open StepStarted of that seq and
  attempt; a step starts again while running only after a RunRecovered;
- a finished run has exactly one terminal fact (RunCompleted, RunFailed,
  RunCancelled, RunDead) and nothing after it;
- every record is keyed by its run id and lies on the partition that id
  hashes to (Kafka's murmur2), so commands and journal stay co-partitioned;
- every dead run has a "run dead:" record on the dlq (and every such record a
  dead run);
- a run that has not finished is suspended for a reason: a step in flight, a
  retry scheduled, an open timer, an open signal wait, or parked. With
  ``expect_finished`` an unfinished run is a violation too.

The rules live in :class:`RunCheck`, which sees one fact at a time and keeps only
a few small dicts per run, so a journal of millions of facts is read in one pass.
:func:`check_run` applies it to a list of facts, without a broker.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from runstream.errors import DecodeError, TopicError

__all__ = ["AuditReport", "RunCheck", "Violation", "audit", "check_run"]

TERMINAL = {
    "RunCompleted": "completed",
    "RunFailed": "failed",
    "RunCancelled": "cancelled",
    "RunDead": "dead",
}
# Facts that settle their sequence number for good (a StepFailed only when final).
SETTLING = frozenset(
    {"StepCompleted", "TimerFired", "SignalReceived", "SignalTimedOut", "ValueRecorded"}
)
_KNOWN = frozenset(
    {
        *TERMINAL,
        *SETTLING,
        "RunStarted",
        "StepStarted",
        "StepFailed",
        "TimerScheduled",
        "SignalAwaited",
        "SignalBuffered",
        "RunRecovered",
        "CompensationStarted",
        "RunParked",
    }
)
_KEEPS_PARKED = frozenset({"RunParked", "SignalBuffered"})  # as in engine.reducer
_DEAD_PREFIX = "run dead:"

# Why an unfinished run may legitimately wait, by the kind of its open operation.
_WAITS = {
    "StepStarted": "step in flight",
    "StepFailed": "retry scheduled",
    "TimerScheduled": "open timer",
    "SignalAwaited": "open signal wait",
}
_WAIT_ORDER = ("step in flight", "retry scheduled", "open timer", "open signal wait")


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: where (run, partition, offsets) and what."""

    run_id: str
    partition: int | None
    offsets: tuple[int, ...]
    message: str

    def __str__(self) -> str:
        where = "" if self.partition is None else f"p{self.partition} "
        at = ",".join(map(str, self.offsets))
        return f"run {self.run_id!r} [{where}@{at}]: {self.message}"


class RunCheck:
    """The journal rules for one run, fed its facts in journal order by :meth:`add`.

    ``pos`` is where a fact was read (its offset, or its index in a list); each
    problem is recorded as ``(message, positions)``. Call :meth:`finish` once, after
    the last fact.
    """

    __slots__ = (
        "after_end",
        "dead_lettered",
        "facts",
        "first",
        "key",
        "open",
        "parked",
        "partition",
        "problems",
        "recovering",
        "run_id",
        "seqs",
        "settled",
        "starts",
        "status",
        "terminal_at",
    )

    def __init__(self, run_id: str, partition: int | None = None) -> None:
        self.run_id = run_id
        self.key = run_id.encode()
        self.partition = partition  # where every record of the run must be
        self.facts = 0
        self.first: str | None = None
        self.starts = 0
        self.status: str | None = None  # completed/failed/cancelled/dead once terminal
        self.terminal_at = -1
        self.after_end: list[tuple[str, int]] = []
        self.parked = False
        self.dead_lettered = False
        self.problems: list[tuple[str, tuple[int, ...]]] = []
        # seq -> (kind of open fact, its attempt, its position): what the run waits for
        self.open: dict[int, tuple[str, int, int]] = {}
        self.settled: dict[int, tuple[str, int]] = {}  # seq -> (fact, position)
        self.seqs: set[int] = set()
        self.recovering: set[int] = set()  # seqs with a RunRecovered, not yet restarted

    def _bad(self, message: str, *positions: int) -> None:
        self.problems.append((message, positions))

    def add(self, name: str, rec: dict[str, Any], pos: int) -> None:
        """Check one fact against what the run's earlier facts allow."""
        self.facts += 1
        if self.first is None:
            self.first = name
            if name != "RunStarted":
                self._bad(f"first fact is {name}, not RunStarted", pos)
        if self.status is not None:  # nothing may follow the end
            self.after_end.append((name, pos))
            if name in SETTLING or (name == "StepFailed" and rec["retry_at_ms"] is None):
                self._settled_twice(name, rec["seq"], pos)
            return
        if self.parked and name not in _KEEPS_PARKED:
            self.parked = False
        opened, settled = self.open, self.settled
        seq = rec.get("seq")
        if seq is not None:
            self.seqs.add(seq)
        if name == "StepStarted":
            attempt = rec["attempt"]
            if seq in settled:
                fact, at = settled[seq]
                self._bad(
                    f"StepStarted seq {seq} attempt {attempt} after {fact} settled it: "
                    "a settled step ran again",
                    at,
                    pos,
                )
                return
            prev = opened.get(seq)
            if prev is None:
                if attempt != 1:
                    self._bad(f"StepStarted seq {seq} opens with attempt {attempt}, not 1", pos)
            else:
                kind, prev_attempt, at = prev
                if kind == "StepStarted" and seq not in self.recovering:
                    self._bad(
                        f"StepStarted seq {seq} attempt {attempt} while attempt "
                        f"{prev_attempt} runs, with no RunRecovered",
                        at,
                        pos,
                    )
                elif kind not in ("StepStarted", "StepFailed"):
                    self._bad(f"StepStarted seq {seq} while {kind} is open on it", at, pos)
                if attempt != prev_attempt + 1:
                    self._bad(
                        f"StepStarted seq {seq} attempt {attempt} follows attempt {prev_attempt}",
                        at,
                        pos,
                    )
            self.recovering.discard(seq)
            opened[seq] = ("StepStarted", attempt, pos)
        elif name == "StepCompleted" or name == "StepFailed":
            if self._settled_twice(name, seq, pos):
                return
            attempt = rec["attempt"]
            prev = opened.get(seq)
            if prev is None or prev[0] != "StepStarted" or prev[1] != attempt:
                what = "nothing" if prev is None else f"{prev[0]} attempt {prev[1]}"
                self._bad(
                    f"{name} seq {seq} attempt {attempt} answers no StepStarted of that "
                    f"attempt (open: {what})",
                    *([prev[2]] if prev else []),
                    pos,
                )
            if name == "StepFailed" and rec["retry_at_ms"] is not None:
                opened[seq] = ("StepFailed", attempt, pos)  # a retry is scheduled
            else:
                opened.pop(seq, None)
                settled[seq] = (name, pos)
        elif name in SETTLING:  # TimerFired, SignalReceived, SignalTimedOut, ValueRecorded
            if self._settled_twice(name, seq, pos):
                return
            prev = opened.pop(seq, None)
            need = _OPENED_BY.get(name)
            if prev is not None and prev[0] not in need:
                self._bad(f"{name} seq {seq} settles an open {prev[0]}", prev[2], pos)
            elif prev is None and name in _NEEDS_OPEN:
                self._bad(f"{name} seq {seq} with no open {' or '.join(need)}", pos)
            settled[seq] = (name, pos)
        elif name == "TimerScheduled" or name == "SignalAwaited":
            if seq in settled or seq in opened:
                at = (settled.get(seq) or opened[seq])[-1]
                self._bad(f"{name} seq {seq} reuses a sequence number", at, pos)
            opened[seq] = (name, 0, pos)
        elif name == "RunRecovered":
            prev = opened.get(seq)
            if prev is None or prev[0] != "StepStarted":
                self._bad(f"RunRecovered seq {seq} but no step of that seq is running", pos)
            self.recovering.add(seq)
        elif name in TERMINAL:
            self.status, self.terminal_at = TERMINAL[name], pos
            self._close()
        elif name == "RunStarted":
            self.starts += 1
            if self.starts > 1:
                self._bad("a second RunStarted", pos)
        elif name == "RunParked":
            self.parked = True
        elif name not in _KNOWN:
            self._bad(f"{name} is not a journal fact", pos)

    def _settled_twice(self, name: str, seq: int, pos: int) -> bool:
        earlier = self.settled.get(seq)
        if earlier is None:
            return False
        self._bad(
            f"{name} seq {seq} settles it a second time (first: {earlier[0]})", earlier[1], pos
        )
        return True

    def _close(self) -> None:
        """Check the sequence numbers, then drop what only an open run needs."""
        seqs = self.seqs
        for sign, used in ((1, [s for s in seqs if s > 0]), (-1, [-s for s in seqs if s < 0])):
            if used and max(used) != len(used):  # 1..k with no gap, each seq counted once
                missing = sorted(set(range(1, max(used) + 1)) - set(used))[:5]
                self._bad(
                    f"sequence numbers skip {[sign * m for m in missing]} "
                    f"(highest used: {sign * max(used)})"
                )
        if 0 in seqs:
            self._bad("sequence number 0 is used")
        if self.status is not None:  # a finished run keeps only what spots a duplicate
            for container in (self.open, self.seqs, self.recovering):
                container.clear()

    def waiting_for(self) -> str | None:
        """Why an unfinished run may wait (None: it waits for nothing, it is stuck)."""
        if self.parked:
            return "parked"
        kinds = {_WAITS[kind] for kind, _, _ in self.open.values()}
        return next((w for w in _WAIT_ORDER if w in kinds), None)

    def finish(self, expect_finished: bool = False) -> str:
        """The end-of-journal checks; returns the run's status for the report:
        its terminal status, ``suspended: <why>``, or ``stuck``."""
        if self.first is None:
            return "empty"
        if self.after_end:
            shown = ", ".join(f"{n}@{p}" for n, p in self.after_end[:5])
            more = f" and {len(self.after_end) - 5} more" if len(self.after_end) > 5 else ""
            self._bad(
                f"{len(self.after_end)} facts after the terminal one: {shown}{more}",
                self.terminal_at,
                *(p for _, p in self.after_end[:5]),
            )
        if self.status is None:
            self._close()
        if self.status == "dead" and not self.dead_lettered:
            self._bad(
                "the run is dead but the dlq has no 'run dead:' record of it", self.terminal_at
            )
        if self.status is not None:
            return self.status
        why = self.waiting_for()
        if why is None:
            self._bad("the run has not finished and waits for nothing (stuck)")
            return "stuck"
        if expect_finished:
            self._bad(f"the run has not finished ({why})")
        return f"suspended: {why}"


# What a settling fact may settle, and which ones need it open.
_OPENED_BY = {
    "TimerFired": ("TimerScheduled",),
    "SignalTimedOut": ("SignalAwaited",),
    "SignalReceived": ("SignalAwaited",),
    "ValueRecorded": (),
}
_NEEDS_OPEN = frozenset({"TimerFired", "SignalTimedOut"})


def check_run(
    facts: Iterable[tuple[str, dict[str, Any]]],
    *,
    expect_finished: bool = False,
    dead_lettered: bool = False,
) -> list[str]:
    """The rule violations of one run's facts, in journal order (no broker needed).

    Positions in the messages are indexes into ``facts``.
    """
    check: RunCheck | None = None
    for i, (name, rec) in enumerate(facts):
        if check is None:
            check = RunCheck(rec.get("run_id", ""))
        check.add(name, rec, i)
    if check is None:
        return []
    check.dead_lettered = dead_lettered
    check.finish(expect_finished)
    return [f"{msg} @{','.join(map(str, at))}" if at else msg for msg, at in check.problems]


@dataclass
class AuditReport:
    """What :func:`audit` found."""

    namespace: str
    runs: int = 0
    facts: int = 0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)  # final status -> runs
    violations: list[Violation] = field(default_factory=list)
    # (run, seq) -> its RunRecovered facts: how often a step was restarted after a crash
    recovered: Counter[tuple[str, int]] = field(default_factory=Counter)
    dead_letters: int = 0  # dlq records of any kind

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def facts_per_second(self) -> float:
        return self.facts / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "runs": self.runs,
            "facts": self.facts,
            "seconds": round(self.seconds, 3),
            "facts_per_second": round(self.facts_per_second),
            "statuses": dict(sorted(self.statuses.items())),
            "recovered": self.recovered.total(),
            "dead_letters": self.dead_letters,
            "violations": [
                {
                    "run_id": v.run_id,
                    "partition": v.partition,
                    "offsets": list(v.offsets),
                    "message": v.message,
                }
                for v in self.violations
            ],
        }


Progress = Callable[[int, float], None]  # (facts read so far, seconds so far)


def audit(
    bootstrap: str,
    ns: str,
    *,
    expect_finished: bool = False,
    progress: Progress | None = None,
    idle_timeout: float = 30.0,
) -> AuditReport:
    """Read ``<ns>.journal`` and ``<ns>.dlq`` to their ends and check every run.

    Reads committed records only. Meant for a quiet namespace; on a live one,
    runs still moving show as suspended (or as violations with ``expect_finished``).

    Raises:
        TopicError: the namespace's journal does not exist.
        TimeoutError: no record and no end of partition for ``idle_timeout`` seconds.
    """
    from confluent_kafka import (
        OFFSET_BEGINNING,
        Consumer,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    from runstream.config import client_config
    from runstream.schemas.codec import Codec
    from runstream.topics.partitioner import partition_for
    from runstream.topics.spec import Topics

    began = time.monotonic()
    topics = Topics(ns)
    report = AuditReport(ns)
    decode = Codec.default().decode
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"{ns}.audit-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
        }
    )
    eof = KafkaError._PARTITION_EOF

    def partitions(topic: str) -> list[int]:
        md = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if md is None or md.error is not None or not md.partitions:
            raise TopicError(f"topic {topic!r} does not exist at {bootstrap}")
        return sorted(md.partitions)

    def read(topic: str, parts: list[int]) -> Iterable[Any]:
        """Every message of ``topic`` from its start to its end, in batches."""
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        at_end: set[int] = set()
        idle_since = time.monotonic()
        while len(at_end) < len(parts):
            batch = consumer.consume(10_000, 0.5)
            if not batch:
                if time.monotonic() - idle_since > idle_timeout:
                    raise TimeoutError(f"no record nor end of {topic} for {idle_timeout}s")
                continue
            idle_since = time.monotonic()
            for msg in batch:
                err = msg.error()
                if err is None:
                    yield msg
                elif err.code() == eof:
                    at_end.add(msg.partition())
                else:
                    raise KafkaException(err)
        consumer.unassign()

    try:
        journal_parts, dlq_parts = partitions(topics.journal), partitions(topics.dlq)
        n_parts = len(journal_parts)
        dead: dict[str, tuple[int, int]] = {}  # run id -> where its "run dead:" letter is
        for msg in read(topics.dlq, dlq_parts):
            report.dead_letters += 1
            try:
                _, rec = decode(msg.value())
            except DecodeError:
                continue  # not a DeadLetter: the engine writes only those
            if rec.get("run_id") and rec.get("reason", "").startswith(_DEAD_PREFIX):
                dead[rec["run_id"]] = (msg.partition(), msg.offset())

        runs: dict[str, RunCheck] = {}
        misplaced: list[Violation] = []
        facts = 0
        for msg in read(topics.journal, journal_parts):
            facts += 1
            if progress is not None and facts % 100_000 == 0:
                progress(facts, time.monotonic() - began)
            p, offset = msg.partition(), msg.offset()
            try:
                name, rec = decode(msg.value())
                run_id = rec["run_id"]
            except (DecodeError, KeyError, TypeError) as exc:
                key = (msg.key() or b"").decode(errors="replace")
                misplaced.append(Violation(key, p, (offset,), f"undecodable journal record: {exc}"))
                continue
            check = runs.get(run_id)
            if check is None:
                check = runs[run_id] = RunCheck(run_id, partition_for(run_id.encode(), n_parts))
            if p != check.partition or msg.key() != check.key:
                where = f"belong on partition {check.partition} with key {check.key!r}"
                message = (
                    f"{name} is on partition {p} with key {msg.key()!r}; the run's records {where}"
                )
                misplaced.append(Violation(run_id, p, (offset,), message))
                if p != check.partition:
                    continue  # its order against the run's other facts means nothing
            check.add(name, rec, offset)
            if name == "RunRecovered":
                report.recovered[run_id, rec["seq"]] += 1
    finally:
        consumer.close()

    statuses: Counter[str] = Counter()
    for run_id, check in runs.items():
        check.dead_lettered = run_id in dead
        statuses[check.finish(expect_finished)] += 1
        report.violations += [
            Violation(run_id, check.partition, at, msg) for msg, at in check.problems
        ]
    for run_id, (p, offset) in dead.items():
        check = runs.get(run_id)
        if check is None or check.status != "dead":
            report.violations.append(
                Violation(
                    run_id,
                    p,
                    (offset,),
                    (
                        f"the dlq reports the run dead (partition {p} of {topics.dlq}) "
                        "but its journal has no RunDead"
                    ),
                )
            )
    report.violations += misplaced
    report.runs, report.facts, report.statuses = len(runs), facts, dict(statuses)
    report.seconds = time.monotonic() - began
    return report
