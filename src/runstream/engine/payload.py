"""User payloads travel as JSON bytes inside Avro records. Never pickle."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import to_json

from runstream.engine import blobs
from runstream.errors import BlobUnavailable


def dumps(value: Any) -> bytes:
    """JSON bytes of plain values, pydantic models, dataclasses, datetimes."""
    return to_json(value)


def loads(data: bytes | None) -> Any:
    """The value of JSON bytes, or of the large payload they reference (`engine.blobs`)."""
    return None if not data else json.loads(blobs.resolve(data))


def not_json(data: bytes | None) -> str | None:
    """Why ``data`` is not a payload a workflow can read (a foreign producer's bytes), or
    None. A large payload's reference is not read here: a client wrote its JSON."""
    if not data or blobs.parse(data) is not None:
        return None
    try:
        json.loads(data)
    except ValueError as exc:
        return f"not JSON: {exc}"
    return None


def shown(data: bytes | None) -> Any:
    """The value for a person or a read model: a large payload read through the active
    store if it can be, else ``{"$blob": why}`` (never an error: a listing goes on)."""
    try:
        return loads(data)
    except BlobUnavailable as exc:
        return {"$blob": str(exc)}
