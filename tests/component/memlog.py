"""An in-memory twin of the Kafka edge (`topics.base.EngineLog`), for the worker's own logic.

Only the shell's logic is tested over it: abort and redo, undo of a failed decision,
forwarding, revocation mid-batch. Everything that claims Kafka behaviour is tested
against the real broker in ``tests/kafka``. Never a user-facing backend.

`Cluster` is the "broker": topics of partitions of (key, value) lists and the group's
committed offsets. Records a transaction produces become visible at its commit, all at
once, as with read_committed.

`MemoryLog` runs its transactional calls through the engine's own error policy
(`topics.txn.Transactions`); `fail` makes a call raise a librdkafka error of a given
class (`RETRIABLE`, `TIMED_OUT`, `ABORTABLE`, `FATAL`), as a real `KafkaError`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from runstream.engine.limits import Limits
from runstream.engine.partitioner import partition_for
from runstream.engine.work import LogRecord
from runstream.schemas.codec import Codec
from runstream.topics.base import Ownership
from runstream.topics.spec import Topics
from runstream.topics.txn import Transactions
from runstream.topics.watchdog import Watchdog

CODEC = Codec.default()

# One error of each class, as librdkafka raises them.
RETRIABLE = KafkaError(KafkaError.CONCURRENT_TRANSACTIONS, "injected", retriable=True)
TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "injected", retriable=True)
ABORTABLE = KafkaError(KafkaError.TRANSACTION_ABORTABLE, "injected", txn_requires_abort=True)
FATAL = KafkaError(KafkaError._FENCED, "injected", fatal=True)


@dataclass
class Cluster:
    partitions: int = 4
    topics: dict[str, dict[int, list[tuple[bytes | None, bytes]]]] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)  # the group's command offsets

    def records(self, topic: str, partition: int) -> list[tuple[bytes | None, bytes]]:
        return self.topics.setdefault(topic, {}).setdefault(partition, [])

    def append(self, topic: str, partition: int | None, key: bytes | None, value: bytes) -> int:
        if partition is None:
            partition = partition_for(key or b"", self.partitions)
        records = self.records(topic, partition)
        records.append((key, value))
        return len(records) - 1

    def all(self, topic: str) -> list[tuple[int, int, bytes | None, bytes]]:
        """(partition, offset, key, value) of every record of ``topic``."""
        return [
            (p, o, k, v)
            for p, recs in sorted(self.topics.get(topic, {}).items())
            for o, (k, v) in enumerate(recs)
        ]


class MemoryLog(Transactions):
    """One engine instance's log over a `Cluster`."""

    def __init__(self, cluster: Cluster, ns: str = "mem") -> None:
        self.watchdog = Watchdog(exit_on_hang=False)
        self.cluster, self.topics, self.partitions = cluster, Topics(ns), cluster.partitions
        self.limits = Limits()
        self.owner: Ownership | None = None
        self.owned: set[int] = set()
        self.paused: set[int] = set()
        self.positions: dict[int, int] = {}
        self._to_assign: list[int] = []
        self._to_revoke: list[int] = []
        self._txn: list[tuple[str, int | None, bytes | None, bytes]] | None = None
        self._offsets: dict[int, int] = {}
        self._ends: dict[int, int] = {}  # the journal's end per partition written
        self._faults: dict[str, list[tuple[KafkaError, bool]]] = {}
        self._landed_last = False  # whether the transaction last ended committed
        self.commits = 0
        self.journal_batches: list[tuple[int, Any]] = []  # (commit number, fact) as committed
        self.calls: list[str] = []  # every transactional call, in order

    def fail(self, call: str, err: KafkaError, *, landed: bool = False, times: int = 1) -> None:
        """Make the next ``times`` calls of the producer method ``call`` raise ``err``;
        a ``commit_transaction`` that fails ``landed`` committed before the error."""
        self._faults.setdefault(call, []).extend([(err, landed)] * times)

    def _call(self, call: str, landed: bool = False) -> None:
        """Raise the error injected for ``call``, if any (after committing, if it landed)."""
        self.calls.append(call)
        faults = self._faults.get(call)
        if faults:
            err, landed = faults.pop(0)
            if landed:
                self._apply()
            raise KafkaException(err)

    # -- what tests do to it -------------------------------------------------------------
    def assign(self, partitions: list[int]) -> None:
        self._to_assign += partitions

    def revoke(self, partitions: list[int]) -> None:
        self._to_revoke += partitions

    # -- EngineLog -------------------------------------------------------------------
    def start(self, owner: Ownership, stopping: Callable[[], bool]) -> bool:
        self.owner = owner
        return True

    def poll(self, timeout: float, limit: int) -> list[LogRecord]:
        assert self.owner is not None
        if self._to_revoke:  # callbacks run inside poll, as with Kafka
            gone, self._to_revoke = sorted(set(self._to_revoke) & self.owned), []
            self.owner.revoked(gone, lost=False)  # still ours: it may commit (a handover)
            self.owned -= set(gone)
        if self._to_assign:
            new, self._to_assign = sorted(set(self._to_assign) - self.owned), []
            self.owned |= set(new)
            self.paused |= set(new)
            for p in new:
                self.positions[p] = self.cluster.committed.get(p, 0)
            self.owner.assigned(new)
        out: list[LogRecord] = []
        for p in sorted(self.owned - self.paused):
            records = self.cluster.records(self.topics.commands, p)
            while self.positions[p] < len(records) and len(out) < limit:
                o = self.positions[p]
                key, value = records[o]
                out.append(LogRecord(self.topics.commands, p, o, key, value))
                self.positions[p] = o + 1
        return out

    def pause(self, partitions: list[int]) -> None:
        self.paused |= set(partitions)

    def resume(self, partitions: list[int]) -> None:
        self.paused -= set(partitions)

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset

    def fence_abandoned(self, partitions: list[int]) -> None:
        pass  # a transaction here never outlives its writer's call

    def committed(self, partitions: list[int]) -> dict[int, int]:
        return {p: self.cluster.committed.get(p, 0) for p in partitions}

    def end_offsets(self, partitions: list[int]) -> dict[int, int]:
        return {p: len(self.cluster.records(self.topics.commands, p)) for p in partitions}

    def lag(self, positions: Mapping[int, int]) -> dict[int, int]:
        ends = self.end_offsets(list(positions))
        return {p: max(0, ends[p] - self.positions.get(p, positions[p])) for p in positions}

    def read_journal(
        self,
        start: Mapping[int, int],
        stopping: Callable[[], bool],
        decided: Collection[int] = (),
    ) -> Iterator[LogRecord]:
        for p, offset in start.items():
            records = self.cluster.records(self.topics.journal, p)
            for o in range(offset, len(records)):
                key, value = records[o]
                yield LogRecord(self.topics.journal, p, o, key, value)

    state_topic = None  # no snapshots: `read_state` is Kafka's (tests/kafka)

    def read_state(
        self, partitions: Collection[int], stopping: Callable[[], bool]
    ) -> Iterator[LogRecord]:
        return iter(())

    def begin(self, journal_partitions: Collection[int] = ()) -> None:
        def begin() -> None:
            assert self._txn is None, "a transaction is already open"
            self._call("begin_transaction")
            self._txn, self._offsets, self._ends = [], {}, {}

        self._must("begin_transaction", begin)

    def produce(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        def produce() -> None:
            assert self._txn is not None
            self._call("produce")
            self._txn.append((topic, partition, key, value))

        self._transact("produce", produce)

    def send_offsets(self, offsets: Mapping[int, int]) -> None:
        def send() -> None:
            assert self._txn is not None
            self._call("send_offsets_to_transaction")
            for p in offsets:  # KIP-447: a partition we no longer own fences the transaction
                if p not in self.owned:
                    raise KafkaException(
                        KafkaError(KafkaError.ILLEGAL_GENERATION, txn_requires_abort=True)
                    )
            self._offsets = dict(offsets)

        self._transact("send_offsets_to_transaction", send)

    def commit(self) -> dict[int, int]:
        def commit() -> None:
            assert self._txn is not None
            self._call("commit_transaction")
            self._apply()

        self._transact("commit_transaction", commit)
        return self._ends

    def _apply(self) -> None:
        """The open transaction becomes visible, all at once."""
        assert self._txn is not None
        for topic, partition, key, value in self._txn:
            offset = self.cluster.append(topic, partition, key, value)
            if topic == self.topics.journal:
                assert partition is not None
                self._ends[partition] = offset + 1
                self.journal_batches.append((self.commits, CODEC.decode(value)))
        self.cluster.committed.update(self._offsets)
        self._txn, self._landed_last = None, True
        self.commits += 1

    # -- what the error policy does with it (`topics.txn`) ---------------------------------
    def _abort_call(self) -> None:
        self._call("abort_transaction")
        self._txn, self._landed_last = None, False

    def _recreate(self) -> None:
        """The new producer's init_transactions ends what was open: not committed."""
        self._call("init_transactions")
        if self._txn is not None:
            self._txn, self._landed_last = None, False

    def _rewind(self) -> None:
        for p in self.owned:
            self.positions[p] = self.cluster.committed.get(p, 0)

    def _landed(self) -> bool:
        return self._landed_last

    def close(self) -> None:
        if self.owner is not None and self.owned:
            gone = sorted(self.owned)
            self.owner.revoked(gone, lost=False)
            self.owned = set()
