"""One RocksDB database per owned partition: each run's facts, indexes, and the
journal offset they reflect, always written together in one WriteBatch.

Keys (raw bytes, so byte order is meaningful):

    f <run_id> 00 <n: 4B BE>           the run's n-th journal fact (Avro single-object)
    t <due_ms: 8B BE> <run_id> 00 <seq> a timer, retry or signal timeout due at due_ms
    h <run_id>                          the run has a step a handover let go
    i <run_id>                          the run has a step started with no outcome
    p <run_id>                          the run is parked
    b <run_id>                          its remote attempts' latest heartbeats (JSON)
    m journal                           next journal offset to read (8B BE)

A run's state is the fold of its facts (plus its heartbeats, which are not facts);
recently used states stay in an LRU so the hot path rarely decodes. A new or emptied
directory rebuilds from the journal.
"""

from __future__ import annotations

import gc
import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch

from runstream.engine.reducer import apply
from runstream.engine.state import Beat, RunState, State, Status, beats_of, new_state
from runstream.engine.work import LogRecord
from runstream.errors import DecodeError
from runstream.schemas.codec import Codec
from runstream.schemas.records import Fact

log = logging.getLogger("runstream.projections")

_OFFSET_KEY = b"mjournal"
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
    return keys


def _dump_beats(beats: dict[int, Beat]) -> bytes:
    # Details are JSON (UTF-8) from our workers; a foreign worker's other bytes are mangled.
    rows = [
        [seq, at, None if d is None else d.decode("utf-8", "replace")]
        for seq, (at, d) in beats.items()
    ]
    return json.dumps(rows).encode()


def _load_beats(data: bytes) -> dict[int, Beat]:
    return {seq: (at, None if d is None else d.encode()) for seq, at, d in json.loads(data)}


class PartitionStore:
    """The projection of one journal partition."""

    def __init__(
        self, path: Path, codec: Codec, *, cache_size: int = 256, read_only: bool = False
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
        self, changes: Iterable[tuple[State, State, list[bytes]]], journal_offset: int
    ) -> None:
        """Write ``(before, after, new encoded facts)`` per run and the journal offset
        they reach, atomically, then make ``after`` the cached state."""
        batch = WriteBatch(raw_mode=True)
        afters = []
        for before, after, encoded in changes:
            run = _run(after.run_id)
            for i, data in enumerate(encoded, start=after.facts - len(encoded)):
                batch.put(_fact_key(run, i), data)
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
        return [(k, v) for k, v in self.db.items() if isinstance(k, bytes)]  # raw mode: all bytes

    def forget(self, run_id: str) -> None:
        self._cache.pop(run_id, None)

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
        if run_id not in runs:
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
