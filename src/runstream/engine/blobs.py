"""Large payloads by claim check: their bytes in chunks on ``<ns>.blobs``, a reference
in the record (docs/guides/large-payloads.md).

A payload (a workflow input, a step or run output, a signal, update, event or promise
value) larger than `Limits.blob_threshold` travels as a `Ref`: a marker no JSON can
start with (`MAGIC`) and a small JSON object naming the bytes by their sha256, size,
chunk count and the time they were written. The chunks are records of the compacted
``<ns>.blobs`` topic keyed ``<sha256>/<i>``, all on the partition the hash picks
(`partition_of`), each under the record limit. Content addressing makes a redo or a
duplicate write the same keys with the same bytes: idempotent, and compaction keeps one.

`payload.loads` resolves a reference through the `Blobs` store active in this context
(`ACTIVE`): the engine's decisions, the client and the task worker each set theirs. The
core itself never reads Kafka: the shell's store does, and what the core writes it
`Blobs.remember`s, so a run's next activation in the same batch sees it.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any, Protocol

from runstream.engine.partitioner import partition_for
from runstream.errors import BlobUnavailable

#: Starts every reference: a NUL byte, which no JSON text (a user payload) starts with.
MAGIC = b"\x00runstream-blob\x00"
#: The key of a reference written as a JSON value (the ``json`` lifecycle format).
MARKER = "$runstream_blob"
#: A reference is well under this many bytes.
REF_MAX = 512


@dataclass(frozen=True, slots=True)
class Ref:
    """Where a payload's bytes are: ``chunks`` records keyed ``<sha256>/<i>`` on the
    blobs partition the hash picks, written at or after ``at_ms`` (a reader seeks there)."""

    sha256: str
    size: int
    chunks: int
    at_ms: int

    def encode(self) -> bytes:
        body = {"sha256": self.sha256, "size": self.size, "chunks": self.chunks, "at": self.at_ms}
        return MAGIC + json.dumps(body, separators=(",", ":")).encode()

    def marker(self) -> dict[str, Any]:
        """The reference as a JSON value (`from_marker` reads it back)."""
        return {
            MARKER: {
                "sha256": self.sha256,
                "size": self.size,
                "chunks": self.chunks,
                "at": self.at_ms,
            }
        }

    def key(self, i: int) -> bytes:
        return f"{self.sha256}/{i}".encode()

    def verify(self, data: bytes) -> bytes:
        """``data`` if it is what this reference names, else BlobUnavailable."""
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise BlobUnavailable(f"blob {self.sha256[:16]}... is corrupt: its hash differs")
        return data


def from_marker(value: Any) -> bytes | None:
    """The reference bytes of a `Ref.marker` (a JSON lifecycle event's), else None."""
    if isinstance(value, dict) and set(value) == {MARKER} and isinstance(value[MARKER], dict):
        return MAGIC + json.dumps(value[MARKER], separators=(",", ":")).encode()
    return None


def parse(data: bytes | None) -> Ref | None:
    """The reference ``data`` holds, None for a plain payload; BlobUnavailable for a
    malformed one (a foreign producer's)."""
    if not data or not data.startswith(MAGIC):
        return None
    try:
        body = json.loads(data[len(MAGIC) :])
        ref = Ref(str(body["sha256"]), int(body["size"]), int(body["chunks"]), int(body["at"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise BlobUnavailable(f"a malformed blob reference ({exc!r:.200})") from None
    if len(ref.sha256) != 64 or ref.size < 0 or ref.chunks < 1 or len(data) > REF_MAX:
        raise BlobUnavailable(f"a malformed blob reference ({data[:REF_MAX]!r:.300})")
    return ref


def split(data: bytes, chunk: int, at_ms: int) -> tuple[Ref, list[bytes]]:
    """The reference of ``data`` and its chunks of at most ``chunk`` bytes."""
    parts = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [b""]
    return Ref(hashlib.sha256(data).hexdigest(), len(data), len(parts), at_ms), parts


def partition_of(ref: Ref, partitions: int) -> int:
    """The blobs partition of every chunk of ``ref`` (Kafka's murmur2 of the hash)."""
    return partition_for(ref.sha256.encode(), partitions)


def refs_in(record: Any) -> list[Ref]:
    """The references in a record's payload fields (its ``bytes`` fields)."""
    found = []
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, bytes) and (ref := parse(value)) is not None:
            found.append(ref)
    return found


@dataclass(frozen=True, slots=True)
class Blob:
    """A payload the core decided to write: its chunks go to the blobs topic in the
    transaction that records its reference."""

    ref: Ref
    chunks: list[bytes]


class Blobs(Protocol):
    """Resolves references (the shell's store reads the blobs topic)."""

    def read(self, ref: Ref) -> bytes:
        """The bytes ``ref`` names, verified; BlobUnavailable if missing or corrupt."""
        ...

    def remember(self, ref: Ref, data: bytes) -> None:
        """Keep ``data`` (just written, or read) for the next `read` of ``ref``."""
        ...


class MemoryBlobs:
    """The payloads last remembered, up to ``most`` bytes (least recently used go first).
    On its own, a store of what the core wrote (unit tests); the Kafka store wraps one as
    its cache."""

    def __init__(self, most: int = 256 * 1024 * 1024) -> None:
        self.most = most
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def get(self, ref: Ref) -> bytes | None:
        data = self._kept.get(ref.sha256)
        if data is not None:
            self._kept.move_to_end(ref.sha256)
        return data

    def read(self, ref: Ref) -> bytes:
        data = self.get(ref)
        if data is None:
            raise BlobUnavailable(f"blob {ref.sha256[:16]}... ({ref.size:,} bytes) is not found")
        return data

    def remember(self, ref: Ref, data: bytes) -> None:
        if ref.sha256 in self._kept or len(data) > self.most:
            return
        self._kept[ref.sha256] = data
        self._bytes += len(data)
        while self._bytes > self.most:
            _, old = self._kept.popitem(last=False)
            self._bytes -= len(old)


#: The store `resolve` reads through in this context (None: references cannot be read).
ACTIVE: ContextVar[Blobs | None] = ContextVar("runstream_blobs", default=None)


@contextmanager
def active(store: Blobs | None) -> Iterator[None]:
    """Make ``store`` the one `resolve` reads through, for the ``with`` block."""
    token = ACTIVE.set(store)
    try:
        yield
    finally:
        ACTIVE.reset(token)


def resolve(data: bytes) -> bytes:
    """``data``, or the bytes it references."""
    ref = parse(data)
    if ref is None:
        return data
    store = ACTIVE.get()
    if store is None:
        raise BlobUnavailable(f"blob {ref.sha256[:16]}... cannot be read here (no blob store)")
    return store.read(ref)
