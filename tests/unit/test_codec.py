"""The Avro contract and the single-object codec: every shipped schema, errors, evolution."""

from __future__ import annotations

import dataclasses
import json
import struct
import typing
from importlib import resources
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from runstream.errors import DecodeError, SchemaError
from runstream.schemas.codec import MAGIC, Codec, schema_fingerprint
from runstream.schemas.records import RECORDS


def _shipped_files() -> dict[str, dict[str, Any]]:
    files = resources.files("runstream.schemas")
    return {
        f.name: json.loads(f.read_text(encoding="utf-8"))
        for f in files.iterdir()
        if f.name.endswith(".avsc")
    }


ALL_FILES = _shipped_files()
# runstream.<Name>.avsc is current; runstream.<Name>.v<N>.avsc an older version of it.
SHIPPED = {n: s for n, s in ALL_FILES.items() if n.count(".") == 2}
OLDER = {n: s for n, s in ALL_FILES.items() if n.count(".") == 3}
NAMES = sorted(s["name"] for s in SHIPPED.values())

_PRIMITIVE_SAMPLES: dict[str, Any] = {
    "string": "s-1",
    "bytes": b'{"k":[1,2]}',
    "int": 7,
    "long": 1_700_000_000_123,
    "double": 2.5,
    "boolean": True,
}


def _sample(avro_type: Any) -> Any:
    """A non-default value of an Avro type (used to exercise every field)."""
    if isinstance(avro_type, str):
        return _PRIMITIVE_SAMPLES[avro_type]
    if isinstance(avro_type, list):  # optional: ["null", T]
        return _sample(next(t for t in avro_type if t != "null"))
    if avro_type["type"] == "map":
        return {"a": _sample(avro_type["values"]), "b": _sample(avro_type["values"])}
    if avro_type["type"] == "array" and avro_type["items"] == "int":
        return [_sample(avro_type["items"]), -3, 300]
    if avro_type["type"] == "array":
        return [_sample(avro_type["items"]), "", "é"]
    raise AssertionError(f"no sample for {avro_type!r}")


def full_record(schema: dict[str, Any]) -> dict[str, Any]:
    return {f["name"]: _sample(f["type"]) for f in schema["fields"]}


def minimal_record(schema: dict[str, Any]) -> dict[str, Any]:
    return {f["name"]: _sample(f["type"]) for f in schema["fields"] if "default" not in f}


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec.default()


# -- the contract --------------------------------------------------------------


def test_every_shipped_file_is_a_documented_runstream_record() -> None:
    assert len(SHIPPED) == 80
    for filename, schema in ALL_FILES.items():
        assert filename.startswith(f"runstream.{schema['name']}.")
        assert schema["namespace"] == "runstream"
        assert schema["type"] == "record"
        assert schema["doc"]
        for f in schema["fields"]:
            assert f.get("doc"), f"{filename}: field {f['name']} has no doc"
            assert "logicalType" not in json.dumps(f["type"]), "timestamps are plain longs"
            if isinstance(f["type"], list):
                assert f["type"][0] == "null" and f["default"] is None, f


# The field names the engine builds on, in order (facts start with run_id, at_ms).
_FACT = ["run_id", "at_ms"]
FIELDS = {
    "StartRun": [
        "run_id",
        "workflow",
        "input",
        "version",
        "parent_run_id",
        "tags",
        "sent_at_ms",
        "continued_from",
        "reply_to",
        "request_id",
        "timeout_ms",
        "signal",
        "signal_payload",
        "signal_id",
        "parent_seq",
        "headers",
    ],
    "Signal": ["run_id", "name", "payload", "signal_id", "sent_at_ms"],
    "Cancel": ["run_id", "compensate", "reason", "sent_at_ms", "abandon_children"],
    "PublishEvent": ["run_id", "name", "event_id", "payload", "key", "ttl_ms", "sent_at_ms"],
    "Subscribe": [
        "run_id",
        "name",
        "subscriber",
        "seq",
        "key",
        "cancel",
        "sent_at_ms",
        "event_id",
        "payload",
    ],
    "DeliverEvent": ["run_id", "seq", "name", "event_id", "payload", "sent_at_ms", "key"],
    "EventAwaited": [*_FACT, "seq", "name", "key", "timeout_at_ms"],
    "EventReceived": [*_FACT, "seq", "name", "event_id", "payload"],
    "EventTimedOut": [*_FACT, "seq", "name"],
    "EventPublished": [*_FACT, "name", "event_id", "payload", "key", "expires_at_ms"],
    "EventSubscribed": [*_FACT, "subscriber", "seq"],
    "EventMatched": [*_FACT, "subscriber", "seq", "event_id", "undone"],
    "EventBatched": [*_FACT, "workflow", "event_id", "payload", "due_ms"],
    "BatchStarted": [*_FACT, "workflow", "run"],
    "ScheduleCommand": ["run_id", "op", "workflow", "input", "cron", "tz", "sent_at_ms"],
    "ScheduleSet": [*_FACT, "name", "workflow", "input", "cron", "tz", "next_fire_ms"],
    "ScheduleFired": [*_FACT, "fire_ms", "run", "next_fire_ms"],
    "ScheduleChanged": [*_FACT, "op", "next_fire_ms"],
    "ChildResult": [
        "run_id",
        "seq",
        "child_run_id",
        "status",
        "output",
        "error",
        "sent_at_ms",
    ],
    "Retry": ["run_id", "reason", "input", "sent_at_ms", "retry_id"],
    "StepResult": [
        "run_id",
        "seq",
        "attempt",
        "ok",
        "output",
        "error",
        "traceback",
        "attempt_id",
        "retryable",
        "duration_ms",
        "worker",
    ],
    "Heartbeat": ["run_id", "seq", "attempt_id", "details", "sent_at_ms"],
    "Acquire": [
        "run_id",
        "holder",
        "seq",
        "attempt",
        "priority",
        "fairness",
        "concurrency",
        "rate",
        "burst",
        "max_queued",
        "sent_at_ms",
        "request_id",
    ],
    "Grant": ["run_id", "seq", "limit", "granted", "reason", "sent_at_ms", "request_id", "value"],
    "Release": ["run_id", "holder", "seq", "sent_at_ms", "request_id", "value"],
    "LimitSet": [*_FACT, "concurrency", "rate", "burst", "max_queued"],
    "PermitQueued": [*_FACT, "holder", "seq", "priority", "fairness", "request_id"],
    "PermitGranted": [*_FACT, "holder", "seq", "fairness", "request_id"],
    "PermitReleased": [*_FACT, "holder", "seq", "value"],
    "PermitRequested": [*_FACT, "seq", "limit", "attempt", "request_id"],
    "PermitReceived": [*_FACT, "seq", "limit", "attempt", "granted", "reason", "value"],
    "Query": ["run_id", "request_id", "reply_to", "wait"],
    "CompletePromise": ["run_id", "promise_id", "value", "error", "sent_at_ms", "read"],
    "LiveQuery": ["run_id", "request_id", "reply_to", "name", "arg", "sent_at_ms", "headers"],
    "RunStarted": [
        *_FACT,
        "workflow",
        "version",
        "input",
        "parent_run_id",
        "tags",
        "reply_to",
        "request_id",
        "deadline_ms",
        "parent_seq",
        "headers",
    ],
    "ChildStarted": [*_FACT, "seq", "name", "child_run_id", "awaited", "parent_close"],
    "ChildEnded": [*_FACT, "seq", "name", "child_run_id", "status", "output", "error"],
    "RunRejected": [*_FACT, "workflow", "code", "reason"],
    "StepStarted": [
        *_FACT,
        "seq",
        "name",
        "attempt",
        "attempt_id",
        "isolated",
        "group",
        "deadline_ms",
        "heartbeat_ms",
    ],
    "StepCompleted": [*_FACT, "seq", "name", "output", "attempt", "duration_ms"],
    "StepFailed": [*_FACT, "seq", "name", "attempt", "error", "traceback", "retry_at_ms"],
    "TimerScheduled": [*_FACT, "seq", "due_ms"],
    "TimerFired": [*_FACT, "seq"],
    "SignalAwaited": [*_FACT, "seq", "name", "timeout_at_ms"],
    "SignalBuffered": [*_FACT, "name", "payload", "signal_id"],
    "SignalReceived": [*_FACT, "seq", "name", "payload", "signal_id"],
    "SignalTimedOut": [*_FACT, "seq", "name"],
    "ValueRecorded": [*_FACT, "seq", "name", "value"],
    "PromiseCreated": [*_FACT, "seq", "promise_id", "timeout_at_ms"],
    "PromiseCompleted": [*_FACT, "seq", "value", "error", "timed_out"],
    "RunEventSet": [*_FACT, "seq", "key", "value"],
    "Update": [
        "run_id",
        "name",
        "update_id",
        "arg",
        "reply_to",
        "request_id",
        "sent_at_ms",
        "start_workflow",
        "start_input",
        "start_version",
        "start_tags",
        "start_timeout_ms",
    ],
    "UpdateAccepted": [
        *_FACT,
        "update_id",
        "name",
        "arg",
        "index",
        "anchor",
        "reply_to",
        "request_id",
    ],
    "UpdateCompleted": [*_FACT, "update_id", "output", "error", "code"],
    "UpdateReply": ["request_id", "update_id", "run_id", "stage", "output", "error", "code"],
    "StepHandedOver": [*_FACT, "seq", "name", "attempt", "ran"],
    "RunRecovered": [*_FACT, "seq", "recoveries"],
    "CompensationStarted": [*_FACT, "error", "traceback", "cancelled"],
    "RunCompleted": [*_FACT, "output", "continued_as"],
    "RunFailed": [*_FACT, "error", "traceback", "code"],
    "RunCancelled": [*_FACT, "reason"],
    "RunParked": [*_FACT, "reason"],
    "RunDead": [*_FACT, "reason"],
    "RunRetried": [*_FACT, "seqs", "reason", "deadline_ms", "retry_id"],
    "RetriedAsNew": [*_FACT, "new_run_id", "reason"],
    "LifecycleEvent": [
        "type",
        "run_id",
        "at_ms",
        "workflow",
        "version",
        "status",
        "seq",
        "step",
        "attempt",
        "duration_ms",
        "output",
        "error",
        "reason",
        "continued_as",
        "code",
        "tags",
        "input",
        "key",
    ],
    "StepTask": [
        "run_id",
        "seq",
        "attempt",
        "name",
        "args",
        "deadline_ms",
        "attempt_id",
        "group",
        "heartbeat_ms",
        "sent_at_ms",
        "headers",
    ],
    "DeadLetter": [
        "reason",
        "source_topic",
        "partition",
        "offset",
        "key",
        "value",
        "run_id",
        "at_ms",
        "code",
        "redrives",
    ],
    "RunInfo": [
        "request_id",
        "run_id",
        "found",
        "status",
        "workflow",
        "version",
        "input",
        "output",
        "error",
        "reason",
        "started_at_ms",
        "ended_at_ms",
        "steps",
        "continued_as",
        "reply_error",
        "code",
        "parent_run_id",
        "children",
    ],
    "QueryAnswer": ["request_id", "run_id", "found", "value", "error"],
    "Event": ["name", "payload", "event_id"],
    "Pause": ["run_id", "reason", "by", "sent_at_ms", "pause_id"],
    "Unpause": ["run_id", "reason", "by", "sent_at_ms", "pause_id"],
    "RunPaused": [*_FACT, "reason", "by", "pause_id"],
    "RunUnpaused": [*_FACT, "reason", "by", "pause_id"],
    "StepHeld": [*_FACT, "seq", "name", "attempt", "group"],
    "TaskHeld": [*_FACT, "holder", "seq"],
    "GroupPaused": [*_FACT, "reason", "by", "pause_id"],
    "GroupUnpaused": [*_FACT, "reason", "by", "pause_id"],
    "ReleaseTask": ["run_id", "seq", "group", "sent_at_ms"],
}


def test_field_names_are_the_contract() -> None:
    assert sorted(FIELDS) == NAMES
    for name, expected in FIELDS.items():
        schema = SHIPPED[f"runstream.{name}.avsc"]
        assert [f["name"] for f in schema["fields"]] == expected, name
        if expected[:2] == _FACT:
            types = {f["name"]: f["type"] for f in schema["fields"]}
            assert types["run_id"] == "string" and types["at_ms"] == "long", name


_AVRO_TYPES = {
    "string": str,
    "bytes": bytes,
    "int": int,
    "long": int,
    "double": float,
    "boolean": bool,
}


def _python_type(avro_type: Any) -> Any:
    if isinstance(avro_type, list):  # ["null", T]
        return _python_type(avro_type[1]) | None
    if isinstance(avro_type, dict) and avro_type["type"] == "array":  # of ints or strings
        return list[_python_type(avro_type["items"])]
    if isinstance(avro_type, dict):  # a map of strings
        return dict[str, _python_type(avro_type["values"])]
    return _AVRO_TYPES[avro_type]


def test_every_schema_has_its_typed_record_with_the_same_fields() -> None:
    hints = {name: typing.get_type_hints(cls) for name, cls in RECORDS.items()}
    assert sorted(RECORDS) == NAMES
    for name in NAMES:
        schema, cls = SHIPPED[f"runstream.{name}.avsc"], RECORDS[name]
        fields = dataclasses.fields(cls)
        assert [f.name for f in fields] == [f["name"] for f in schema["fields"]], name
        for f, avro in zip(fields, schema["fields"], strict=True):
            assert hints[name][f.name] == _python_type(avro["type"]), (name, f.name)
            has_default = not (
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            )
            assert has_default == ("default" in avro), (name, f.name)


def test_records_take_only_their_first_two_fields_by_position() -> None:
    # A field added later cannot shift the arguments of any call that builds a record.
    for name, cls in RECORDS.items():
        fields = [f.name for f in dataclasses.fields(cls)]
        assert [f.name for f in dataclasses.fields(cls) if not f.kw_only] == fields[:2], name
        assert cls.__match_args__ == tuple(fields[:2]), name


def test_start_run_fields_are_the_documented_ones() -> None:
    fields = {f["name"]: f for f in SHIPPED["runstream.StartRun.avsc"]["fields"]}
    assert list(fields) == [
        "run_id",
        "workflow",
        "input",
        "version",
        "parent_run_id",
        "tags",
        "sent_at_ms",
        "continued_from",
        "reply_to",
        "request_id",
        "timeout_ms",
        "signal",
        "signal_payload",
        "signal_id",
        "parent_seq",
        "headers",
    ]
    assert fields["input"]["type"] == "bytes"
    assert fields["tags"]["default"] == {} and fields["sent_at_ms"]["default"] == 0


def test_codec_knows_every_shipped_schema(codec: Codec) -> None:
    assert codec.names() == NAMES
    for name in NAMES:
        assert codec.schema(name) == SHIPPED[f"runstream.{name}.avsc"]
        assert codec.schema(f"runstream.{name}") == codec.schema(name)


# -- round trips and the header ------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_full_record(codec: Codec, name: str) -> None:
    record = full_record(codec.schema(name))
    assert codec.decode_raw(codec.encode_raw(name, record)) == (name, record)


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_minimal_record_fills_defaults(codec: Codec, name: str) -> None:
    schema = codec.schema(name)
    decoded_name, decoded = codec.decode_raw(codec.encode_raw(name, minimal_record(schema)))
    assert decoded_name == name
    expected = {f["name"]: f.get("default", _sample(f["type"])) for f in schema["fields"]}
    assert decoded == expected


@pytest.mark.parametrize("name", NAMES)
def test_header_is_magic_and_fingerprint_of_canonical_form(codec: Codec, name: str) -> None:
    schema = SHIPPED[f"runstream.{name}.avsc"]
    # computed here independently, as a producer in another language would
    expected_fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    data = codec.encode_raw(name, minimal_record(schema))
    assert data[:2] == MAGIC == b"\xc3\x01"
    assert data[2:10] == expected_fp == codec.fingerprint(name)
    # and the body is the plain Avro binary encoding
    body = BytesIO()
    schemaless_writer(body, parse_schema(schema), minimal_record(schema))
    assert data[10:] == body.getvalue()


def test_fingerprints_are_distinct(codec: Codec) -> None:
    assert len({codec.fingerprint(n) for n in NAMES}) == len(NAMES)


# Avro spec test vectors (apache/avro share/test/data/schema-tests.txt): signed 64-bit
# fingerprints; the wire form is their little-endian bytes.
@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ('"null"', 7195948357588979594),
        ("null", 7195948357588979594),
        ('"int"', 8247732601305521295),
        ('{"fields":[], "type":"record", "name":"foo"}', -4824392279771201922),
        ('{"fields":[], "type":"record", "name":"foo", "namespace":"x.y"}', 5916914534497305771),
        (
            '{"fields":[{"type":"boolean", "aliases":[], "name":"f1", "default":true},'
            '{"order":"descending","name":"f2","doc":"Hello","type":"int"}],'
            '"type":"record", "name":"foo"}',
            -4860222112080293046,
        ),
        ('{ "values":"string", "type":"map"}', -8732877298790414990),
        (
            '{"name":"PigValue","type":"record",'
            '"fields":[{"name":"value", "type":["null", "int", "long", "PigValue"]}]}',
            -1759257747318642341,
        ),
    ],
)
def test_fingerprint_spec_vectors(schema: str, value: int) -> None:
    assert schema_fingerprint(schema) == struct.pack("<q", value)


def test_null_fingerprint_hex() -> None:
    assert schema_fingerprint('"null"').hex() == "8a8f25cce724dd63"


# -- decode errors -------------------------------------------------------------


def _step_completed(codec: Codec) -> bytes:
    return codec.encode_raw(
        "StepCompleted",
        {
            "run_id": "run-1",
            "at_ms": 1_700_000_000_000,
            "seq": 3,
            "name": "charge",
            "output": b'{"ok":true}',
            "attempt": 1,
            "duration_ms": 12,
        },
    )


@pytest.mark.parametrize(
    "data",
    [
        None,
        b"",
        b"x",
        b'{"json": "not avro"}',
        b"\x00\x00\x00\x00\x01avro-registry",
        b"\xc3\x02" * 8,
    ],
)
def test_not_single_object(codec: Codec, data: bytes | None) -> None:
    with pytest.raises(DecodeError) as info:
        codec.decode_raw(data)
    assert info.value.kind == "not-single-object"
    assert isinstance(info.value, SchemaError)


@pytest.mark.parametrize("cut", [1, 2, 5, 9])
def test_truncated_header(codec: Codec, cut: int) -> None:
    with pytest.raises(DecodeError) as info:
        codec.decode_raw(_step_completed(codec)[:cut])
    assert info.value.kind == "truncated"
    assert "10-byte header" in str(info.value)


def test_truncated_body(codec: Codec) -> None:
    data = _step_completed(codec)
    for cut in range(10, len(data)):
        with pytest.raises(DecodeError) as info:
            codec.decode_raw(data[:cut])
        assert info.value.kind == "truncated", (cut, info.value)
        assert "StepCompleted" in str(info.value)


def test_unknown_fingerprint(codec: Codec) -> None:
    data = _step_completed(codec)
    with pytest.raises(DecodeError) as info:
        codec.decode_raw(data[:2] + b"\x01" * 8 + data[10:])
    assert info.value.kind == "unknown-fingerprint"
    assert "0101010101010101" in str(info.value)


@pytest.mark.parametrize(
    "body",
    [
        b"\x02\xff\xfe" + bytes(20),  # string that is not UTF-8
        b"\xff" * 30,  # a varint that never ends
        b"\x01" + bytes(20),  # negative string length
    ],
)
def test_corrupt_body(codec: Codec, body: bytes) -> None:
    header = MAGIC + codec.fingerprint("StepCompleted")
    with pytest.raises(DecodeError) as info:
        codec.decode_raw(header + body)
    assert info.value.kind == "corrupt"


def test_trailing_bytes_are_corrupt(codec: Codec) -> None:
    with pytest.raises(DecodeError) as info:
        codec.decode_raw(_step_completed(codec) + b"\x00")
    assert info.value.kind == "corrupt"
    assert "trailing" in str(info.value)


def test_union_index_out_of_range_is_corrupt(codec: Codec) -> None:
    record = {"run_id": "r", "at_ms": 1, "seq": 1, "name": "approve", "timeout_at_ms": None}
    data = codec.encode_raw("SignalAwaited", record)
    assert data[-1:] == b"\x00"  # the last field is ["null", "long"]: branch 0
    with pytest.raises(DecodeError) as info:
        codec.decode_raw(data[:-1] + b"\x0a")  # branch 5 does not exist
    assert info.value.kind == "corrupt"


# -- encode errors -------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"output": "not bytes"}, "output"),
        ({"seq": "three"}, "seq"),
        ({"name": None}, "name"),
        ({"unexpected": 1}, "unexpected"),
    ],
)
def test_encode_rejects_bad_record(codec: Codec, change: dict[str, Any], needle: str) -> None:
    record = {**full_record(codec.schema("StepCompleted")), **change}
    with pytest.raises(SchemaError) as info:
        codec.encode_raw("StepCompleted", record)
    message = str(info.value)
    assert "StepCompleted" in message and needle in message
    assert info.value.__cause__ is not None  # wraps fastavro's exception
    assert not isinstance(info.value, DecodeError)


def test_encode_names_missing_field(codec: Codec) -> None:
    record = full_record(codec.schema("StepCompleted"))
    del record["duration_ms"]
    with pytest.raises(SchemaError, match=r"StepCompleted.*missing field\(s\) duration_ms"):
        codec.encode_raw("StepCompleted", record)


def test_encode_rejects_non_mapping(codec: Codec) -> None:
    with pytest.raises(SchemaError, match="StartRun"):
        codec.encode_raw("StartRun", None)  # type: ignore[arg-type]


def test_encode_unknown_type(codec: Codec) -> None:
    with pytest.raises(SchemaError, match="unknown record type 'NoSuchThing'"):
        codec.encode_raw("NoSuchThing", {})
    with pytest.raises(SchemaError):
        codec.fingerprint("NoSuchThing")


# -- schema evolution ----------------------------------------------------------

START_RUN_V1 = {
    "type": "record",
    "name": "StartRun",
    "namespace": "runstream",
    "doc": "StartRun before tags and sent_at_ms existed.",
    "fields": [
        {"name": "run_id", "type": "string"},
        {"name": "workflow", "type": "string"},
        {"name": "input", "type": "bytes"},
        {"name": "version", "type": ["null", "string"], "default": None},
        {"name": "parent_run_id", "type": ["null", "string"], "default": None},
    ],
}


def _encode_v1(record: dict[str, Any]) -> bytes:
    """What an old producer writes: single-object with the v1 schema, no runstream."""
    buf = BytesIO()
    buf.write(MAGIC + schema_fingerprint(START_RUN_V1))
    schemaless_writer(buf, parse_schema(START_RUN_V1), record)
    return buf.getvalue()


def test_older_writer_schema_is_resolved_into_current() -> None:
    codec = Codec()  # a fresh one: do not change the shared default
    old = _encode_v1(
        {
            "run_id": "r-9",
            "workflow": "order",
            "input": b"{}",
            "version": "1",
            "parent_run_id": None,
        }
    )
    with pytest.raises(DecodeError) as info:
        codec.decode_raw(old)
    assert info.value.kind == "unknown-fingerprint"

    codec.register(START_RUN_V1)
    codec.register(json.dumps(START_RUN_V1))  # again, as JSON text: a no-op
    name, record = codec.decode_raw(old)
    assert name == "StartRun"
    assert record == {
        "run_id": "r-9",
        "workflow": "order",
        "input": b"{}",
        "version": "1",
        "parent_run_id": None,
        "tags": {},
        "sent_at_ms": 0,
        "continued_from": None,
        "reply_to": None,
        "request_id": "",
        "timeout_ms": None,
        "signal": None,
        "signal_payload": None,
        "signal_id": "",
        "parent_seq": None,
        "headers": {},
    }
    # the current schema stays the one used to encode
    assert codec.encode_raw("StartRun", record)[2:10] == codec.fingerprint("StartRun")
    assert codec.fingerprint("StartRun") != schema_fingerprint(START_RUN_V1)


def test_register_rejects_unresolvable_writer() -> None:
    codec = Codec()
    no_workflow = {
        **START_RUN_V1,
        "fields": [f for f in START_RUN_V1["fields"] if f["name"] != "workflow"],
    }
    with pytest.raises(SchemaError, match="lacks workflow"):
        codec.register(no_workflow)


def test_register_new_type_and_custom_codec() -> None:
    schema = {
        "type": "record",
        "name": "Ping",
        "namespace": "acme",
        "fields": [{"name": "n", "type": "int"}],
    }
    codec = Codec([schema])
    assert codec.names() == ["Ping"]
    assert codec.decode_raw(codec.encode_raw("Ping", {"n": 5})) == ("Ping", {"n": 5})
    assert codec.decode_raw(codec.encode_raw("acme.Ping", {"n": 6})) == ("Ping", {"n": 6})
    with pytest.raises(SchemaError, match="not valid JSON"):
        codec.register("{nope")
    with pytest.raises(SchemaError, match="record"):
        codec.register('"int"')


def test_default_is_cached() -> None:
    assert Codec.default() is Codec.default()


def test_schema_returns_a_copy(codec: Codec) -> None:
    codec.schema("StartRun")["fields"].clear()
    assert codec.schema("StartRun")["fields"]


@pytest.mark.parametrize("filename", sorted(OLDER))
def test_records_of_every_shipped_older_version_decode_into_todays_types(filename: str) -> None:
    """A producer (or a journal) still on a previous version keeps working: its records
    decode into today's typed record, new fields at their defaults."""
    old = OLDER[filename]
    record = minimal_record(old)
    buf = BytesIO()
    buf.write(MAGIC + schema_fingerprint(old))
    schemaless_writer(buf, parse_schema(old), record)
    decoded = Codec.default().decode(buf.getvalue())
    assert type(decoded).__name__ == old["name"]
    for name, value in record.items():
        assert getattr(decoded, name) == value
    new_fields = [
        f for f in dataclasses.fields(decoded) if f.name not in {f["name"] for f in old["fields"]}
    ]
    assert new_fields, f"{filename} is not older than the current schema"
    for f in new_fields:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        assert getattr(decoded, f.name) == default


@pytest.mark.parametrize("name", NAMES)
def test_the_compiled_writer_writes_exactly_what_fastavro_writes(codec: Codec, name: str) -> None:
    schema = SHIPPED[f"runstream.{name}.avsc"]
    cls = RECORDS[name]
    assert name in codec._writers, "every shipped schema gets a compiled writer"
    samples = [full_record(schema), {**minimal_record(schema)}]
    for f in schema["fields"]:  # optional values set and unset, maps empty and not
        if isinstance(f["type"], list):
            samples.append({**full_record(schema), f["name"]: None})
        if isinstance(f["type"], dict):
            samples.append({**full_record(schema), f["name"]: {}})
    for values in samples:
        record = cls(**values)
        fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        assert codec.encode(record) == codec.encode_raw(name, fields), values


def test_the_compiled_writer_handles_every_width_of_number() -> None:
    from runstream.schemas.writer import varint

    def fastavro_long(n: int) -> bytes:
        buf = BytesIO()
        schemaless_writer(buf, parse_schema("long"), n)
        return buf.getvalue()

    for n in (0, 1, -1, 63, 64, -64, -65, 127, 128, 2**31, -(2**31), 2**62, -(2**63), 2**63 - 1):
        assert varint(n) == fastavro_long(n), n


def test_a_value_of_the_wrong_type_still_fails_with_fastavros_explanation(codec: Codec) -> None:
    from runstream.schemas.records import StepStarted

    with pytest.raises(SchemaError, match="cannot encode StepStarted"):
        codec.encode(StepStarted("r", 0, seq="not an int", name="name", attempt=1))  # type: ignore[arg-type]
