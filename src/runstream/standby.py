"""Standby replicas: warm copies of partitions that other instances own.

An instance started with ``standbys=N`` keeps, for every partition whose owner is one of
the N members after it in the group (ordered by client id), the partition's projection
in its own state directory, tailing the journal (read_committed) into it as the owner
writes. When Kafka gives it such a partition (the owner died or left), the restore has
only the last facts to read: failover costs the group's detection of the death and a
rebalance, not a rebuild (Kafka Streams' standby tasks, adapted: our changelog is the
journal itself).

A standby thread never writes a store the owner path holds: `claim` takes partitions
from it and returns once their stores are closed (before the owner opens them), and
`unclaim` gives them back once the owner closed them. Nothing here is ever decided on:
a standby store is only a head start for the restore, which catches up from its offset.

A standby copy writes no snapshots, so it tracks no changed runs (they would grow with
everything it tails). It also tails ``<ns>.state``: each owner snapshot's marker (the
journal offset the owner's snapshot covers) is recorded in the copy, so its next owner
knows which runs its first snapshot must hold (`PartitionStore.retrack`), and the runs
the owner purged (finished_retention: their heads' tombstones) are purged from the copy
once it reached that snapshot's journal offset. Which runs the journal changed since that
marker the thread counts as it tails (`ChangeWindow`, in memory) and hands to the owner
with the claim: the takeover need not read those records again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from runstream.engine.state import RunState
from runstream.engine.work import LogRecord
from runstream.errors import DecodeError
from runstream.projections.snapshot import (
    MARKER_KEY,
    Image,
    Unreadable,
    decode_marker,
    head_of,
)
from runstream.projections.store import PartitionStore, catch_up, close_all
from runstream.schemas.codec import Codec
from runstream.topics.admin import Config
from runstream.topics.catchup import PartitionReader
from runstream.topics.groups import assignments
from runstream.topics.kafka import KafkaLog

log = logging.getLogger("runstream.standby")

#: How often the placement is asked of the group coordinator (seconds).
PLACEMENT_EVERY = 2.0
#: How often the owners' snapshots are read (seconds).
SNAPSHOTS_EVERY = 0.5
#: Runs counted per copy's window at most (an owner whose snapshots stall would grow it):
#: past it the window starts again, and a takeover reads the journal as before.
WINDOW_RUNS = 100_000


class Handover(NamedTuple):
    """What a standby copy's thread knows that its next owner would read the journal for."""

    runs: dict[str, int]  # each run's records since the owner's last marker (or more)
    read_to: int  # every committed journal record below this offset is in the copy


class ChangeWindow:
    """How many journal records each run has in a standby copy from its owner's last
    snapshot marker on (what `PartitionStore.retrack` needs at a takeover), and how far
    the copy has read.

    Counted in segments, one per `cut`; a marker drops the segments wholly before it and
    keeps the one it falls in, so the counts may cover a few records before the marker
    (the next snapshot then writes again chunks it holds: harmless), never fewer."""

    def __init__(self, start: int) -> None:
        self.next = start  # the offset after the last record counted
        self.read_to = start  # past commit markers and aborted records too (their EOF)
        self._segments: list[tuple[int, dict[str, int]]] = [(start, {})]

    @property
    def start(self) -> int:
        """Every record from this offset on is counted."""
        return self._segments[0][0]

    def add(self, offset: int, key: bytes | None) -> None:
        if key is not None:  # as the journal's re-read counts (`ownership._counting`)
            counts = self._segments[-1][1]
            run_id = key.decode(errors="replace")
            counts[run_id] = counts.get(run_id, 0) + 1
        self.next = offset + 1
        self.read_to = max(self.read_to, self.next)

    def reached(self, offset: int) -> None:
        """The copy's reader is at ``offset``: every committed record before it applied
        (a read_committed end stops at the first undecided transaction)."""
        self.read_to = max(self.read_to, offset)

    def cut(self, marker: int) -> None:
        """The owner's last marker seen is ``marker``: drop what lies before it, and
        begin a new segment."""
        segments = self._segments
        while len(segments) > 1 and segments[1][0] <= marker:
            segments.pop(0)
        if segments[-1][1]:
            segments.append((self.next, {}))
        if sum(len(counts) for _, counts in segments) > WINDOW_RUNS:
            self._segments = [(self.next, {})]

    def handover(self, marker: int, end: int) -> Handover | None:
        """Each run's records from ``marker`` to the copy's ``end`` (at least), or None
        if this window does not cover them."""
        if marker <= 0 or self.start > marker or self.next != end:
            return None
        out: dict[str, int] = {}
        for _, counts in self._segments:
            for run_id, n in counts.items():
                out[run_id] = out.get(run_id, 0) + n
        return Handover(out, self.read_to)


def placement(
    held: Mapping[str, Iterable[int]], me: str, replicas: int, copies: Iterable[int] = ()
) -> set[int]:
    """The partitions ``me`` keeps warm: those whose owner is among the ``replicas``
    members before ``me`` in client-id order (so each partition has up to ``replicas``
    standbys, on different members, none of them its owner); and of its ``copies`` (open
    now) those no other member owns: their owner died, and the takeover claims them."""
    others = {p for member, ps in held.items() if member != me for p in ps}
    kept = set(copies) - others
    members = sorted(held)
    if me not in members or replicas <= 0:
        return kept
    i, n = members.index(me), len(members)
    owners = {members[(i - k) % n] for k in range(1, min(replicas, n - 1) + 1)}
    return {p for owner in owners for p in held[owner]} | kept


class Standbys:
    """The standby thread of one engine instance.

    Args:
        config: the engine's client settings.
        group_id, client_id: the engine's consumer group, and this instance's client id in it.
        commands, journal: the topics (placement follows the assignment of ``commands``).
        state: ``<ns>.state``, the owners' snapshots (None: no snapshots).
        state_dir: the instance's state directory (``p<N>`` per partition, as the owner's).
        replicas: standbys per partition across the group.
    """

    def __init__(
        self,
        config: Config,
        group_id: str,
        client_id: str,
        commands: str,
        journal: str,
        state: str | None,
        state_dir: Path,
        replicas: int,
    ) -> None:
        self._config, self._group, self._me = dict(config), group_id, client_id
        self._commands, self._journal, self._state = commands, journal, state
        self._state_dir, self._replicas = state_dir, replicas
        self._codec = Codec.default()
        self._lock = threading.Condition()
        self._claimed: set[int] = set()  # the owner path's: never opened here
        self._held: set[int] = set()  # open here now
        self._wanted: set[int] = set()
        self._windows: dict[int, ChangeWindow] = {}  # of the copies open here
        self._handed: dict[int, Handover] = {}  # of the copies a claim closed
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runstream-standby", daemon=True)
        self.applied = 0  # facts applied since the start (for logs and tests)
        self.purged = 0  # runs purged as their owners did

    @classmethod
    def of(cls, engine_log: KafkaLog, state_dir: Path, replicas: int) -> Standbys:
        """The standbys of the instance whose log is ``engine_log``, started."""
        topics = engine_log.topics
        standbys = cls(
            engine_log.config,
            engine_log.group_id,
            engine_log.client_id,
            topics.commands,
            topics.journal,
            engine_log.state_topic,
            state_dir,
            replicas,
        )
        standbys.start()
        return standbys

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        self._thread.join(timeout=30)

    def claim(self, partitions: Iterable[int], timeout: float = 10.0) -> dict[int, Handover]:
        """The owner path takes ``partitions``: return once no standby store of theirs is
        open (at most ``timeout`` seconds; a thread that hangs on Kafka closes them after),
        with what the thread knows of each copy whose window covers it (`Handover`)."""
        wanted = set(partitions)
        with self._lock:
            self._claimed |= wanted
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: not (self._held & wanted), timeout):
                raise RuntimeError(f"standby stores of partitions {sorted(wanted)} stayed open")
            return {p: self._handed.pop(p) for p in wanted if p in self._handed}

    def unclaim(self, partitions: Iterable[int]) -> None:
        """The owner path closed ``partitions``: they may be kept warm again."""
        ps = set(partitions)
        with self._lock:
            self._claimed -= ps
            for p in ps:
                self._handed.pop(p, None)
            self._lock.notify_all()

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        reader = PartitionReader(self._config, self._journal)
        stores: dict[int, PartitionStore] = {}
        try:
            while not self._stopping.is_set():
                self._reconcile(stores)  # first: a claim may be waiting
                self._wanted = self._ask()
                self._reconcile(stores)
                if not stores:
                    with self._lock:
                        self._lock.wait(PLACEMENT_EVERY)
                    continue
                self._fill(stores)
                self._tail(reader, stores)
        except Exception:  # a standby is only a head start: never take the engine down
            log.exception("standby replicas stopped")
        finally:
            self._stopping.set()
            with self._lock:
                for store in stores.values():
                    store.close()
                self._held, self._windows = set(), {}
                self._lock.notify_all()
            reader.close()

    def _fill(self, stores: dict[int, PartitionStore]) -> None:
        """Fill the empty copies from the owners' snapshots, as a new owner restores, so
        the journal is read from their offset, not from its beginning. A copy a claim
        takes meanwhile, or one whose snapshot is unreadable, stays empty."""
        empty = [p for p, s in stores.items() if s.journal_offset == 0]
        if self._state is None or not empty:
            return
        images, ends = {p: Image() for p in empty}, dict.fromkeys(empty, 0)
        reader = PartitionReader(self._config, self._state)
        try:
            for records, positions in reader.read(dict.fromkeys(empty, 0), wait=0.1):
                ends = positions
                for rec in records:
                    images[rec.partition].add(rec.key, rec.value)
                with self._lock:
                    claimed = bool(self._claimed & set(empty))
                if claimed or self._stopping.is_set():
                    return
        except (Unreadable, TimeoutError) as exc:
            log.warning("standby copies %s start from the journal: %s", empty, exc)
            return
        finally:
            reader.close()
        for p, image in images.items():
            if image.journal_offset is None:
                continue
            store, runs, count = stores[p], image.runs(), 0
            try:
                while batch := list(itertools.islice(runs, 2000)):
                    if p in self._claimed or self._stopping.is_set():
                        store.clear()  # not half a copy
                        return
                    count += store.load(batch, 0)
            except (Unreadable, DecodeError) as exc:
                log.warning("standby copy of partition %d starts from the journal: %s", p, exc)
                store.clear()
                store.saw_snapshot(0, 0)
                continue
            store.commit([], image.journal_offset)
            store.saw_snapshot(image.journal_offset, ends.get(p, 0))
            log.info(
                "standby copy of partition %d filled from its snapshot: %d runs, journal "
                "from offset %d",
                p,
                count,
                image.journal_offset,
            )

    def _tail(self, reader: PartitionReader, stores: dict[int, PartitionStore]) -> None:
        """Apply the journal and the owners' snapshots to ``stores`` until a claim, a stop
        or a new placement."""
        asked = read_at = time.monotonic()
        start = {p: s.journal_offset for p, s in stores.items()}
        windows = self._windows
        for p, offset in start.items():
            if p not in windows or windows[p].next != offset:
                windows[p] = ChangeWindow(offset)
        owners = OwnerSnapshots(self._config, self._state, stores)
        try:
            for records, positions in reader.read(start, follow=True, wait=0.1):
                with self._lock:  # a claim waits for this batch, then finds them closed
                    if records:
                        self.applied += catch_up(
                            {p: stores[p] for p in {r.partition for r in records}}, records
                        )
                    for rec in records:
                        windows[rec.partition].add(rec.offset, rec.key)
                    for p, offset in positions.items():
                        windows[p].reached(offset)
                if time.monotonic() - read_at > SNAPSHOTS_EVERY:
                    owners.poll()
                    with self._lock:
                        self.purged += owners.apply(stores)
                        for p, store in stores.items():
                            windows[p].cut((store.standby_mark() or (0, 0))[0])
                    read_at = time.monotonic()
                with self._lock:
                    claimed = bool(self._claimed & set(stores))
                if claimed or self._stopping.is_set():
                    return
                if time.monotonic() - asked > PLACEMENT_EVERY:
                    if self._ask() != self._wanted:
                        return
                    asked = time.monotonic()
        finally:
            owners.close()

    def _ask(self) -> set[int]:
        try:
            held = assignments(self._config, self._group, self._commands, timeout=5.0)
        except Exception as exc:  # the coordinator may be moving: keep the placement we had
            log.debug("standby placement not known: %s", exc)
            return self._wanted
        return placement(held, self._me, self._replicas, self._held)

    def _reconcile(self, stores: dict[int, PartitionStore]) -> None:
        """Open and close stores to match the placement minus the claimed partitions."""
        with self._lock:
            wanted = self._wanted - self._claimed
            drop, add = set(stores) - wanted, wanted - set(stores)
            for p in drop:
                window, mark = self._windows.pop(p, None), stores[p].standby_mark()
                self._handed.pop(p, None)
                if p in self._claimed and window is not None and mark is not None:
                    handover = window.handover(mark[0], stores[p].journal_offset)
                    if handover is not None:
                        self._handed[p] = handover
            close_all([stores.pop(p) for p in drop])
            for p in sorted(add):
                stores[p] = PartitionStore(self._state_dir / f"p{p}", self._codec, standby=True)
            self._held = set(stores)
            self._lock.notify_all()
        if add or drop:
            log.info("standby for partitions %s", sorted(stores))


class OwnerSnapshots:
    """What a standby needs of the owners' snapshots in ``<ns>.state``: each marker, and
    the heads a snapshot tombstoned (runs purged), per copy from the offset it recorded."""

    def __init__(self, config: Config, topic: str | None, stores: dict[int, PartitionStore]):
        self._config, self._topic = config, topic
        self._reader: PartitionReader | None = None
        self._reading: Iterator[tuple[list[LogRecord], dict[int, int]]] | None = None
        self._purges: dict[int, list[tuple[str, int]]] = {}  # of the snapshot being read
        # per partition, each snapshot read: (its marker, the next state offset, purges)
        self._read: dict[int, list[tuple[int, int, list[tuple[str, int]]]]] = {}
        self._start = {p: mark[1] for p, s in stores.items() if (mark := s.standby_mark())}

    def poll(self) -> None:
        """Read what is there (one short poll)."""
        if self._topic is None or not self._start:
            return
        if self._reading is None:
            self._reader = PartitionReader(self._config, self._topic)
            self._reading = self._reader.read(self._start, follow=True, wait=0.02)
        records, _ = next(self._reading)
        for rec in records:
            self.add(rec)

    def apply(self, stores: dict[int, PartitionStore]) -> int:
        """Apply each snapshot read whose journal offset its copy has reached; how many
        runs were purged."""
        return sum(self._apply(p, store) for p, store in stores.items())

    def add(self, rec: LogRecord) -> None:
        """Take one record of ``<ns>.state`` (in offset order per partition)."""
        p = rec.partition
        if rec.key == MARKER_KEY:
            try:
                marker = decode_marker(rec.value)
            except Unreadable as exc:  # a newer engine's: its copies are only a head start
                log.warning("standby: snapshot marker p%d@%d unreadable: %s", p, rec.offset, exc)
                return
            purged = self._purges.pop(p, [])
            self._read.setdefault(p, []).append((marker, rec.offset + 1, purged))
        elif rec.value is None and (run_id := head_of(rec.key)) is not None:
            self._purges.setdefault(p, []).append((run_id, rec.timestamp_ms))

    def _apply(self, p: int, store: PartitionStore) -> int:
        purged, read = 0, self._read.get(p, [])
        while read and read[0][0] <= store.journal_offset:
            marker, next_offset, purges = read.pop(0)
            for run_id, at_ms in purges:
                state = store.get(run_id)
                ended = state.ended_at_ms if isinstance(state, RunState) else None
                if ended is not None and ended <= at_ms:  # not one started again since
                    store.purge(run_id)
                    purged += 1
            store.saw_snapshot(marker, next_offset)
        return purged

    def close(self) -> None:
        self._reading = None  # its last reference: it ends (unassigns) before the close
        if self._reader is not None:
            self._reader.close()
