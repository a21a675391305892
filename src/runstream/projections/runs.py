"""The runs read model: ``<ns>.lifecycle`` folded into a local RocksDB database, to list
and count runs by status, workflow, version, tag and start time without asking the engine.

Any machine builds it from the topic alone, with its own offsets (no consumer group):
the rows of a batch of events and the lifecycle offsets they reach are written in one
WriteBatch, so the model never counts an event twice nor skips one. It starts over when
the topic was recreated (another topic id, or stored offsets past the topic's end).

Keys (raw bytes; ``T`` is ``2**63 - 1 - started_at_ms``, 8 bytes big-endian, so an index
lists the newest runs first; ``|s|`` is ``s`` prefixed with its length, 2 bytes; a field
longer than 2 bytes can say is clipped there, to a head and a digest of the whole: the
row keeps it whole and a query compares whole values, so listings stay exact):

    r <run>                                   the run's row (JSON, `RunRow`)
    e <run> 00 <n: 4B BE>                     its n-th lifecycle event, as read
    v <run> 00 <key>                          its event ``key`` (ctx.set_event), newest
                                              value (JSON, `EventRow`)
    a T <run>                                 every run
    s |status| T <run>                        by status
    w |workflow| T <run>                      by workflow
    g |key| |value| T <run>                   by tag
    c |workflow| |version| |status|           how many runs (8B BE)
    o <partition: 4B BE>                      next lifecycle offset to read (8B BE)
    m topic                                   the lifecycle topic's id
    m partial                                 the topic had dropped events when first read
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rocksdict import AccessType, Options, Rdict, WriteBatch

from runstream.engine import blobs, payload
from runstream.engine.work import LogRecord
from runstream.errors import DecodeError
from runstream.projections.store import key_range
from runstream.schemas.codec import Codec
from runstream.schemas.records import TERMINAL, Kind, LifecycleEvent, Status, run_id_problem
from runstream.topics import lifecycle_wire

log = logging.getLogger("runstream.projections")

_MAX_MS = (1 << 63) - 1
_FIELD_MAX = (1 << 16) - 1  # the longest field a 2-byte length says
_TOPIC_KEY, _PARTIAL_KEY = b"mtopic", b"mpartial"
_KINDS = frozenset(Kind)
_ENDS = frozenset({Kind.RUN_COMPLETED, Kind.RUN_FAILED, Kind.RUN_CANCELLED, Kind.RUN_DEAD})
#: Statuses of runs that will not move again: every other status counts as open.
CLOSED = frozenset({*TERMINAL, Status.REJECTED})


@dataclass
class RunRow:
    """What the lifecycle stream tells about one run (payloads as JSON text)."""

    run_id: str
    workflow: str = ""
    version: str = ""
    status: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    started_at_ms: int = 0  # run.started; until then the first event seen
    updated_at_ms: int = 0
    ended_at_ms: int | None = None
    duration_ms: int | None = None
    input: str | None = None
    output: str | None = None
    error: str | None = None
    reason: str | None = None
    code: str | None = None
    continued_as: str | None = None
    steps: int = 0  # step.completed events
    events: int = 0
    purged_at_ms: int | None = None  # run.purged: past the namespace's finished_retention

    def to_dict(self) -> dict[str, Any]:
        """The row for JSON output: input and output as JSON values."""
        out = dataclasses.asdict(self)
        out["input"], out["output"] = _json(self.input), _json(self.output)
        return out


@dataclass(frozen=True)
class EventRow:
    """A run's event (``ctx.set_event``) as the model last read it: the value (JSON
    text), and where its ``run.event_set`` lies on the lifecycle topic."""

    key: str
    value: str
    seq: int
    at_ms: int
    partition: int
    offset: int


def fold(row: RunRow | None, ev: LifecycleEvent) -> RunRow | None:
    """``row`` after lifecycle event ``ev`` (a new row if None); None for an event of a
    type this version does not know (readers ignore those)."""
    if ev.type not in _KINDS or ev.type == Kind.EVENT_UNMATCHED:  # not about a run
        return row
    r = RunRow(ev.run_id, started_at_ms=ev.at_ms) if row is None else dataclasses.replace(row)
    r.workflow, r.version = ev.workflow or r.workflow, ev.version or r.version
    r.status = ev.status or r.status
    r.updated_at_ms, r.events = max(r.updated_at_ms, ev.at_ms), r.events + 1
    if ev.reason is not None:
        r.reason = ev.reason
    if ev.type == Kind.RUN_STARTED:
        r.started_at_ms, r.tags, r.input = ev.at_ms, dict(ev.tags), _text(ev.input)
        r.purged_at_ms = None  # a new run of a purged one's id
    elif ev.type == Kind.STEP_COMPLETED:
        r.steps += 1
    elif ev.type == Kind.RUN_REJECTED:
        r.code = ev.code
    elif ev.type == Kind.RUN_RETRIED and ev.continued_as:  # a new run carries on
        r.continued_as = ev.continued_as
    elif ev.type == Kind.RUN_RETRIED:  # it runs again
        r.ended_at_ms = r.duration_ms = None
        r.error = None
    elif ev.type == Kind.RUN_PURGED:
        r.purged_at_ms = ev.at_ms
    elif ev.type in _ENDS:
        r.ended_at_ms, r.duration_ms = ev.at_ms, ev.duration_ms
        r.output, r.error, r.continued_as = _text(ev.output), ev.error, ev.continued_as
    return r


@dataclass(frozen=True)
class RunQuery:
    """Which runs: every condition given must hold; times bound the start, in ms."""

    status: str | None = None
    workflow: str | None = None
    version: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    since_ms: int | None = None
    until_ms: int | None = None

    def matches(self, row: RunRow) -> bool:
        return (
            (self.status is None or row.status == self.status)
            and (self.workflow is None or row.workflow == self.workflow)
            and (self.version is None or row.version == self.version)
            and all(row.tags.get(k) == v for k, v in self.tags.items())
            and (self.since_ms is None or row.started_at_ms >= self.since_ms)
            and (self.until_ms is None or row.started_at_ms < self.until_ms)
        )


@dataclass(frozen=True)
class Page:
    """One page of runs, newest first; ``after`` continues the listing (None: the end)."""

    runs: list[RunRow]
    after: str | None


@dataclass(frozen=True)
class VersionCount:
    """The runs of one workflow version, by status."""

    workflow: str
    version: str
    statuses: dict[str, int]

    @property
    def open(self) -> int:
        """Runs that may still move: while any is open, the version must stay deployed."""
        return sum(n for s, n in self.statuses.items() if s not in CLOSED)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


class Layout(Protocol):
    """The topic as it is now (``topics.catchup.TopicLayout``)."""

    @property
    def topic_id(self) -> str: ...

    @property
    def bounds(self) -> dict[int, tuple[int, int]]:
        """Partition -> (low, high) watermarks."""
        ...


class LifecycleSource(Protocol):
    """Where the model reads from: ``topics.catchup.PartitionReader`` on the lifecycle
    topic, or a list in a unit test."""

    def layout(self) -> Layout | None:
        """None if the topic does not exist."""
        ...

    def read(self, start: Mapping[int, int]) -> Iterator[tuple[list[LogRecord], dict[int, int]]]:
        """Batches of records from ``start`` to each partition's end, with the offsets
        reached after each batch."""
        ...


@dataclass(frozen=True)
class CatchUp:
    """What a catch-up did: ``read`` records in one pass, after starting over if
    ``rebuilt``. ``partial``: the topic had dropped events (retention) before this model
    first read them, so runs quiet since then are missing."""

    read: int
    rebuilt: bool
    partial: bool


Progress = Callable[[int, int], None]  # (records read, records to read at most)


class RunsModel:
    """The read model of one namespace, in the RocksDB directory ``path``.

    ``read_only`` opens a model another process is updating, as it was last written.
    """

    def __init__(self, path: Path, codec: Codec | None = None, *, read_only: bool = False) -> None:
        self.path, self.codec = path, codec or Codec.default()
        self._read_only = read_only
        self._db: Rdict | None = self._open()

    def _open(self) -> Rdict:
        self.path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(16 << 20)
        access = AccessType.read_only(False) if self._read_only else AccessType.read_write()
        return Rdict(str(self.path), opts, access_type=access)

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise RuntimeError(f"runs model {self.path} is closed")
        return self._db

    @property
    def read_only(self) -> bool:
        return self._read_only

    # -- building ------------------------------------------------------------------------
    def offsets(self) -> dict[int, int]:
        """Partition -> next lifecycle offset to read."""
        return {
            int.from_bytes(k[1:], "big"): int.from_bytes(v, "big")
            for k, v in self._range(b"o", b"p", values=True)
        }

    def catch_up(self, source: LifecycleSource, progress: Progress | None = None) -> CatchUp:
        """Read the lifecycle topic from the stored offsets to its end, once.

        Starts over first if the topic is not the one the model was built from.
        Raises LookupError if the topic does not exist.
        """
        layout = source.layout()
        if layout is None:
            raise LookupError("the lifecycle topic does not exist")
        bounds = layout.bounds
        stored = self.offsets()
        known = self.db.get(_TOPIC_KEY)
        rebuilt = known is not None and (
            known.decode() != layout.topic_id
            or not set(stored) <= set(bounds)
            or any(o > bounds[p][1] for p, o in stored.items())
        )
        if rebuilt:
            log.info("the lifecycle topic changed: rebuilding %s", self.path)
            self._reset()
        if known is None or rebuilt:
            self.db.put(_TOPIC_KEY, layout.topic_id.encode())
            stored = {}
        start = {p: max(stored.get(p, 0), low) for p, (low, _) in bounds.items()}
        if any(start[p] > stored.get(p, 0) for p in start):
            self.db.put(_PARTIAL_KEY, b"")  # events were gone before we could read them
        todo = {p: o for p, o in start.items() if o < bounds[p][1]}
        total, read = sum(bounds[p][1] - o for p, o in todo.items()), 0
        if todo:
            for records, positions in source.read(todo):
                self.apply(records, positions)
                read += len(records)
                if progress is not None:
                    progress(read, total)
        return CatchUp(read, rebuilt, self.partial)

    @property
    def partial(self) -> bool:
        return self.db.get(_PARTIAL_KEY) is not None

    def apply(self, records: Iterable[LogRecord], positions: Mapping[int, int]) -> None:
        """Fold ``records`` in and store ``positions``, in one WriteBatch."""
        changed: dict[str, tuple[RunRow | None, RunRow, list[bytes]]] = {}
        sets: dict[bytes, EventRow] = {}  # the newest value of each (run, key) read here
        for rec in records:
            try:
                ev = lifecycle_wire.decode(self.codec, rec.value)  # any format
                if not isinstance(ev, LifecycleEvent):
                    raise DecodeError("not-a-lifecycle-event", f"{ev.AVRO} record")
                if problem := run_id_problem(ev.run_id):
                    raise DecodeError("bad-run-id", problem)
            except DecodeError as exc:  # a foreign producer's mistake: not ours to stop on
                log.warning("skipping lifecycle record p%d@%d: %s", rec.partition, rec.offset, exc)
                continue
            values: list[bytes] = []
            current: RunRow | None
            if ev.run_id in changed:
                before, current, values = changed[ev.run_id]
            else:
                before = current = self.get(ev.run_id)
            row = fold(current, ev)
            if ev.type == Kind.RUN_EVENT_SET and ev.key is not None:
                text = _text(ev.output) or "null"
                found = EventRow(ev.key, text, ev.seq or 0, ev.at_ms, rec.partition, rec.offset)
                sets[_event_key(ev.run_id, ev.key)] = found
            if row is not None and row is not current:
                values.append(rec.value or b"")
                changed[ev.run_id] = (before, row, values)
        batch = WriteBatch(raw_mode=True)
        counts: Counter[bytes] = Counter()
        for before, after, values in changed.values():
            run = after.run_id.encode()
            batch.put(b"r" + run, json.dumps(dataclasses.asdict(after)).encode())
            for n, value in enumerate(values, start=after.events - len(values)):
                batch.put(b"e" + run + b"\x00" + n.to_bytes(4, "big"), value)
            old = _index_keys(before) if before is not None else set()
            new = _index_keys(after)
            for key in old - new:
                batch.delete(key)
            for key in new - old:
                batch.put(key, b"")
            if new - old and (long := _long_fields(after)):
                log.warning("run %r: %s clipped in the runs index", after.run_id, long)
            if before is not None:
                counts[_count_key(before)] -= 1
            counts[_count_key(after)] += 1
        for key, delta in counts.items():
            if delta:
                raw = self.db.get(key)
                n = (int.from_bytes(raw, "big") if raw else 0) + delta
                batch.put(key, n.to_bytes(8, "big")) if n else batch.delete(key)
        for key, found in sets.items():
            batch.put(key, json.dumps(dataclasses.asdict(found)).encode())
        for p, offset in positions.items():
            batch.put(b"o" + p.to_bytes(4, "big"), offset.to_bytes(8, "big"))
        self.db.write(batch)

    def _reset(self) -> None:
        self.close()
        shutil.rmtree(self.path)
        self._db = self._open()

    # -- asking ------------------------------------------------------------------------
    def get(self, run_id: str) -> RunRow | None:
        raw = self.db.get(b"r" + run_id.encode())
        return None if raw is None else RunRow(**json.loads(raw))

    def event(self, run_id: str, key: str) -> EventRow | None:
        """The run's event ``key`` as last set (``ctx.set_event``), or None."""
        raw = self.db.get(_event_key(run_id, key))
        return None if raw is None else EventRow(**json.loads(raw))

    def events(self, run_id: str) -> list[LifecycleEvent]:
        """The run's lifecycle events, in order."""
        run = run_id.encode()
        values = self._range(b"e" + run + b"\x00", b"e" + run + b"\x01", values=True)
        events = (lifecycle_wire.decode(self.codec, v[1]) for v in values)  # any format
        return [ev for ev in events if isinstance(ev, LifecycleEvent)]

    def find(self, query: RunQuery, limit: int = 20, after: str | None = None) -> Page:
        """Runs matching ``query``, newest first; ``after`` is a previous page's ``after``."""
        runs: list[RunRow] = []
        last = None
        for position, row in self._scan(query, after):
            if len(runs) == limit:
                return Page(runs, last)
            runs.append(row)
            last = position
        return Page(runs, None)

    def count(self, query: RunQuery) -> int:
        """How many runs match ``query`` (from the counters when it names no tag nor time)."""
        if query.tags or query.since_ms is not None or query.until_ms is not None:
            return sum(1 for _ in self._scan(query, None))
        return sum(
            v.statuses.get(query.status, 0) if query.status is not None else v.total
            for v in self.versions()  # the counters hold long names clipped: compare so
            if (query.workflow is None or _pack(v.workflow) == _pack(query.workflow))
            and (query.version is None or _pack(v.version) == _pack(query.version))
        )

    def versions(self) -> list[VersionCount]:
        """Per workflow and version, its runs by status."""
        out: dict[tuple[str, str], dict[str, int]] = {}
        for key, value in self._range(b"c", b"d", values=True):
            workflow, version, status = _unpack(key[1:], 3)
            out.setdefault((workflow, version), {})[status] = int.from_bytes(value, "big")
        return [VersionCount(w, v, statuses) for (w, v), statuses in sorted(out.items())]

    def _scan(self, query: RunQuery, after: str | None) -> Iterator[tuple[str, RunRow]]:
        """(position, row) of each match, newest first, from the narrowest index."""
        if query.tags:
            k, v = next(iter(sorted(query.tags.items())))
            prefix = b"g" + _pack(k) + _pack(v)
        elif query.status is not None:
            prefix = b"s" + _pack(query.status)
        elif query.workflow is not None:
            prefix = b"w" + _pack(query.workflow)
        else:
            prefix = b"a"
        lo = prefix
        if query.until_ms is not None:
            lo = prefix + _inverted(query.until_ms - 1)
        if after is not None:
            lo = max(lo, prefix + _position(after) + b"\x00")
        hi = _successor(prefix)
        if query.since_ms is not None:
            hi = prefix + _inverted(query.since_ms - 1)
        for key in self._range(lo, hi):
            assert isinstance(key, bytes)
            row = self.get(key[len(prefix) + 8 :].decode())
            if row is not None and query.matches(row):
                started = _MAX_MS - int.from_bytes(key[len(prefix) : len(prefix) + 8], "big")
                yield f"{started}.{row.run_id}", row

    def close(self) -> None:
        """Close and drop every handle, so the same path can be opened again."""
        if self._db is not None:
            self._db.close()
            self._db = None
            gc.collect()  # rocksdict keeps the LOCK while any handle object is alive

    def _range(self, lo: bytes, hi: bytes, values: bool = False) -> Iterator[Any]:
        """Keys from ``lo`` up to ``hi``, or (``values``) their (key, value) items."""
        return key_range(self.db, lo, hi, "items" if values else "keys")


def _index_keys(row: RunRow) -> set[bytes]:
    t, run = _inverted(row.started_at_ms), row.run_id.encode()
    keys = {b"a" + t + run, b"s" + _pack(row.status) + t + run}
    if row.workflow:
        keys.add(b"w" + _pack(row.workflow) + t + run)
    keys |= {b"g" + _pack(k) + _pack(v) + t + run for k, v in row.tags.items()}
    return keys


def _event_key(run_id: str, key: str) -> bytes:
    return b"v" + run_id.encode() + b"\x00" + key.encode()


def _count_key(row: RunRow) -> bytes:
    return b"c" + _pack(row.workflow) + _pack(row.version) + _pack(row.status)


def _inverted(ms: int) -> bytes:
    return (_MAX_MS - max(ms, 0)).to_bytes(8, "big")


def _position(after: str) -> bytes:
    """A page position ``<started_at_ms>.<run_id>`` as the key suffix it stands for."""
    started, _, run_id = after.partition(".")
    if not started.isdigit():
        raise ValueError(f"not a page position: {after!r}")
    return _inverted(int(started)) + run_id.encode()


def _successor(prefix: bytes) -> bytes:
    """The smallest key above every key starting with ``prefix``."""
    stem = prefix.rstrip(b"\xff")
    return stem[:-1] + bytes([stem[-1] + 1])


def _pack(s: str) -> bytes:
    b = s.encode()
    if len(b) > _FIELD_MAX:  # a head and the whole's digest: distinct values stay distinct
        digest = hashlib.sha256(b).hexdigest()
        b = b[: _FIELD_MAX - 100].decode(errors="ignore").encode() + f"...{digest}".encode()
    return len(b).to_bytes(2, "big") + b


def _long_fields(row: RunRow) -> str:
    """Which of a row's indexed fields are too long for the index ('' if none)."""
    fields = [("workflow", row.workflow), ("version", row.version), ("status", row.status)]
    fields += [(f"tag {k[:40]!r}", s) for k, v in row.tags.items() for s in (k, v)]
    return ", ".join(dict.fromkeys(name for name, s in fields if len(s.encode()) > _FIELD_MAX))


def _unpack(data: bytes, n: int) -> list[str]:
    out, i = [], 0
    for _ in range(n):
        size = int.from_bytes(data[i : i + 2], "big")
        out.append(data[i + 2 : i + 2 + size].decode())
        i += 2 + size
    return out


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode(errors="replace")


def _json(text: str | None) -> Any:
    return None if text is None else payload.shown(text.encode())  # a large one: its value


def shown_text(text: str | None) -> str | None:
    """A payload's JSON text as stored, or a large payload's (read, or why not)."""
    if text is None or not text.startswith(blobs.MAGIC.decode()):
        return text
    return json.dumps(_json(text), ensure_ascii=False)
