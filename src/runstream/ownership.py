"""The partitions an engine instance owns: each one's projection, the next command offset
its transactions commit, and where the commands no former owner can have seen begin.

Kafka assigns and revokes partitions inside ``poll()``; an assigned partition is restored
(its projection caught up with its journal) before any of its commands is decided.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runstream.engine.state import State, beats_of
from runstream.engine.work import Batch, LogRecord, StepOutcome, Work
from runstream.projections.store import PartitionStore, catch_up, close_all
from runstream.schemas.codec import Codec
from runstream.snapshots import restore_snapshots
from runstream.standby import Handover, Standbys
from runstream.topics.base import EngineLog
from runstream.topics.outbox import Committed

log = logging.getLogger("runstream.worker")

#: (partition, the run before, the run after) for each run a committed batch changed
Change = tuple[int, State, State]


@dataclass
class _Owned:
    store: PartitionStore
    position: int  # next command offset; committed by every transaction that writes p
    fresh_from: int  # commands from here on no former owner can have seen
    since_ms: int  # when this instance took it over


class Partitions:
    """The owned partitions, by number; ``leaving`` ones are being handed over."""

    def __init__(self, state_dir: Path, codec: Codec) -> None:
        self.state_dir, self.codec = state_dir, codec
        self.leaving: set[int] = set()  # start none of their steps
        self._owned: dict[int, _Owned] = {}
        self._to_restore: list[int] = []
        self.standbys: Standbys | None = None  # warm copies to take over first

    def __contains__(self, p: object) -> bool:
        return p in self._owned

    def __len__(self) -> int:
        return len(self._owned)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._owned))

    def assigned(self, partitions: list[int]) -> None:
        self._to_restore.extend(partitions)

    def restore(
        self, engine_log: EngineLog, stopping: Callable[[], bool]
    ) -> dict[int, PartitionStore]:
        """Catch every newly assigned partition up with its journal, all in one pass, and
        own it; the stores restored (none when stopped first)."""
        if not self._to_restore:
            return {}
        started, partitions = time.monotonic(), sorted(self._to_restore)
        self._to_restore = []
        handed: dict[int, Handover] = {}  # what the standby thread knew of its copies
        if self.standbys is not None:  # their stores are ours from here on
            handed = self.standbys.claim(partitions)
        took = [time.monotonic()]  # when each phase ended, for the log line
        engine_log.fence_abandoned(partitions)  # a dead owner's open transaction
        positions = engine_log.committed(partitions)
        ends = engine_log.end_offsets(partitions)
        took.append(time.monotonic())
        with ThreadPoolExecutor(8) as pool:  # RocksDB opens them in parallel, off the GIL
            opened = pool.map(
                lambda p: PartitionStore(self.state_dir / f"p{p}", self.codec), partitions
            )
            stores = dict(zip(partitions, opened, strict=True))
        empty = [p for p, s in stores.items() if s.journal_offset == 0]
        for p in empty:
            stores[p].retrack({})  # nothing to mark
        if empty and engine_log.state_topic is not None:  # a new owner: from the snapshots
            restore_snapshots({p: stores[p] for p in empty}, engine_log, stopping)
        took.append(time.monotonic())
        # A standby's copy tracked no changes: the journal from the owner's last snapshot
        # marker it saw tells which runs the next snapshot must hold (`retrack`). The
        # standby thread counted them as it tailed, and knows how far it read (past
        # markers): without its handover, read that part of the journal again.
        marks = {p: m[0] for p, s in stores.items() if (m := s.standby_mark()) is not None}
        offsets = {
            p: handed[p].read_to
            if p in handed
            else min(s.journal_offset, marks.get(p) or s.journal_offset)
            for p, s in stores.items()
        }
        since = {p: dict(handed[p].runs) if p in handed else {} for p in marks}
        # What this instance's last life left here (its producers' transactions `start`
        # settled) or a finished restore read back: the journal up to it is decided.
        decided = [p for p in stores if p not in empty and p not in marks]
        journal = _counting(engine_log.read_journal(offsets, stopping, decided), since, stores)
        facts = catch_up(stores, journal)
        if stopping():
            close_all([*stores.values()])
            if self.standbys is not None:
                self.standbys.unclaim(partitions)
            return {}
        for p, counts in since.items():
            stores[p].retrack(counts)
        for p, store in stores.items():
            self._owned[p] = _Owned(store, positions[p], ends[p], int(time.time() * 1000))
        engine_log.resume(partitions)
        took.append(time.monotonic())
        phases = [b - a for a, b in zip([started, *took], took, strict=False)]
        log.info(
            "partitions %s restored: %d facts in %.2fs (claim %.2fs, offsets %.2fs, stores "
            "%.2fs, journal %.2fs)%s",
            partitions,
            facts,
            time.monotonic() - started,
            *phases,
            f"; the standby handed over {sorted(handed)}" if handed else "",
        )
        return stores

    @property
    def restoring(self) -> bool:
        return bool(self._to_restore)

    def release(self, partitions: list[int]) -> None:
        """``partitions`` are no longer ours: close their projections."""
        closing = []
        for p in partitions:
            owned = self._owned.pop(p, None)
            if owned is not None:
                closing.append(owned.store)
            if p in self._to_restore:
                self._to_restore.remove(p)
        close_all(closing)
        self.leaving -= set(partitions)
        if self.standbys is not None:
            self.standbys.unclaim(partitions)

    def close(self) -> None:
        self.release(list(self._owned))

    def stores(self) -> dict[int, PartitionStore]:
        return {p: owned.store for p, owned in self._owned.items()}

    def load(self, p: int, run_id: str) -> State:
        return self._owned[p].store.get(run_id)

    def running(self, p: int) -> list[str]:
        """The runs of ``p`` with a step started and not ended."""
        return list(self._owned[p].store.running())

    def since(self, p: int) -> int:
        """When this instance took ``p`` over (ms since the epoch)."""
        owned = self._owned.get(p)
        return owned.since_ms if owned is not None else 0

    def position(self, p: int) -> int:
        return self._owned[p].position

    def fresh(self, item: Work) -> bool:
        """Work no former process of this partition can have seen: its steps may run
        before their start is committed (`runtime.steps.chain`)."""
        if isinstance(item, LogRecord):
            return item.offset >= self._owned[item.partition].fresh_from
        return isinstance(item, StepOutcome) and not item.isolated

    def project(self, b: Batch, written: Committed) -> list[Change]:
        """After the commit: move the positions, write the facts to the projections."""
        for p, (_, last) in b.consumed.items():
            self._owned[p].position = last + 1
        by_partition: dict[int, list[tuple[State, State, list[bytes]]]] = {}
        for run_id, w in b.runs.items():
            data = written.encoded.get(run_id)
            if data is not None or beats_of(w.after) != beats_of(w.before):  # no facts
                by_partition.setdefault(w.partition, []).append((w.before, w.after, data or []))
        changes: list[Change] = []
        for p, runs in by_partition.items():
            store = self._owned[p].store
            store.commit(runs, written.ends.get(p, store.journal_offset))
            changes += [(p, before, after) for before, after, _ in runs]
        return changes


def _counting(
    journal: Iterable[LogRecord],
    since: dict[int, dict[str, int]],
    stores: Mapping[int, PartitionStore],
) -> Iterator[LogRecord]:
    """The records of ``journal`` from each store's offset on; on the way, per partition
    in ``since``, how many records each run has (from wherever the read began)."""
    for rec in journal:
        counts = since.get(rec.partition)
        if counts is not None and rec.key is not None:
            run_id = rec.key.decode(errors="replace")
            counts[run_id] = counts.get(run_id, 0) + 1
        if rec.offset >= stores[rec.partition].journal_offset:
            yield rec
