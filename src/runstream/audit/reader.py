"""Read a namespace's journal and dead-letter topic and check every run (`audit.rules`).

Reads committed records only. Meant for a quiet namespace; on a live one, runs still
moving show as suspended (or as violations with ``expect_finished``). Also checks what
only the log can tell: every record is keyed by its run id and lies on the partition
that id hashes to (Kafka's murmur2), so commands and journal stay co-partitioned; and,
with ``expect_finished``, that every child run a parent started did start, once, as that
parent's child (a second start would be a second RunStarted in the child's journal);
and that every named event a run received was matched to that wait by its entity, and
each wait matched once. And the journal's evidence of its transactions (`audit.txns`):
none named aborted is visible, none is torn, no sequence number is used twice or lost.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runstream.audit.rules import RunCheck, Violation
from runstream.audit.txns import TxnLedger
from runstream.engine.partitioner import partition_for
from runstream.errors import DecodeError, TopicError
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    FACTS,
    ChildEnded,
    ChildStarted,
    DeadLetter,
    EventMatched,
    EventReceived,
    Reason,
    RunRecovered,
    RunStarted,
)
from runstream.topics.admin import client_config, partition_count
from runstream.topics.kafka import read_to_end
from runstream.topics.spec import Topics

Progress = Callable[[int, float], None]  # (facts read so far, seconds so far)


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
    transactions: int = 0  # with a visible journal record and the evidence headers
    aborted_transactions: int = 0  # named aborted by a later one

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
            "transactions": self.transactions,
            "aborted_transactions": self.aborted_transactions,
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


def audit(
    bootstrap: str,
    ns: str,
    *,
    expect_finished: bool = False,
    progress: Progress | None = None,
    idle_timeout: float = 30.0,
    kafka: Mapping[str, Any] | None = None,
) -> AuditReport:
    """Read ``<ns>.journal`` and ``<ns>.dlq`` to their ends and check every run.

    Raises:
        TopicError: the namespace's journal or dlq does not exist.
        KafkaUnavailable: no broker answers.
        TimeoutError: no record and no end of partition for ``idle_timeout`` seconds.
    """
    began = time.monotonic()
    topics, report, decode = Topics(ns), AuditReport(ns), Codec.default().decode
    config = client_config(bootstrap, kafka)

    def read(topic: str) -> Any:
        try:
            yield from read_to_end(config, topic, idle_timeout=idle_timeout)
        except LookupError as exc:
            raise TopicError(f"{exc} at {bootstrap}") from None

    dead: dict[str, tuple[int, int]] = {}  # run id -> where its run-dead letter is
    for batch in read(topics.dlq):
        for rec in batch:
            report.dead_letters += 1
            try:
                letter = decode(rec.value)
            except DecodeError:
                continue  # not a DeadLetter: the engine writes only those
            if isinstance(letter, DeadLetter) and letter.run_id and letter.code == Reason.RUN_DEAD:
                dead[letter.run_id] = (rec.partition, rec.offset)

    runs: dict[str, RunCheck] = {}
    misplaced: list[Violation] = []
    children: list[tuple[str, str, int]] = []  # (parent, child, ChildStarted offset)
    parents: dict[str, str] = {}  # child run -> the parent its RunStarted names
    refused: set[tuple[str, str]] = set()  # (parent, child) whose start was refused
    matched: defaultdict[tuple[str, int], list[tuple[str, int, int]]] = defaultdict(list)
    received: list[tuple[str, int, str, int, int]] = []  # (run, seq, event, p, offset)
    n_parts: int | None = None
    ledger = TxnLedger()
    for batch in read(topics.journal):
        for rec in batch:
            report.facts += 1
            ledger.add(rec.key, rec.partition, rec.offset, rec.headers)
            if progress is not None and report.facts % 100_000 == 0:
                progress(report.facts, time.monotonic() - began)
            p, offset = rec.partition, rec.offset
            try:
                fact = decode(rec.value)
                if not isinstance(fact, FACTS):
                    raise DecodeError("not-a-fact", f"{fact.AVRO} is not a journal fact")
            except DecodeError as exc:
                key = (rec.key or b"").decode(errors="replace")
                misplaced.append(Violation(key, p, (offset,), f"undecodable journal record: {exc}"))
                continue
            run_id = fact.run_id  # type: ignore[attr-defined]
            check = runs.get(run_id)
            if check is None:
                n_parts = n_parts or partition_count(config, topics.journal) or 1
                check = runs[run_id] = RunCheck(run_id, partition_for(run_id.encode(), n_parts))
            if p != check.partition or rec.key != check.key:
                misplaced.append(
                    Violation(
                        run_id,
                        p,
                        (offset,),
                        (
                            f"{fact.AVRO} is on partition {p} with key {rec.key!r}; the run's "
                            f"records belong on partition {check.partition} with key "
                            f"{check.key!r}"
                        ),
                    )
                )
                if p != check.partition:
                    continue  # its order against the run's other facts means nothing
            check.add(fact, offset)  # type: ignore[arg-type]
            if isinstance(fact, RunRecovered):
                report.recovered[run_id, fact.seq] += 1
            elif isinstance(fact, ChildStarted):
                children.append((run_id, fact.child_run_id, offset))
            elif isinstance(fact, ChildEnded) and fact.status == "rejected":
                refused.add((run_id, fact.child_run_id))  # its parent was told so
            elif isinstance(fact, RunStarted) and fact.parent_run_id:
                parents[run_id] = fact.parent_run_id
            elif isinstance(fact, EventMatched) and fact.event_id and not fact.undone:
                matched[fact.subscriber, fact.seq].append((fact.event_id, p, offset))
            elif isinstance(fact, EventReceived):
                received.append((run_id, fact.seq, fact.event_id, p, offset))

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
                        f"the dlq reports the run dead (partition {p} of {topics.dlq}) but its "
                        "journal has no RunDead"
                    ),
                )
            )
    report.violations += misplaced
    report.violations += ledger.violations()
    report.transactions, report.aborted_transactions = ledger.committed, ledger.named_aborted
    for (run_id, seq), matches in matched.items():  # each wait gets one event at most
        if len(matches) > 1:
            why = f"its wait at seq {seq} was matched {len(matches)} times"
            at = tuple(o for _, _, o in matches)
            report.violations.append(Violation(run_id, matches[0][1], at, why))
    for run_id, seq, event_id, p, offset in received:  # and only the one matched to it
        if event_id not in {e for e, _, _ in matched.get((run_id, seq), [])}:
            why = f"received event {event_id!r} at seq {seq}, which no entity matched to it"
            report.violations.append(Violation(run_id, p, (offset,), why))
    if expect_finished:  # every child a parent started did start, as its child, once
        for parent, child, offset in children:
            if parents.get(child) != parent and (parent, child) not in refused:
                why = "never started" if child not in runs else "names another parent"
                report.violations.append(
                    Violation(parent, runs[parent].partition, (offset,), f"child {child!r} {why}")
                )
    report.runs, report.statuses = len(runs), dict(statuses)
    report.seconds = time.monotonic() - began
    return report
