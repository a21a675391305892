"""What an engine instance needs of its log, as a Protocol.

`topics.kafka.KafkaLog` implements it over Kafka; the component tests drive the worker
over an in-memory twin (``tests/component/memlog.py``). Nothing else implements it: the
in-memory one is never a user-facing backend.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Protocol

from runstream.engine.limits import Limits
from runstream.engine.work import LogRecord
from runstream.errors import RunstreamError


class TransactionAborted(RunstreamError):
    """The transaction did not commit and has been ended (aborted, or its producer
    recreated), the consumer rewound to the committed offsets: redo the batch."""


class Ownership(Protocol):
    """Told which command partitions the instance gains and loses (inside `poll`)."""

    def assigned(self, partitions: list[int]) -> None: ...

    def revoked(self, partitions: list[int], lost: bool) -> None: ...


class EngineLog(Protocol):
    """Commands in, facts out, one transaction at a time.

    Assigned partitions start paused; `resume` them once their projection caught up.
    A transaction is `begin`, any number of `produce`, `send_offsets` (the next command
    offset of every partition the transaction decides for), then `commit`, which returns
    the journal's new end offset per partition written. Any of them raises
    `TransactionAborted` when the batch must be redone: the log has then ended the
    transaction itself and rewound the consumer (`topics.txn` says when and how).
    """

    partitions: int
    limits: Limits  # record sizes the topics and producers take
    state_topic: str | None  # ``<ns>.state`` for snapshots; None: no snapshots

    def start(self, owner: Ownership, stopping: Callable[[], bool]) -> bool:
        """Join the group (after fencing older instances); False if stopped first."""
        ...

    def poll(self, timeout: float, limit: int) -> list[LogRecord]: ...

    def pause(self, partitions: list[int]) -> None: ...

    def resume(self, partitions: list[int]) -> None: ...

    def seek(self, partition: int, offset: int) -> None: ...

    def fence_abandoned(self, partitions: list[int]) -> None:
        """Abort what open transactions of instances gone from the group hold of these
        journal partitions, so that a takeover need not wait for their timeout."""
        ...

    def committed(self, partitions: list[int]) -> dict[int, int]: ...

    def end_offsets(self, partitions: list[int]) -> dict[int, int]:
        """The end of each commands partition now: what a former owner may have read."""
        ...

    def lag(self, positions: Mapping[int, int]) -> dict[int, int]:
        """Commands of each partition past the consumer's position (``positions[p]``
        before it took any), as of its last fetch; a partition not fetched yet is left
        out. No request, so it never blocks."""
        ...

    def read_journal(
        self,
        start: Mapping[int, int],
        stopping: Callable[[], bool],
        decided: Collection[int] = (),
    ) -> Iterator[LogRecord]:
        """The journal partitions from ``start`` to their end (read_committed). In
        ``decided`` partitions the transaction that wrote the record before ``start`` is
        known to be decided: one offset past it can only be its commit marker."""
        ...

    def read_state(
        self, partitions: Collection[int], stopping: Callable[[], bool]
    ) -> Iterator[LogRecord]:
        """The ``state_topic`` partitions from their start to their end (read_committed)."""
        ...

    def begin(self, journal_partitions: Collection[int] = ()) -> None:
        """Open a transaction that will write facts to ``journal_partitions``."""
        ...

    def produce(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None: ...

    def send_offsets(self, offsets: Mapping[int, int]) -> None: ...

    def commit(self) -> dict[int, int]: ...

    def close(self) -> None: ...
