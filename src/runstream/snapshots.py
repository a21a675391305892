"""When an owner writes snapshots to ``<ns>.state`` and purges finished runs.

Every ``snapshot_interval`` seconds the next transaction (a batch's, or one of its own
when the engine is idle) also carries, per owned partition, the snapshot records of the
runs its projection committed since the last snapshot (`PartitionStore.take_snapshot`)
and the marker: the journal offset that committed state reflects. They ride the
owner's transaction with its command offsets, so a fenced zombie cannot write them, and
they hold only state already committed. A transaction that does not commit gives them
back (`aborted`): the next one writes them.

On the same tick, with ``finished_retention``, the runs that ended longer ago than it
are purged from each projection (at most `PURGE_PER_TICK` a partition: the work of a
tick stays bounded), their snapshot keys get tombstones, and a ``run.purged`` lifecycle
event tells the read models (`runstream runs show` says the run was purged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from runstream.engine.state import RunState
from runstream.errors import DecodeError
from runstream.projections.snapshot import Image, Unreadable
from runstream.projections.store import PartitionStore, Taken
from runstream.schemas.codec import Codec
from runstream.schemas.records import Kind, LifecycleEvent
from runstream.topics.base import EngineLog
from runstream.topics.lifecycle_wire import Wire
from runstream.topics.outbox import Out
from runstream.topics.spec import Topics

log = logging.getLogger("runstream.snapshots")

PURGE_PER_TICK = 1000


class Snapshots:
    """The snapshot ticks of one engine instance.

    Args:
        topic: ``<ns>.state``; None: no snapshots (the topic is missing).
        interval: seconds between snapshots; 0: none.
        retention: seconds a finished run is kept; 0: for ever.
        topics, codec, wire: where and how ``run.purged`` events are written.
    """

    def __init__(
        self,
        topic: str | None,
        interval: float,
        retention: float,
        topics: Topics | None = None,
        codec: Codec | None = None,
        wire: Wire | None = None,
    ) -> None:
        self.topic = topic if interval > 0 else None
        self._topics, self._codec, self._wire = topics, codec, wire
        self._events: list[Out] = []  # run.purged events not committed yet
        self._interval_ms, self._retention_ms = int(interval * 1000), int(retention * 1000)
        self._next_ms = 0
        self._taken: dict[int, tuple[PartitionStore, Taken, int]] = {}
        self._marked: dict[int, int] = {}  # each partition's last marker committed
        self.purged = 0  # runs purged by this instance
        self._aborts = 0  # snapshots taken in a row that did not commit

    def soon(self) -> None:
        """Take the next snapshot with the next transaction (a handover: the next owner
        then restores from a fresh one)."""
        self._next_ms = 0

    def due(self, now_ms: int) -> bool:
        return self.topic is not None and now_ms >= self._next_ms

    def take(
        self, now_ms: int, stores: Mapping[int, PartitionStore], busy: Collection[str] = ()
    ) -> list[Out]:
        """The records of a snapshot when one is due (purging first), else none. The
        ``busy`` runs (the batch about to commit decided them) are not purged now."""
        if self.topic is None or not self.due(now_ms):
            return []
        self._next_ms = now_ms + self._interval_ms
        out: list[Out] = []
        for p, store in stores.items():
            if self._retention_ms:
                for run_id in store.finished(now_ms - self._retention_ms, PURGE_PER_TICK):
                    if run_id in busy:  # a retry, say: purged on a later tick if still old
                        continue
                    self._purged(p, store.get(run_id), now_ms)
                    store.purge(run_id)
                    self.purged += 1
            if store.journal_offset in (0, self._marked.get(p)) and not store.changing:
                continue  # nothing new to write
            if not store.covered:  # begun before snapshots: its new owner reads the journal
                continue
            records, taken = store.take_snapshot()
            self._taken[p] = (store, taken, store.journal_offset)
            out += [Out(self.topic, p, key, value) for key, value in records]
        return out + self._events

    def _purged(self, p: int, state: object, now_ms: int) -> None:
        if self._topics is None or self._codec is None or not isinstance(state, RunState):
            return
        ev = LifecycleEvent(
            Kind.RUN_PURGED,
            state.run_id,
            at_ms=now_ms,
            workflow=state.workflow,
            version=state.version,
            status=state.status.value,
        )
        data = self._codec.encode(ev)
        data = data if self._wire is None else self._wire(ev, data)
        self._events.append(Out(self._topics.lifecycle, p, state.run_id.encode(), data))

    def committed(self) -> None:
        self._aborts = 0
        for p, (store, taken, offset) in self._taken.items():
            self._marked[p] = offset
            if store.open:
                store.snapshotted(taken)
        self._taken.clear()
        self._events = []

    def aborted(self, now_ms: int | None = None) -> None:
        """The records taken did not commit: the next snapshot writes them, at once the
        first time, then ever later (up to 64 intervals): a snapshot too large for a
        transaction must not make every batch that carries it abort."""
        for store, taken, _ in self._taken.values():
            if store.open:
                store.untake(taken)
        if self._taken:
            self._aborts += 1
        self._taken.clear()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        wait = 0 if self._aborts <= 1 else self._interval_ms * min(2 ** (self._aborts - 1), 64)
        self._next_ms = now_ms + wait
        if self._aborts > 1:
            log.warning(
                "a snapshot did not commit %d times in a row: next in %d ms", self._aborts, wait
            )


def restore_snapshots(
    stores: Mapping[int, PartitionStore], engine_log: EngineLog, stopping: Callable[[], bool]
) -> None:
    """Fill these empty projections from their partitions of ``<ns>.state``: each one
    with a marker gets the runs of its snapshot and the journal offset to go on from.
    One that has no snapshot, or one this engine cannot read, stays empty (with a log
    line) and is restored from the whole journal."""
    began = time.monotonic()
    images = {p: Image() for p in stores}
    broken: dict[int, str] = {}
    for rec in engine_log.read_state(list(stores), stopping):
        if rec.partition in images and rec.partition not in broken:
            try:
                images[rec.partition].add(rec.key, rec.value)
            except Unreadable as exc:
                broken[rec.partition] = str(exc)
    if stopping():
        return
    for p, image in images.items():
        if p in broken or image.journal_offset is None:
            if p in broken:
                log.warning("snapshot of partition %d unreadable (%s): the journal", p, broken[p])
            continue
        store = stores[p]
        try:
            runs = list(image.runs())  # all checked before any is written
            count = store.load(runs, image.journal_offset)
        except (Unreadable, DecodeError) as exc:
            store.clear()
            log.warning("snapshot of partition %d unreadable (%s): the journal", p, exc)
            continue
        log.info(
            "partition %d restored from its snapshot: %d runs and entities, journal from "
            "offset %d (%.2fs)",
            p,
            count,
            image.journal_offset,
            time.monotonic() - began,
        )
