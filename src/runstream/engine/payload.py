"""User payloads travel as JSON bytes inside Avro records. Never pickle."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import to_json

from runstream.engine import blobs


def dumps(value: Any) -> bytes:
    """JSON bytes of plain values, pydantic models, dataclasses, datetimes."""
    return to_json(value)


def loads(data: bytes | None) -> Any:
    """The value of JSON bytes, or of the large payload they reference (`engine.blobs`)."""
    return None if not data else json.loads(blobs.resolve(data))
