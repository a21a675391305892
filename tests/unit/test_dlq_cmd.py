"""`runstream dlq`'s pure parts, and the engine counting redrives (no Kafka)."""

from __future__ import annotations

import click
import pytest

from runstream.cli.dlq_cmd import (
    Entry,
    LetterNotFound,
    describe_value,
    find,
    from_document,
    parse_id,
    selected,
    to_document,
)
from runstream.engine import payload
from runstream.engine.work import LogRecord
from runstream.engine.workflow import Registry
from runstream.errors import SchemaError
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    REDRIVE_HEADER,
    DeadLetter,
    Signal,
    StartRun,
    redrives_of,
)

from .corehelp import Core

codec = Codec.default()


def test_a_command_becomes_editable_json_and_back_to_the_same_bytes():
    start = StartRun("r1", "checkout", input=payload.dumps({"id": "x"}), tags={"a": "b"})
    value = codec.encode(start)
    doc = to_document(*codec.decode_raw(value))
    assert doc["type"] == "StartRun" and doc["input"] == {"id": "x"}
    assert from_document(doc, codec) == value
    doc["input"] = {"id": 7}
    assert codec.decode(from_document(doc, codec)) == StartRun(
        "r1", "checkout", input=b'{"id":7}', tags={"a": "b"}
    )


def test_a_payload_that_is_not_json_is_kept_byte_for_byte_as_text():
    value = codec.encode(Signal("r1", "go", payload=b"{not json \xff", signal_id="s1"))
    doc = to_document(*codec.decode_raw(value))
    assert doc["payload"] == {"$bytes": "{not json \udcff"}
    assert from_document(doc, codec) == value


def test_an_edited_record_must_be_a_command_that_fits_its_schema():
    with pytest.raises(SchemaError, match='needs "type"'):
        from_document({"type": "RunCancelled", "run_id": "r"}, codec)
    with pytest.raises(SchemaError, match="cannot encode StartRun"):
        from_document({"type": "StartRun", "run_id": "r", "input": 1}, codec)


def test_an_undecodable_original_is_described_without_raw_bytes():
    described = describe_value(b"\x00not avro \x1b[31m", codec)
    assert described is not None and described["size"] == 15
    assert described["undecodable"].startswith("not-single-object")
    assert described["preview"] == repr(b"\x00not avro \x1b[31m")  # escaped, not printed raw


def _entry(p: int, o: int, at_ms: int = 0, code: str = "invalid-input") -> Entry:
    return Entry(
        p,
        o,
        DeadLetter("input is invalid", "t.commands", partition=p, offset=9, at_ms=at_ms, code=code),
    )


def test_letters_are_named_by_partition_and_offset_or_an_unambiguous_offset():
    entries = [_entry(0, 3), _entry(1, 3), _entry(1, 4)]
    assert parse_id("1:3") == (1, 3) and parse_id("4") == (None, 4)
    assert find(entries, "1:3") is entries[1] and find(entries, "4") is entries[2]
    with pytest.raises(LetterNotFound, match=r"several partitions \(0:3, 1:3\)"):
        find(entries, "3")
    with pytest.raises(LetterNotFound, match="no dead letter at 2:3"):
        find(entries, "2:3")
    with pytest.raises(click.BadParameter):
        parse_id("x:1")


def test_selection_by_time_and_by_reason_or_code_in_any_case():
    old, new = _entry(0, 1, at_ms=1000), _entry(0, 2, at_ms=5000, code="unknown-run")
    assert [e.offset for e in (old, new) if selected(e, 2000, None)] == [2]
    assert [e.offset for e in (old, new) if selected(e, None, "UNKNOWN")] == [2]
    assert [e.offset for e in (old, new) if selected(e, None, "Invalid")] == [1, 2]


def test_a_redriven_record_that_fails_again_carries_its_count_into_the_dead_letter():
    core = Core(Registry())
    value = codec.encode(StartRun("r1", "nope", input=b"{}"))
    core.handle(LogRecord("t.commands", 0, 1, b"r1", value))
    core.handle(LogRecord("t.commands", 0, 2, b"r1", value, ((REDRIVE_HEADER, b"2"),)))
    assert [(d.code, d.redrives) for d in core.dead] == [
        ("unknown-workflow", 0),
        ("unknown-workflow", 2),
    ]
    assert redrives_of([(REDRIVE_HEADER, b"junk")]) == 0
