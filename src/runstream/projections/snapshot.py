"""The records of ``<ns>.state``: a compacted image of each partition's projection, so a
new owner restores live runs instead of reading the whole journal (Kafka Streams'
changelog topics, adapted: written at an interval, with the journal offset it reflects).

Keys (raw bytes, one partition of ``<ns>.state`` per journal partition):

    <run_id>                       the run's head: how many facts, its heartbeats
    <run_id> 00 <first: 4B BE>     a chunk: the run's facts from its ``first`` on
    00 "journal"                   the marker: the journal offset the partition's image
                                   reflects (the next offset to read)

A run is cut in chunks so that a run that grows by a few facts rewrites its last chunk,
not its whole history (a 2,000-step run must not cost O(n^2) bytes). Chunks are cut
greedily from the first fact (`cut`): at most `CHUNK` facts and `CHUNK_BYTES` bytes
each (a larger fact alone), so a run's growth never moves an earlier boundary. A purged
run's keys get tombstones (value None).

Every value begins with a format byte (`FORMAT`) and a kind byte. A reader takes every
format up to its own; one it does not know raises `Unreadable`, and the restore then
reads the journal instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

FORMAT = 1  # the format this engine writes; it reads 1..FORMAT
CHUNK = 64  # facts per chunk record, at most
CHUNK_BYTES = 256 * 1024  # bytes of facts per chunk record, at most (unless one is larger)
MARKER_KEY = b"\x00journal"

_HEAD, _CHUNK, _MARKER = b"H", b"C", b"M"


class Unreadable(ValueError):
    """A snapshot record this engine cannot read (a newer format, or damaged bytes)."""


def head_key(run_id: str) -> bytes:
    return run_id.encode()


def chunk_key(run_id: str, first: int) -> bytes:
    return run_id.encode() + b"\x00" + first.to_bytes(4, "big")


def cut(sizes: Iterable[int], first: int = 0) -> list[int]:
    """The first index of each chunk of facts of these ``sizes`` (from index ``first``,
    a chunk's start): greedy, so a longer history only adds chunks after the last."""
    starts: list[int] = []
    count = size = 0
    for i, n in enumerate(sizes, start=first):
        if not starts or count >= CHUNK or (size + n > CHUNK_BYTES and count):
            starts.append(i)
            count = size = 0
        count, size = count + 1, size + n
    return starts


def encode_head(facts: int, beats: bytes | None) -> bytes:
    return bytes([FORMAT]) + _HEAD + facts.to_bytes(4, "big") + (beats or b"")


def encode_chunk(facts: Iterable[bytes]) -> bytes:
    out = [bytes([FORMAT]), _CHUNK]
    for data in facts:
        out += [len(data).to_bytes(4, "big"), data]
    return b"".join(out)


def encode_marker(journal_offset: int) -> bytes:
    return bytes([FORMAT]) + _MARKER + journal_offset.to_bytes(8, "big")


def decode_marker(value: bytes | None) -> int:
    """The journal offset a marker's value says; `Unreadable` if it is not one."""
    return int.from_bytes(_body(value, _MARKER, 8), "big")


def head_of(key: bytes | None) -> str | None:
    """The run id of a head's key; None for a chunk's key, the marker's, or bytes that
    are no run id."""
    if not key or key == MARKER_KEY or (len(key) > 5 and key[-5] == 0):
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class Run:
    """One run (or entity) of an image: its encoded facts, in order, and its heartbeats
    (the projection's JSON, or None)."""

    run_id: str
    facts: list[bytes]
    beats: bytes | None


class Image:
    """A partition's image, read from ``<ns>.state`` in offset order (`add` each record);
    then `runs` and `journal_offset` (None: no marker, no snapshot)."""

    def __init__(self) -> None:
        self.journal_offset: int | None = None
        self._heads: dict[str, tuple[int, bytes | None]] = {}
        self._chunks: dict[str, dict[int, bytes]] = {}

    def add(self, key: bytes | None, value: bytes | None) -> None:
        """Take one record; `Unreadable` if its key or value cannot be read."""
        if not key:
            raise Unreadable("a snapshot record with no key")
        if key == MARKER_KEY:
            self.journal_offset = decode_marker(value)
            return
        is_chunk = len(key) > 5 and key[-5] == 0
        run, n = key[:-5], key[-4:]
        try:
            run_id = (run if is_chunk else key).decode()
        except UnicodeDecodeError as exc:
            raise Unreadable(f"snapshot key {key!r} is not a run id") from exc
        if is_chunk:
            run_chunks, first = self._chunks.setdefault(run_id, {}), int.from_bytes(n, "big")
            if value is None:
                run_chunks.pop(first, None)
            else:
                run_chunks[first] = _body(value, _CHUNK)
        elif value is None:
            self._heads.pop(run_id, None)
        else:
            body = _body(value, _HEAD)
            if len(body) < 4:
                raise Unreadable(f"snapshot head of {run_id!r} is cut short")
            self._heads[run_id] = (int.from_bytes(body[:4], "big"), body[4:] or None)

    def runs(self) -> Iterator[Run]:
        """Each run with a head, its facts from its chunks; `Unreadable` if a chunk is
        missing or the facts are not the count the head says."""
        for run_id, (count, beats) in self._heads.items():
            facts: list[bytes] = []
            for first, body in sorted(self._chunks.get(run_id, {}).items()):
                if first >= count:  # written after the head's count: not part of it
                    break
                if first != len(facts):
                    raise Unreadable(f"snapshot of {run_id!r} lacks facts from {len(facts)}")
                facts += _split(body)
            if len(facts) != count:
                raise Unreadable(f"snapshot of {run_id!r} has {len(facts)} facts, not {count}")
            yield Run(run_id, facts, beats)


def _body(value: bytes | None, kind: bytes, size: int | None = None) -> bytes:
    """The bytes after the format and kind bytes of a record of ``kind``."""
    if value is None or len(value) < 2:
        raise Unreadable("a snapshot value cut short")
    if not 1 <= value[0] <= FORMAT:
        raise Unreadable(f"snapshot format {value[0]} (this engine reads 1 to {FORMAT})")
    if value[1:2] != kind:
        raise Unreadable(f"snapshot record of kind {value[1:2]!r} where {kind!r} was expected")
    body = value[2:]
    if size is not None and len(body) != size:
        raise Unreadable(f"snapshot record of kind {kind!r} has {len(body)} bytes")
    return body


def _split(body: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(body):
        if i + 4 > len(body):
            raise Unreadable("a snapshot chunk cut short")
        n = int.from_bytes(body[i : i + 4], "big")
        if i + 4 + n > len(body):
            raise Unreadable("a snapshot chunk cut short")
        out.append(body[i + 4 : i + 4 + n])
        i += 4 + n
    return out
