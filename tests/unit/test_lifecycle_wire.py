"""The lifecycle topic's three formats (`topics.lifecycle_wire`): what the outbox writes in
each, and that every reader decodes any of them, record by record."""

from __future__ import annotations

import io
import json

import pytest
from fastavro import parse_schema, schemaless_reader

from runstream.engine.workflow import Registry, workflow_def
from runstream.errors import ConfigError, DecodeError
from runstream.schemas.codec import Codec
from runstream.schemas.records import LifecycleEvent
from runstream.topics import lifecycle_wire
from runstream.topics.outbox import outbox
from runstream.topics.spec import Topics

from .corehelp import Core

CODEC = Codec.default()
STARTED = LifecycleEvent(
    "run.started", "r-1", at_ms=1_700_000_000_000, workflow="orders", version="2",
    status="running", tags={"team": "a"}, input=b'{"n":1,"s":"\xc3\xa9"}',
)  # fmt: skip
FAILED = LifecycleEvent(
    "step.failed", "r-1", at_ms=1_700_000_000_500, workflow="orders", status="running",
    seq=3, step="charge", attempt=2, duration_ms=40, error="ValueError: no",
)  # fmt: skip


async def completes(ctx: object, n: int) -> int:
    return n + 1


def test_json_has_every_documented_field_payloads_as_json_values_and_round_trips():
    doc = json.loads(lifecycle_wire.to_json(STARTED))
    assert list(doc) == list(lifecycle_wire.JSON_FIELDS)
    assert doc["input"] == {"n": 1, "s": "é"} and doc["output"] is None
    assert doc["tags"] == {"team": "a"} and doc["seq"] is None
    for ev in (STARTED, FAILED):
        back = lifecycle_wire.decode(CODEC, lifecycle_wire.to_json(ev))
        assert back == ev


def test_json_null_input_and_output_round_trip_as_the_json_value_null():
    """A run started with no input and one whose code returned None carry ``null`` (the
    JSON value) in Avro: in JSON too, not a missing payload (found by the dashboard and
    ``runs tail`` over a json namespace showing no input and no output where avro did)."""
    events = [
        LifecycleEvent("run.started", "r-2", at_ms=1, workflow="w", status="running",
                       input=b"null"),
        LifecycleEvent("run.completed", "r-2", at_ms=2, workflow="w", status="completed",
                       output=b"null", duration_ms=1),
        LifecycleEvent("run.event_set", "r-2", at_ms=3, workflow="w", status="running",
                       seq=2, key="k", output=b"null"),
    ]  # fmt: skip
    for ev in [*events, FAILED]:
        assert lifecycle_wire.decode(CODEC, lifecycle_wire.to_json(ev)) == ev


def test_registry_framing_is_magic_zero_the_id_and_the_plain_avro_body():
    wire = lifecycle_wire.wire("avro-registry", 7)
    assert wire is not None
    data = wire(FAILED, CODEC.encode(FAILED))
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == 7
    # what a Confluent deserializer does: the body read with the registered schema
    schema = parse_schema(CODEC.schema("LifecycleEvent"))
    body = schemaless_reader(io.BytesIO(data[5:]), schema, None)
    assert isinstance(body, dict) and body["step"] == "charge" and body["attempt"] == 2
    assert lifecycle_wire.decode(CODEC, data) == FAILED


def test_a_topic_that_changed_format_decodes_record_by_record():
    registry = lifecycle_wire.wire("avro-registry", 1)
    assert registry is not None
    mixed = [
        CODEC.encode(STARTED),
        lifecycle_wire.to_json(FAILED),
        registry(STARTED, CODEC.encode(STARTED)),
    ]
    assert [lifecycle_wire.decode(CODEC, d) for d in mixed] == [STARTED, FAILED, STARTED]


@pytest.mark.parametrize(
    "data",
    [
        b"{",
        b"{}",
        b"[1]",
        b'{"run_id": "x"}',
        b'{"type": 1, "run_id": "x", "at_ms": 1}',
        b'{"type": "run.started", "run_id": 7, "at_ms": 1}',
        b'{"type": "run.started", "run_id": "x", "at_ms": "soon"}',
        b'{"type": "run.started", "run_id": "x", "at_ms": 1, "tags": {"a": 1}}',
    ],
)
def test_a_foreign_json_record_that_is_no_lifecycle_event_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        lifecycle_wire.decode(CODEC, data)


def test_the_outbox_rewrites_the_lifecycle_records_only():
    reg = Registry()
    reg.add_workflow(workflow_def(completes))
    b = Core(reg).start("r", "completes", 1)
    plain, _ = outbox(b, Topics("t"), CODEC, 1)
    b2 = Core(reg).start("r", "completes", 1)
    as_json, _ = outbox(b2, Topics("t"), CODEC, 1, lifecycle_wire.wire("json"))
    for a, j in zip(plain, as_json, strict=True):
        if a.topic == "t.lifecycle":
            assert j.value[:1] == b"{"
            assert lifecycle_wire.decode(CODEC, j.value) == CODEC.decode(a.value)
        else:
            assert j == a
    assert any(r.topic == "t.lifecycle" for r in plain)


def test_the_settings_refuse_an_unknown_format_and_registry_without_a_url():
    from pydantic import ValidationError

    from runstream.settings import Settings

    with pytest.raises(ValidationError):
        Settings(lifecycle_format="protobuf")
    with pytest.raises(ConfigError, match="schema_registry_url"):
        lifecycle_wire.for_engine("avro-registry", None, "t.lifecycle", CODEC)
    with pytest.raises(ConfigError, match="cannot register"):  # nothing listens on port 1
        lifecycle_wire.for_engine("avro-registry", "http://127.0.0.1:1", "t.lifecycle", CODEC)
    assert lifecycle_wire.for_engine("avro", None, "t.lifecycle", CODEC) is None
