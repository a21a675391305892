"""How lifecycle events look on ``<ns>.lifecycle`` (``Settings.lifecycle_format``).

The core encodes every record once, as Avro single-object (`schemas.codec`); only the
lifecycle topic is read by tools outside Runstream, so its bytes are rewritten here, at
the edge, in the format those tools read:

- ``avro``: as encoded (``C3 01`` | 8-byte fingerprint | Avro body), the default;
- ``avro-registry``: Confluent's wire format (``00`` | 4-byte schema id, big-endian |
  the same Avro body), the LifecycleEvent schema registered at start under the subject
  ``<ns>.lifecycle-value`` (TopicNameStrategy) of a Confluent-compatible registry;
- ``json``: one JSON object per record, the fields of `JSON_FIELDS` (``output`` and
  ``input`` as the JSON values they hold, not bytes).

Readers tell the formats apart by the first byte, record by record (`decode`), so a
topic written in one format and then another stays readable.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, Literal, get_args

from runstream.engine import blobs, payload
from runstream.errors import BlobUnavailable, ConfigError, DecodeError, SchemaError
from runstream.schemas.codec import MAGIC, Codec
from runstream.schemas.records import LifecycleEvent, Record

Format = Literal["avro", "json", "avro-registry"]
FORMATS: tuple[str, ...] = get_args(Format)

#: The keys of a ``json`` lifecycle record, in order; each is always present (null when it
#: does not apply to the type). The same names and meanings as the Avro schema's fields.
JSON_FIELDS = (
    "type", "run_id", "at_ms", "workflow", "version", "status", "seq", "step", "attempt",
    "duration_ms", "output", "error", "reason", "continued_as", "code", "tags", "input", "key",
)  # fmt: skip
_PAYLOADS = ("output", "input")  # bytes of JSON in the record, JSON values on the wire
#: The types whose Avro event always carries the payload: there a JSON ``null`` is the
#: value null (no input, a workflow that returned None), not a missing payload.
_CARRIED = {
    "input": frozenset({"run.started"}),
    "output": frozenset({"run.completed", "run.event_set"}),
}

CONFLUENT_MAGIC = 0
_JSON_OPEN = ord("{")

#: Writes one lifecycle event's wire bytes from the event and its single-object bytes.
Wire = Callable[[LifecycleEvent, bytes], bytes]


def to_json(ev: LifecycleEvent) -> bytes:
    """``ev`` as one compact JSON object (`JSON_FIELDS`)."""
    doc: dict[str, Any] = {}
    for name in JSON_FIELDS:
        value = getattr(ev, name)
        doc[name] = _payload_value(value) if name in _PAYLOADS else value
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _payload_value(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        ref = blobs.parse(data)
        if ref is not None:  # a large payload: its reference, as JSON (`from_json` reads it)
            return ref.marker()
        return json.loads(data)
    except (ValueError, BlobUnavailable):  # never written so by the engine: kept as text
        return data.decode(errors="replace")


def from_json(data: bytes) -> LifecycleEvent:
    """The event a ``json`` lifecycle record holds.

    Raises:
        DecodeError: ``"bad-json"`` when it is not a JSON object with the required fields.
    """
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        fields = {k: doc[k] for k in JSON_FIELDS if k in doc}  # unknown keys: newer writers
        for name in _PAYLOADS:
            value = fields.get(name)
            if value is not None or fields.get("type") in _CARRIED[name]:
                ref = None if value is None else blobs.from_marker(value)
                fields[name] = payload.dumps(value) if ref is None else ref
        fields["tags"] = fields.get("tags") or {}
        return LifecycleEvent(**fields)
    except (ValueError, TypeError) as exc:
        raise DecodeError("bad-json", f"not a JSON lifecycle event: {exc}") from exc


def decode(codec: Codec, data: bytes | None) -> Record:
    """A lifecycle record in any of the three formats, told apart by its first byte.

    A Confluent-framed body is read with the current LifecycleEvent schema (the one an
    engine of this version registers).

    Raises:
        DecodeError: as `Codec.decode`, or ``"bad-json"``.
    """
    if data and data[0] == _JSON_OPEN:
        ev = from_json(data)
        try:  # the types the schema promises (a foreign producer's JSON may say otherwise)
            codec.encode(ev)
        except SchemaError as exc:
            raise DecodeError("bad-json", f"not a lifecycle event: {exc}") from exc
        return ev
    if data and data[0] == CONFLUENT_MAGIC and len(data) >= 5:
        return codec.decode(MAGIC + codec.fingerprint("LifecycleEvent") + data[5:])
    return codec.decode(data)


def subject(topic: str) -> str:
    """The registry subject of the topic's values (Confluent's TopicNameStrategy)."""
    return f"{topic}-value"


def register(url: str, topic: str, codec: Codec, timeout: float = 10.0) -> int:
    """Register the LifecycleEvent schema for ``topic`` at the Schema Registry ``url``
    (idempotent: the same schema gets the same id) and return its id."""
    body = json.dumps({"schema": json.dumps(codec.schema("LifecycleEvent"))}).encode()
    request = urllib.request.Request(
        f"{url.rstrip('/')}/subjects/{subject(topic)}/versions",
        data=body,
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(json.load(response)["id"])
    except urllib.error.HTTPError as exc:
        with exc:  # its body holds the connection open
            said = exc.read(300).decode(errors="replace")
        raise ValueError(f"HTTP {exc.code} {said}") from None


def wire(fmt: str, schema_id: int | None = None) -> Wire | None:
    """The rewrite for ``fmt`` (None: ``avro``, the bytes as encoded)."""
    if fmt == "json":
        return lambda ev, _data: to_json(ev)
    if fmt == "avro-registry":
        if schema_id is None:
            raise ValueError("avro-registry needs the registered schema's id")
        header = bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4, "big")
        return lambda _ev, data: header + data[len(MAGIC) + 8 :]
    if fmt != "avro":
        raise ValueError(f"lifecycle_format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return None


def for_engine(fmt: str, registry_url: str | None, topic: str, codec: Codec) -> Wire | None:
    """The rewrite an engine writing ``topic`` in ``fmt`` uses; for ``avro-registry`` the
    schema is registered first.

    Raises:
        ConfigError: avro-registry without a registry URL, or a registry that refused or
            could not be reached (the engine does not start half-configured).
    """
    if fmt != "avro-registry":
        return wire(fmt)
    if not registry_url:
        raise ConfigError("lifecycle_format avro-registry needs schema_registry_url")
    try:
        return wire(fmt, register(registry_url, topic, codec))
    except (OSError, ValueError, KeyError) as exc:  # URLError and HTTPError are OSErrors
        raise ConfigError(f"cannot register the lifecycle schema at {registry_url}: {exc}") from exc
