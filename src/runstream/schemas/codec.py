"""Avro single-object encoding of Runstream's records (payloads inside are JSON bytes,
made by `runstream.engine.payload`).

Every Kafka value Runstream writes is::

    C3 01 | 8-byte CRC-64-AVRO fingerprint (little-endian) | Avro binary body

(https://avro.apache.org/docs/1.11.1/specification/#single-object-encoding). The
fingerprint is taken over the parsing canonical form of the writer's expanded schema,
so a reader in any language learns the writer's schema from the bytes alone. The
shipped ``runstream.<Name>.avsc`` files are the contract; a reader resolves records
written with an older, registered version of a schema against the current one.

Evolving a schema: add fields only with a default, and keep the previous version
next to it as ``runstream.<Name>.v<N>.avsc`` (same record name): the codec loads it
as an extra writer schema, so records written by producers that still use it stay
readable.

Schemas are parsed once, when a :class:`Codec` is built; ``encode`` and ``decode`` do
no parsing and are meant for the per-record hot path.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from io import BytesIO
from typing import Any, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import expand_schema, to_parsing_canonical_form
from fastavro.validation import validate

from runstream.errors import DecodeError, SchemaError
from runstream.schemas.records import RECORDS, Record
from runstream.schemas.writer import Writer, compile_writer

__all__ = ["MAGIC", "Codec", "schema_fingerprint"]

#: The two marker bytes that open every single-object encoded value.
MAGIC = b"\xc3\x01"
_HEADER_LEN = 10


def schema_fingerprint(schema: Mapping[str, Any] | str) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint (little-endian, as on the wire) of a schema.

    Taken over the parsing canonical form of the expanded schema, so it matches what
    Java's ``SchemaNormalization.parsingFingerprint64`` and other languages compute.
    """
    raw: Any = schema
    if isinstance(schema, str) and schema.lstrip()[:1] in ("{", "[", '"'):
        raw = json.loads(schema)  # JSON text; anything else is a bare type name ("int")
    expanded = expand_schema(dict(raw)) if isinstance(raw, Mapping) else raw
    return _crc64_avro(to_parsing_canonical_form(expanded).encode())


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_CRC64_EMPTY = 0xC15D213AA4D7A795
# Built once: fastavro's fingerprint builds it again on every call, which cost every
# start-up about 0.1 s of CPU over the shipped schemas.
_CRC64_TABLE = _crc64_table()


def _crc64_avro(data: bytes) -> bytes:
    """The Avro specification's CRC-64 (Rabin) fingerprint of ``data``, little-endian
    as Java gives it."""
    fp = _CRC64_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _CRC64_TABLE[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


@dataclass(frozen=True, slots=True)
class _Schema:
    name: str  # short name, e.g. "StartRun"
    fullname: str  # e.g. "runstream.StartRun"
    raw: dict[str, Any]  # the JSON as written, with doc and defaults
    parsed: dict[str, Any]  # fastavro's parsed form, reused for every record
    fingerprint: bytes  # 8 bytes
    header: bytes  # MAGIC + fingerprint


@dataclass(frozen=True, slots=True)
class _Writer:
    name: str
    writer: dict[str, Any]
    reader: dict[str, Any] | None  # None when the writer is the current schema


def _load(schema: Mapping[str, Any] | str) -> _Schema:
    try:
        raw = json.loads(schema) if isinstance(schema, str) else copy.deepcopy(dict(schema))
    except ValueError as exc:
        raise SchemaError(f"schema is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("type") != "record" or "name" not in raw:
        raise SchemaError("a Runstream schema must be an Avro record with a name")
    name = str(raw["name"])
    namespace = raw.get("namespace")
    fullname = name if "." in name or not namespace else f"{namespace}.{name}"
    try:
        parsed = cast(dict[str, Any], parse_schema(raw, {}))
        fp = schema_fingerprint(raw)
    except Exception as exc:  # fastavro raises SchemaParseException, ValueError, ...
        raise SchemaError(f"invalid Avro schema {fullname}: {exc}") from exc
    return _Schema(
        name=fullname.rsplit(".", 1)[-1],
        fullname=fullname,
        raw=raw,
        parsed=parsed,
        fingerprint=fp,
        header=MAGIC + fp,
    )


def _shipped() -> list[_Schema]:
    """The shipped schemas: current ones first, then older versions of them."""
    files = resources.files("runstream.schemas")
    loaded = [
        (f.name, _load(f.read_text(encoding="utf-8")))
        for f in sorted(files.iterdir(), key=lambda f: f.name)
        if f.name.endswith(".avsc")
    ]
    # `runstream.StartRun.avsc` is current; `runstream.StartRun.v1.avsc` is an older one.
    loaded.sort(key=lambda item: item[0] != f"{item[1].fullname}.avsc")
    return [s for _, s in loaded]


class Codec:
    """Encodes and decodes Runstream records as Avro single-object values.

    Build one per process (``Codec.default()``) and share it: it is read-only on the
    hot path. ``register`` adds further writer schemas (older versions of a record)
    and should happen at start-up.

    Args:
        schemas: Avro record schemas (dicts or JSON text). ``None`` loads every
            ``.avsc`` shipped in ``runstream.schemas``.
    """

    def __init__(self, schemas: Iterable[Mapping[str, Any] | str] | None = None) -> None:
        self._current: dict[str, _Schema] = {}  # short AND full name -> current schema
        self._by_fp: dict[bytes, _Writer] = {}
        self._writers: dict[str, Writer] = {}  # compiled writers of the current schemas
        for schema in _shipped() if schemas is None else schemas:
            self.register(schema)

    @classmethod
    def default(cls) -> Codec:
        """The process-wide codec with the shipped schemas (built once, then cached)."""
        return _default_codec()

    # -- schemas ---------------------------------------------------------------

    def register(self, schema: Mapping[str, Any] | str | _Schema) -> None:
        """Add a schema (a dict or JSON text).

        For a record name the codec does not know yet, the schema becomes that name's
        current schema: used to encode, and as the reader schema. For a known name it
        is added as an extra *writer* schema (typically an older version): records
        carrying its fingerprint are decoded and resolved into the current schema,
        with defaults filled in for fields the writer did not have. Registering a
        schema whose fingerprint is already known does nothing.
        """
        s = schema if isinstance(schema, _Schema) else _load(schema)
        if s.fingerprint in self._by_fp:
            return
        current = self._current.get(s.name)
        if current is None:
            self._current[s.name] = self._current[s.fullname] = s
            self._by_fp[s.fingerprint] = _Writer(s.name, s.parsed, None)
            cls = RECORDS.get(s.name)
            fields = tuple(f["name"] for f in s.raw["fields"])
            writer = compile_writer(s.raw, s.header)
            if writer is not None and cls is not None and _FIELDS[cls] == fields:
                self._writers[s.name] = writer
            return
        if current.fullname != s.fullname:
            raise SchemaError(
                f"cannot register {s.fullname}: its short name {s.name!r} is taken by "
                f"{current.fullname}"
            )
        _check_resolvable(s, current)
        self._by_fp[s.fingerprint] = _Writer(s.name, s.parsed, current.parsed)

    def names(self) -> list[str]:
        """The short names of all current schemas, sorted."""
        return sorted({s.name for s in self._current.values()})

    def schema(self, name: str) -> dict[str, Any]:
        """A copy of the current schema for ``name`` (short or full), as JSON data."""
        return copy.deepcopy(self._get(name).raw)

    def fingerprint(self, name: str) -> bytes:
        """The 8-byte fingerprint of the current schema for ``name``."""
        return self._get(name).fingerprint

    def _get(self, name: str) -> _Schema:
        try:
            return self._current[name]
        except KeyError:
            raise SchemaError(
                f"unknown record type {name!r}; known: {', '.join(self.names())}"
            ) from None

    # -- hot path --------------------------------------------------------------

    def encode(self, record: Record) -> bytes:
        """Single-object encode a typed record (``runstream.schemas.records``)."""
        writer = self._writers.get(record.AVRO)
        if writer is not None:
            try:
                return writer(record)
            except Exception:  # a value of the wrong type: let fastavro say which
                pass
        values = _GETTERS[type(record)](record)
        return self.encode_raw(record.AVRO, dict(zip(_FIELDS[type(record)], values, strict=True)))

    def decode(self, data: bytes | None) -> Record:
        """Decode a single-object value into its typed record.

        Raises:
            DecodeError: as `decode_raw`, or ``"unknown-type"`` for a schema with no
                record class (a registered schema this version does not model).
        """
        name, fields = self.decode_raw(data)
        cls = RECORDS.get(name)
        if cls is None:
            raise DecodeError("unknown-type", f"{name} has no record type")
        return cls(**fields)

    def encode_raw(self, name: str, record: Mapping[str, Any]) -> bytes:
        """Single-object encode ``record`` with the current schema of ``name``.

        Fields with a default may be left out; unknown fields are an error.

        Raises:
            SchemaError: unknown name, or the record does not fit the schema.
        """
        s = self._current.get(name) or self._get(name)
        buf = BytesIO()
        buf.write(s.header)
        try:
            schemaless_writer(buf, s.parsed, record, strict_allow_default=True)
        except Exception as exc:  # TypeError, ValueError, OverflowError, AttributeError...
            raise SchemaError(f"cannot encode {s.name}: {_explain(s, record, exc)}") from exc
        return buf.getvalue()

    def decode_raw(self, data: bytes | None) -> tuple[str, dict[str, Any]]:
        """Decode a single-object value into ``(short name, record)``.

        The record is read with the current schema of its name; a record written with
        an older registered schema is resolved into it.

        Raises:
            DecodeError: with ``kind`` ``"not-single-object"``, ``"truncated"``,
                ``"unknown-fingerprint"`` or ``"corrupt"``.
        """
        if not data or data[:2] != MAGIC or len(data) < _HEADER_LEN:  # None: a tombstone
            raise _bad_header(data)
        fp = data[2:_HEADER_LEN]
        w = self._by_fp.get(fp)
        if w is None:
            raise DecodeError(
                "unknown-fingerprint",
                f"no registered schema has fingerprint {fp.hex()} "
                f"(a record type or version this codec does not know)",
            )
        buf = BytesIO(data)
        buf.seek(_HEADER_LEN)
        try:
            record = schemaless_reader(buf, w.writer, w.reader)
        except Exception as exc:  # EOFError, IndexError, UnicodeDecodeError, ...
            kind = _classify(data[_HEADER_LEN:], w.writer, exc)
            what = "ends early" if kind == "truncated" else "is malformed"
            raise DecodeError(
                kind,
                f"{w.name} body {what} ({len(data) - _HEADER_LEN} bytes after the header): "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        if buf.tell() != len(data):
            raise DecodeError(
                "corrupt", f"{w.name} body has {len(data) - buf.tell()} trailing bytes"
            )
        return w.name, cast(dict[str, Any], record)


# Per record type: its field names in schema order, and one getter for all their values.
_FIELDS = {
    cls: tuple(f.name for f in dataclasses.fields(cast(Any, cls))) for cls in RECORDS.values()
}
_GETTERS = {cls: operator.attrgetter(*names) for cls, names in _FIELDS.items()}


@functools.cache
def _default_codec() -> Codec:
    return Codec()


def _bad_header(data: bytes | None) -> DecodeError:
    if not data:
        return DecodeError("not-single-object", "empty value (a tombstone?)")
    if not MAGIC.startswith(data[:2]):
        return DecodeError(
            "not-single-object",
            f"value starts with {data[:2].hex()}, not the Avro single-object marker c301",
        )
    return DecodeError("truncated", f"value has {len(data)} bytes, shorter than the 10-byte header")


def _classify(body: bytes, writer: dict[str, Any], exc: Exception) -> str:
    """Error path only: did the body end early, or is it malformed?"""
    if isinstance(exc, EOFError):
        # fastavro says "Expected N bytes, read M"; a negative N is a corrupt length.
        return "corrupt" if "Expected -" in str(exc) else "truncated"
    if isinstance(exc, IndexError):
        # The body ended inside a varint, or a union index is out of range. Zero bytes
        # complete any cut-off varint and read as empty/null values: if the padded body
        # decodes, the original was cut short.
        try:
            schemaless_reader(BytesIO(body + bytes(64)), writer, None)
        except Exception:
            return "corrupt"
        return "truncated"
    return "corrupt"


def _explain(s: _Schema, record: object, exc: Exception) -> str:
    """Error path only: a message naming the field that does not fit."""
    if not isinstance(record, Mapping):
        return f"expected a mapping of fields, got {type(record).__name__}"
    missing = [f["name"] for f in s.raw["fields"] if f["name"] not in record and "default" not in f]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    if isinstance(exc, UnicodeEncodeError):
        fields = ", ".join(str(name) for name, value in record.items() if not _utf8(value))
        return f"field(s) {fields} hold text UTF-8 cannot carry (a lone surrogate): {exc}"
    try:
        validate(record, s.parsed, raise_errors=True)
    except Exception as vexc:
        errors = getattr(vexc, "errors", None)
        if errors:
            return "; ".join(str(e) for e in errors)
    return str(exc)


def _utf8(value: object) -> bool:
    """Error path only: whether UTF-8 can carry the strings in ``value``."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, Mapping):
        return all(_utf8(k) and _utf8(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_utf8(v) for v in value)
    return True


def _check_resolvable(writer: _Schema, reader: _Schema) -> None:
    """Catch the commonest evolution mistake when a writer schema is registered."""
    written = set()
    for f in writer.raw.get("fields", []):
        written.add(f["name"])
        written.update(f.get("aliases", []))
    missing = [
        f["name"]
        for f in reader.raw.get("fields", [])
        if f["name"] not in written
        and not set(f.get("aliases", [])) & written
        and "default" not in f
    ]
    if missing:
        raise SchemaError(
            f"{writer.fullname} (fingerprint {writer.fingerprint.hex()}) cannot be read as the "
            f"current {reader.fullname}: it lacks {', '.join(missing)}, which have no default"
        )
