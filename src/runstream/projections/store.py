"""One RocksDB database per owned partition: each run's facts, indexes, and the
journal offset they reflect, always written together in one WriteBatch.

Keys (raw bytes, so byte order is meaningful):

    f <run_id> 00 <n: 4B BE>           the run's n-th journal fact (Avro single-object)
    t <due_ms: 8B BE> <run_id> 00 <seq> a timer, retry or signal timeout due at due_ms
    h <run_id>                          the run has a step a handover let go
    i <run_id>                          the run has a step started with no outcome
    p <run_id>                          the run is parked
    e <ended_ms: 8B BE> <run_id>        the run ended then (finished runs, for retention)
    d <run_id>                          changed since the last snapshot: its first new
                                        fact (4B BE); kept so that a reopened projection
                                        still writes it (bookkeeping: not in `dump`)
    b <run_id>                          its remote attempts' latest heartbeats (JSON)
    m journal                           next journal offset to read (8B BE)
    m snapshots                         every run is in <ns>.state or has a d key (a
                                        projection begun before snapshots has not)
    m standby                           a standby copy (`runstream.standby`) tracks no
                                        changes: the journal offset of the owner's last
                                        snapshot marker it saw (8B BE, 0: none) and the
                                        next <ns>.state offset to read (8B BE); an owner
                                        marks the runs changed since (`retrack`)

A run's state is the fold of its facts (plus its heartbeats, which are not facts);
recently used states stay in an LRU so the hot path rarely decodes. A new or emptied
directory restores from the snapshot topic (`projections.snapshot`), if it has one,
then the journal from there.
"""

from __future__ import annotations

import gc
import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch

from runstream.engine.reducer import apply
from runstream.engine.state import Beat, RunState, State, Status, beats_of, new_state
from runstream.engine.work import LogRecord
from runstream.errors import DecodeError
from runstream.projections import snapshot
from runstream.schemas.codec import Codec
from runstream.schemas.records import Fact, RunStarted

log = logging.getLogger("runstream.projections")

_OFFSET_KEY = b"mjournal"
_COVERED_KEY = b"msnapshots"
_STANDBY_KEY = b"mstandby"
_SEQ_BIAS = 1 << 31  # compensation steps have negative seqs; keep keys unsigned


def _run(run_id: str) -> bytes:
    return run_id.encode()


def _fact_key(run: bytes, n: int) -> bytes:
    return b"f" + run + b"\x00" + n.to_bytes(4, "big")


def _timer_key(due_ms: int, run: bytes, seq: int) -> bytes:
    return (
        b"t"
        + max(due_ms, 0).to_bytes(8, "big")
        + run
        + b"\x00"
        + (seq + _SEQ_BIAS).to_bytes(4, "big")
    )


def index_keys(state: State) -> set[bytes]:
    """The index entries a run (or an entity) in ``state`` should have."""
    run = _run(state.run_id)
    keys = {_timer_key(due, run, seq) for due, seq in state.timers()}
    if not isinstance(state, RunState):  # an entity has its timer, nothing else
        return keys
    if state.running_steps():
        keys.add(b"i" + run)
    if state.handed_over_steps():
        keys.add(b"h" + run)
    if state.status is Status.PARKED:
        keys.add(b"p" + run)
    if state.terminal and state.ended_at_ms is not None:
        keys.add(_ended_key(state.ended_at_ms, run))
    return keys


def _ended_key(at_ms: int, run: bytes) -> bytes:
    return b"e" + max(at_ms, 0).to_bytes(8, "big") + run


def _dump_beats(beats: dict[int, Beat]) -> bytes:
    # Details are JSON (UTF-8) from our workers; a foreign worker's other bytes are mangled.
    rows = [
        [seq, at, None if d is None else d.decode("utf-8", "replace")]
        for seq, (at, d) in beats.items()
    ]
    return json.dumps(rows).encode()


def _load_beats(data: bytes) -> dict[int, Beat]:
    return {seq: (at, None if d is None else d.encode()) for seq, at, d in json.loads(data)}


class Taken(NamedTuple):
    """What a snapshot took from a store: the runs changed (run id -> first new fact)
    and the snapshot keys of the runs purged."""

    changed: dict[str, int]
    tombstones: list[bytes]


class PartitionStore:
    """The projection of one journal partition."""

    def __init__(
        self,
        path: Path,
        codec: Codec,
        *,
        cache_size: int = 256,
        read_only: bool = False,
        standby: bool = False,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # One DB per partition: RocksDB's 64 MiB default memtable each would add up to
        # gigabytes on a busy instance. The journal is the truth; small flushes are fine.
        opts.set_write_buffer_size(4 << 20)
        opts.set_max_write_buffer_number(2)
        access = AccessType.read_only(False) if read_only else AccessType.read_write()
        self.path = path
        self._db: Rdict | None = Rdict(str(path), opts, access_type=access)
        self._codec = codec
        self._cache: OrderedDict[str, State] = OrderedDict()
        self._cache_size = cache_size
        raw = self._db.get(_OFFSET_KEY)
        self.journal_offset: int = int.from_bytes(raw, "big") if raw else 0
        # Whether a snapshot of it may have a marker (`covered`): a projection the previous
        # release wrote cannot tell which of its runs <ns>.state lacks.
        self.covered = self.journal_offset == 0 or self._db.get(_COVERED_KEY) is not None
        if self.covered and not read_only:
            self._db.put(_COVERED_KEY, b"1")
        # Runs committed since the last snapshot taken: run id -> its first new fact
        changed = key_range(self._db, b"d", b"e", "items")
        self.changed: dict[str, int] = {
            k[1:].decode(): int.from_bytes(v, "big") for k, v in changed
        }
        self._open_chunk: dict[str, int] = {}  # run id -> where its last chunk begins
        self.tombstones: list[bytes] = []  # snapshot keys of runs purged since
        # A standby copy writes no snapshots: it tracks no change (memory and d keys
        # would grow with every run it tails), and says so until an owner `retrack`s.
        self.standby = standby
        if standby and self.standby_mark() is None:
            self.saw_snapshot(0, 0)

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise RuntimeError(f"projection {self.path} is closed")
        return self._db

    def get(self, run_id: str) -> State:
        """The committed state of ``run_id`` (empty if the run does not exist). Do not
        mutate it: take ``.copy()``."""
        state = self._cache.get(run_id)
        if state is not None:
            self._cache.move_to_end(run_id)
            return state
        state = new_state(run_id)
        run = _run(run_id)
        if self.db.get(_fact_key(run, 0)) is not None:  # a point lookup: new runs are common
            for fact in self.facts(run_id):
                apply(state, fact)
            beats = self.db.get(b"b" + run)
            if beats is not None and isinstance(state, RunState):
                state.beats = _load_beats(beats)
        self._remember(state)
        return state

    def facts(self, run_id: str) -> Iterator[Fact]:
        run = _run(run_id)
        for data in self._range(b"f" + run + b"\x00", b"f" + run + b"\x01", values=True):
            yield self._codec.decode(data)  # type: ignore[misc]  # only facts are stored

    def commit(
        self,
        changes: Iterable[tuple[State, State, list[bytes]]],
        journal_offset: int,
        snapshotted: bool = False,
    ) -> None:
        """Write ``(before, after, new encoded facts)`` per run and the journal offset
        they reach, atomically, then make ``after`` the cached state. The runs are
        changed for the next snapshot unless they come from one (``snapshotted``)."""
        batch = WriteBatch(raw_mode=True)
        afters = []
        for before, after, encoded in changes:
            run = _run(after.run_id)
            first = after.facts - len(encoded)
            for i, data in enumerate(encoded, start=first):
                batch.put(_fact_key(run, i), data)
            tracked = not (snapshotted or self.standby)
            if tracked and first < self.changed.get(after.run_id, first + 1):
                self.changed[after.run_id] = first
                batch.put(b"d" + run, first.to_bytes(4, "big"))
            old, new = index_keys(before), index_keys(after)
            for key in old - new:
                batch.delete(key)
            for key in new - old:
                batch.put(key, b"")
            beats = beats_of(after)
            if beats != beats_of(before):
                if beats:
                    batch.put(b"b" + run, _dump_beats(beats))
                else:
                    batch.delete(b"b" + run)
            afters.append(after)
        batch.put(_OFFSET_KEY, journal_offset.to_bytes(8, "big"))
        self.db.write(batch)
        self.journal_offset = journal_offset
        for after in afters:
            self._remember(after)

    def timers(self) -> Iterator[tuple[int, str, int]]:
        """(due_ms, run_id, seq) of every timer, earliest first."""
        for key in self._range(b"t", b"u"):
            run, seq = key[9:-5], int.from_bytes(key[-4:], "big") - _SEQ_BIAS
            yield int.from_bytes(key[1:9], "big"), run.decode(), seq

    def running(self) -> list[str]:
        """Runs with a step started and no outcome recorded."""
        return [k[1:].decode() for k in self._range(b"i", b"j")]

    def handed_over(self) -> list[str]:
        """Runs with a step a graceful handover let go, to start again."""
        return [k[1:].decode() for k in self._range(b"h", b"i")]

    def parked(self) -> list[str]:
        return [k[1:].decode() for k in self._range(b"p", b"q")]

    def ids(self, prefix: str) -> Iterator[str]:
        """The ids of the runs or entities with facts whose id begins with ``prefix``,
        in order (one seek per id, not one step per fact)."""
        lo = b"f" + _run(prefix)
        it = self.db.iter()
        it.seek(lo)
        while it.valid() and (key := it.key()).startswith(lo):
            run = key[1 : key.index(b"\x00")]
            yield run.decode()
            it.seek(b"f" + run + b"\x01")

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every key and value, in order: two projections of the same journal compare equal."""
        items = self.db.items()  # raw mode: all bytes; d keys and the coverage are bookkeeping
        return [
            (k, v)
            for k, v in items
            if isinstance(k, bytes)
            and not k.startswith(b"d")
            and k not in (_COVERED_KEY, _STANDBY_KEY)
        ]

    def forget(self, run_id: str) -> None:
        self._cache.pop(run_id, None)

    # -- snapshots and retention (`projections.snapshot`, `runstream.snapshots`) ----------
    @property
    def open(self) -> bool:
        return self._db is not None

    @property
    def changing(self) -> bool:
        """Runs changed or purged since the last snapshot taken."""
        return bool(self.changed or self.tombstones)

    def take_snapshot(self) -> tuple[list[tuple[bytes, bytes | None]], Taken]:
        """The snapshot records since the last one: tombstones of the runs purged, new
        chunks and heads of the runs changed, then the marker; and what was taken
        (`untake` it if they do not commit)."""
        taken = Taken(self.changed, self.tombstones)
        self.changed, self.tombstones = {}, []
        records: list[tuple[bytes, bytes | None]] = [(k, None) for k in taken.tombstones]
        for run_id, first in taken.changed.items():  # raw bytes: nothing is decoded
            run = _run(run_id)
            start = self._open_chunk.get(run_id)
            if start is None or start > first:  # where the chunk holding `first` begins
                before = self._range(_fact_key(run, 0), _fact_key(run, first), values=True)
                start = (snapshot.cut(len(v) for v in before) or [0])[-1]
            facts = list(self._range(_fact_key(run, start), b"f" + run + b"\x01", True))
            count = start + len(facts)
            if not count:  # purged meanwhile: its tombstones went
                continue
            starts = snapshot.cut((len(v) for v in facts), start)
            for lo, hi in zip(starts, [*starts[1:], count], strict=True):
                chunk = facts[lo - start : hi - start]
                records.append((snapshot.chunk_key(run_id, lo), snapshot.encode_chunk(chunk)))
            if len(self._open_chunk) >= 10_000:  # a cache: recomputed when missing
                self._open_chunk.clear()
            self._open_chunk[run_id] = starts[-1]
            head = snapshot.encode_head(count, self.db.get(b"b" + run))
            records.append((snapshot.head_key(run_id), head))
        records.append((snapshot.MARKER_KEY, snapshot.encode_marker(self.journal_offset)))
        return records, taken

    def snapshotted(self, taken: Taken) -> None:
        """A snapshot taken committed: its runs are in ``<ns>.state`` (unless changed
        since)."""
        batch = WriteBatch(raw_mode=True)
        for run_id in taken.changed:
            if run_id not in self.changed:
                batch.delete(b"d" + _run(run_id))
        self.db.write(batch)

    def untake(self, taken: Taken) -> None:
        """A snapshot taken did not commit: its runs are changed still, its tombstones
        due (first: a run purged may have started again since)."""
        self.tombstones[:0] = taken.tombstones
        for run_id, first in taken.changed.items():
            self.changed[run_id] = min(first, self.changed.get(run_id, first))

    def load(self, image: Iterable[snapshot.Run], journal_offset: int) -> int:
        """Write the runs of a snapshot image (to an empty projection) and the journal
        offset it reflects, which is written last: a restore cut short starts again.
        How many runs."""
        count, changes = 0, []
        for run in image:
            state = new_state(run.run_id)
            for data in run.facts:
                apply(state, self._codec.decode(data))  # type: ignore[arg-type]
            if run.beats is not None and isinstance(state, RunState):
                state.beats = _load_beats(run.beats)
            changes.append((new_state(run.run_id), state, run.facts))
            count += 1
            if len(changes) >= 2000:
                self.commit(changes, self.journal_offset, snapshotted=True)
                changes = []
        self.commit(changes, journal_offset, snapshotted=True)
        return count

    def clear(self) -> None:
        """Delete everything (a snapshot that could not be loaded whole)."""
        keys = list(self.db.keys())
        for i in range(0, len(keys), 10_000):
            batch = WriteBatch(raw_mode=True)
            for key in keys[i : i + 10_000]:
                batch.delete(key)
            self.db.write(batch)
        self.journal_offset, self.changed, self.tombstones = 0, {}, []
        self.covered = True  # empty again
        self.db.put(_COVERED_KEY, b"1")
        self._cache.clear()
        self._open_chunk.clear()

    def finished(self, before_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` runs that ended before ``before_ms``, earliest first."""
        out = []
        for key in self._range(b"e", b"e" + max(before_ms, 0).to_bytes(8, "big")):
            out.append(key[9:].decode())
            if len(out) >= limit:
                break
        return out

    def purge(self, run_id: str) -> None:
        """Delete a run's facts, index keys and heartbeats; its snapshot keys get
        tombstones with the next snapshot."""
        state = self.get(run_id)
        run = _run(run_id)
        sizes = [len(v) for v in self._range(b"f" + run + b"\x00", b"f" + run + b"\x01", True)]
        batch = WriteBatch(raw_mode=True)
        for i in range(state.facts):
            batch.delete(_fact_key(run, i))
        for key in index_keys(state):
            batch.delete(key)
        batch.delete(b"b" + run)
        batch.delete(b"d" + run)
        self.db.write(batch)
        self._cache.pop(run_id, None)
        self.changed.pop(run_id, None)
        self._open_chunk.pop(run_id, None)
        if self.standby:  # the owner wrote the tombstones
            return
        self.tombstones += [snapshot.chunk_key(run_id, first) for first in snapshot.cut(sizes)]
        self.tombstones.append(snapshot.head_key(run_id))

    # -- standby copies (`runstream.standby`) ------------------------------------------
    def standby_mark(self) -> tuple[int, int] | None:
        """(the journal offset of the owner's last snapshot marker seen, the next
        ``<ns>.state`` offset to read) if a standby filled this copy since an owner
        last `retrack`ed it, else None."""
        raw = self.db.get(_STANDBY_KEY)
        if raw is None:
            return None
        return int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big")

    def saw_snapshot(self, marker: int, state_offset: int) -> None:
        """A standby read the owner's snapshot up to ``state_offset``: every run is in
        ``<ns>.state`` as of journal offset ``marker``."""
        self.db.put(_STANDBY_KEY, marker.to_bytes(8, "big") + state_offset.to_bytes(8, "big"))

    def retrack(self, window: Mapping[str, int]) -> int:
        """An owner takes a standby copy: the runs changed since the owner's last
        snapshot marker become changed here, for the next snapshot (``window``: run id ->
        how many of its facts the journal holds from that marker to this copy's offset;
        with no marker seen, every run). How many runs."""
        mark = self.standby_mark()
        if mark is None:
            return 0
        runs: Mapping[str, int] = window if mark[0] else dict.fromkeys(self.ids(""), 1 << 31)
        batch = WriteBatch(raw_mode=True)
        for run_id, n in runs.items():
            first = max(0, self._fact_count(run_id) - n)
            if first < self.changed.get(run_id, first + 1):
                self.changed[run_id] = first
                batch.put(b"d" + _run(run_id), first.to_bytes(4, "big"))
        batch.delete(_STANDBY_KEY)
        self.db.write(batch)
        self.standby = False
        return len(runs)

    def _fact_count(self, run_id: str) -> int:
        run = _run(run_id)
        it = self.db.iter()
        it.seek_for_prev(b"f" + run + b"\x01")
        if it.valid() and (key := it.key()).startswith(b"f" + run + b"\x00"):
            return int.from_bytes(key[-4:], "big") + 1
        return 0

    def close(self, collect: bool = True) -> None:
        """Close and drop every handle, so the same path can be reopened in this process
        (once ``gc.collect()`` ran: without ``collect``, the caller runs it, once for many)."""
        if self._db is not None:
            self._db.close()
            self._db = None
            self._cache.clear()
            if collect:
                gc.collect()  # rocksdict keeps the LOCK while any handle object is alive

    def _remember(self, state: State) -> None:
        # An ended run is rarely asked for again: read from RocksDB then.
        if isinstance(state, RunState) and state.terminal:
            self._cache.pop(state.run_id, None)
            return
        self._cache[state.run_id] = state
        self._cache.move_to_end(state.run_id)
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _range(self, lo: bytes, hi: bytes, values: bool = False) -> Iterator[bytes]:
        return key_range(self.db, lo, hi, "values" if values else "keys")


def key_range(db: Rdict, lo: bytes, hi: bytes, what: str = "keys") -> Iterator[Any]:
    """The ``keys``, ``values`` or ``items`` of ``db`` from ``lo`` up to ``hi``, in key
    order. A generator, so ``ro`` outlives the iteration: RocksDB keeps a pointer to the
    bound."""
    ro = ReadOptions()
    ro.set_iterate_upper_bound(hi)
    yield from getattr(db, what)(from_key=lo, read_opt=ro)


def close_all(stores: list[PartitionStore]) -> None:
    """Close ``stores`` in parallel (RocksDB flushes each), then free their handles once
    (a ``gc.collect()`` each was most of a standby's handover of six)."""
    if stores:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s.close(collect=False), stores))
        gc.collect()  # rocksdict keeps a LOCK while any handle object is alive


def catch_up(stores: dict[int, PartitionStore], journal: Iterable[LogRecord]) -> int:
    """Apply journal records (each partition's, in order, from its store's offset) to the
    stores, committing every 2,000 runs and at the end; how many facts were applied."""
    changes: dict[int, dict[str, tuple[State, State, list[bytes]]]] = {p: {} for p in stores}
    offsets = {p: s.journal_offset for p, s in stores.items()}
    count = 0
    for rec in journal:
        p, runs, value = rec.partition, changes[rec.partition], rec.value or b""
        offsets[p] = rec.offset + 1
        try:
            fact = stores[p]._codec.decode(value)
            run_id = fact.run_id  # type: ignore[attr-defined]
        except (DecodeError, AttributeError) as exc:  # only the engine writes the journal
            log.error("skipping journal record p%d@%d: %s", p, rec.offset, exc)
            continue
        if run_id in runs and _restarted(runs[run_id][1], fact):
            stores[p].commit(runs.values(), rec.offset)  # up to this start, then purge
            runs = changes[p] = {}
            stores[p].purge(run_id)
        if run_id not in runs:
            before = stores[p].get(run_id)
            if _restarted(before, fact):
                stores[p].purge(run_id)
                before = stores[p].get(run_id)
            runs[run_id] = (before, before.copy(), [])
        apply(runs[run_id][1], fact)  # type: ignore[arg-type]
        runs[run_id][2].append(value)
        count += 1
        if len(runs) >= 2000:
            stores[p].commit(runs.values(), offsets[p])
            changes[p] = {}
    for p, runs in changes.items():
        stores[p].commit(runs.values(), offsets[p])
    return count


def _restarted(state: State, fact: object) -> bool:
    """A run that ended is started again: only a start after its purge (retention) does
    that, and the new run does not inherit the old one's facts."""
    return isinstance(fact, RunStarted) and isinstance(state, RunState) and state.started
