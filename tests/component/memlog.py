"""An in-memory twin of the Kafka edge (`topics.base.EngineLog`), for the worker's own logic.

Only the shell's logic is tested over it: abort and redo, undo of a failed decision,
forwarding, revocation mid-batch. Everything that claims Kafka behaviour is tested
against the real broker in ``tests/kafka``. Never a user-facing backend.

`Cluster` is the "broker": topics of partitions of (key, value) lists and the group's
committed offsets. Records a transaction produces become visible at its commit, all at
once, as with read_committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from runstream.engine.limits import Limits
from runstream.engine.partitioner import partition_for
from runstream.engine.work import LogRecord
from runstream.schemas.codec import Codec
from runstream.topics.base import Ownership, TransactionAborted
from runstream.topics.spec import Topics

CODEC = Codec.default()


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


class MemoryLog:
    """One engine instance's log over a `Cluster`."""

    def __init__(self, cluster: Cluster, ns: str = "mem") -> None:
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
        self.fail_commits = 0  # the next n commits fail as abortable
        self.commits = 0
        self.journal_batches: list[tuple[int, Any]] = []  # (commit number, fact) as committed
        self.aborts = 0

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

    def committed(self, partitions: list[int]) -> dict[int, int]:
        return {p: self.cluster.committed.get(p, 0) for p in partitions}

    def end_offsets(self, partitions: list[int]) -> dict[int, int]:
        return {p: len(self.cluster.records(self.topics.commands, p)) for p in partitions}

    def read_journal(
        self, start: Mapping[int, int], stopping: Callable[[], bool]
    ) -> Iterator[LogRecord]:
        for p, offset in start.items():
            records = self.cluster.records(self.topics.journal, p)
            for o in range(offset, len(records)):
                key, value = records[o]
                yield LogRecord(self.topics.journal, p, o, key, value)

    def begin(self) -> None:
        assert self._txn is None, "a transaction is already open"
        self._txn, self._offsets = [], {}

    def produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes) -> None:
        assert self._txn is not None
        self._txn.append((topic, partition, key, value))

    def send_offsets(self, offsets: Mapping[int, int]) -> None:
        assert self._txn is not None
        for p in offsets:  # KIP-447: a partition we no longer own fences the transaction
            if p not in self.owned:
                raise TransactionAborted(f"partition {p} is not ours")
        self._offsets = dict(offsets)

    def commit(self) -> dict[int, int]:
        assert self._txn is not None
        if self.fail_commits:
            self.fail_commits -= 1
            raise TransactionAborted("injected")
        ends: dict[int, int] = {}
        for topic, partition, key, value in self._txn:
            offset = self.cluster.append(topic, partition, key, value)
            if topic == self.topics.journal:
                assert partition is not None
                ends[partition] = offset + 1
                self.journal_batches.append((self.commits, CODEC.decode(value)))
        self.cluster.committed.update(self._offsets)
        self._txn = None
        self.commits += 1
        return ends

    def abort(self) -> None:
        self._txn = None
        self.aborts += 1

    def close(self) -> None:
        if self.owner is not None and self.owned:
            gone = sorted(self.owned)
            self.owner.revoked(gone, lost=False)
            self.owned = set()
