"""The record -> PublishEvent / DeadLetter mapping of source forwarders (`sources.route`),
and `App.source`'s registration. No broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import runstream
from runstream.engine import payload
from runstream.engine.limits import Limits
from runstream.engine.partitioner import partition_for
from runstream.engine.work import LogRecord
from runstream.schemas.codec import Codec
from runstream.schemas.records import DeadLetter, Event, PublishEvent, Reason, correlation_id
from runstream.sources import Routed, route
from runstream.supervisor import EXIT_CANNOT_LOAD
from runstream.topics.spec import Topics

ROOT = Path(__file__).resolve().parents[2]
TOPICS = Topics("shop")
CODEC = Codec.default()


def _app() -> runstream.App:
    app = runstream.App("shop")
    app.source("orders", name="order.placed", key=lambda ev: ev["order"], ttl="10m")
    app.source("payments")  # keyed by the record's Kafka key, named after the topic
    return app


LIMITS = Limits()


def _route(rec: LogRecord, app: runstream.App | None = None, limits: Limits = LIMITS) -> Routed:
    source = (app or _app()).registry.sources.get(rec.topic)
    return route(rec, source, topics=TOPICS, partitions=12, limits=limits, codec=CODEC, now_ms=1000)


def _rec(topic: str, value: bytes | None, key: bytes | None = None, offset: int = 7) -> LogRecord:
    return LogRecord(topic, 2, offset, key, value, (), 5555)


def test_a_team_record_becomes_the_event_publish_would_send_at_its_entity_partition():
    routed = _route(_rec("orders", b'{"order": "o-1", "amount": 10}', key=b"whatever"))
    corr = correlation_id("order.placed", "o-1")
    assert routed.record == PublishEvent(
        corr,
        "order.placed",
        event_id="orders:2:7",
        payload=payload.dumps({"order": "o-1", "amount": 10}),
        key="o-1",
        ttl_ms=600_000,
        sent_at_ms=5555,
    )
    assert (routed.topic, routed.key) == ("shop.commands", corr.encode())
    assert routed.partition == partition_for(corr.encode(), 12)
    assert CODEC.decode(routed.value) == routed.record


def test_the_same_record_routed_twice_is_the_same_command():
    rec = _rec("orders", b'{"order": "o-1"}')
    assert _route(rec) == _route(rec)


def test_without_a_key_function_the_kafka_key_is_the_correlation_key():
    routed = _route(_rec("payments", b"[1, 2]", key=b"p-9"))
    assert isinstance(routed.record, PublishEvent)
    assert (routed.record.name, routed.record.key, routed.record.ttl_ms) == ("payments", "p-9", 0)
    assert routed.record.payload == b"[1,2]"
    assert _route(_rec("payments", b"1", key=None)).record.key == ""


def test_a_custom_decoder_gives_the_payload():
    app = runstream.App("shop")
    app.source("csv", decode=lambda raw: raw.decode().split(","), key=lambda row: row[0])
    routed = _route(_rec("csv", b"o-3,12.5"), app)
    assert isinstance(routed.record, PublishEvent)
    assert (routed.record.key, payload.loads(routed.record.payload)) == ("o-3", ["o-3", "12.5"])


def _letter(routed: Routed) -> DeadLetter:
    assert isinstance(routed.record, DeadLetter), routed.record
    assert (routed.topic, routed.partition) == ("shop.dlq", None)
    assert CODEC.decode(routed.value) == routed.record
    return routed.record


@pytest.mark.parametrize(
    ("value", "key", "code", "says"),
    [
        (b"not json", b"k", Reason.UNDECODABLE, "cannot decode it"),
        (None, b"k", Reason.UNDECODABLE, "cannot decode it"),  # a tombstone
        (b'{"amount": 1}', b"k", Reason.INVALID_INPUT, "its key function failed: KeyError"),
        (b'{"order": null}', b"k", Reason.INVALID_INPUT, "returned None"),
    ],
)
def test_a_record_that_cannot_be_decoded_or_keyed_is_dead_lettered(value, key, code, says):
    letter = _letter(_route(_rec("orders", value, key=key)))
    assert letter.code == code and says in letter.reason, letter.reason
    assert "orders [2] at offset 7" in letter.reason
    assert (letter.source_topic, letter.partition, letter.offset) == ("orders", 2, 7)
    assert (letter.key, letter.value, letter.at_ms) == (key, value, 1000)


def test_a_dead_letter_keeps_a_large_key_out_of_its_record():
    """A poison record with a huge key must not make a dead letter Kafka refuses."""
    routed = _route(_rec("orders", b"{not json", key=b"k" * 500_000))
    assert routed.key is None and _letter(routed).key is None


def test_a_kafka_key_that_is_not_text_is_dead_lettered():
    letter = _letter(_route(_rec("payments", b"1", key=b"\xff\xfe")))
    assert letter.code == Reason.UNDECODABLE and "not UTF-8" in letter.reason


def test_text_utf8_cannot_carry_is_dead_lettered():
    """A lone surrogate (a ``"\\ud83d"`` JSON escape) in the payload, or in a key."""
    letter = _letter(_route(_rec("orders", b'{"order": "a\\ud83d"}')))
    assert letter.code == Reason.UNDECODABLE and "surrogates not allowed" in letter.reason
    app = runstream.App("shop")
    app.source("odd", key=lambda ev: "a\ud83d")
    letter = _letter(_route(_rec("odd", b"1"), app))
    assert letter.code == Reason.UNENCODABLE and "lone surrogate" in letter.reason


def test_an_event_too_large_for_the_commands_is_dead_lettered_oversize():
    limits = Limits(max_record=200_000)
    big = json.dumps({"order": "o-1", "blob": "x" * limits.payload}).encode()
    letter = _letter(_route(_rec("orders", big), limits=limits))
    assert letter.code == Reason.OVERSIZE and letter.value is None, letter.reason


# -- <ns>.events -------------------------------------------------------------------


def test_an_events_json_record_is_the_event_it_describes():
    doc = {"name": "payment.settled", "key": "o-1", "payload": {"amount": 10}, "ttl": "1m"}
    routed = _route(_rec("shop.events", json.dumps(doc).encode()), runstream.App("shop"))
    corr = correlation_id("payment.settled", "o-1")
    assert routed.record == PublishEvent(
        corr,
        "payment.settled",
        event_id="shop.events:2:7",
        payload=b'{"amount":10}',
        key="o-1",
        ttl_ms=60_000,
        sent_at_ms=5555,
    )
    assert routed.partition == partition_for(corr.encode(), 12)


def test_an_events_json_record_may_name_its_event_id_and_leave_out_key_and_payload():
    doc = {"name": "tick", "event_id": "e-1", "ttl": 2.5, "key": 42}
    record = _route(_rec("shop.events", json.dumps(doc).encode())).record
    assert isinstance(record, PublishEvent)
    assert (record.event_id, record.key, record.ttl_ms) == ("e-1", "42", 2500)
    assert record.payload == b"null"


def test_an_events_record_may_be_a_single_object_publish_event():
    sent = PublishEvent(
        "anything", "tick", event_id="e-9", payload=b'{"n": 1}', key="k", ttl_ms=5, sent_at_ms=3
    )
    record = _route(_rec("shop.events", CODEC.encode(sent))).record
    assert record == PublishEvent(
        correlation_id("tick", "k"),  # keyed by its entity whatever it said
        "tick",
        event_id="e-9",
        payload=b'{"n": 1}',
        key="k",
        ttl_ms=5,
        sent_at_ms=5555,
    )


def test_an_events_record_may_be_an_avro_event_without_a_key():
    sent = Event("tick", b"[1]", event_id="e-2")
    record = _route(_rec("shop.events", CODEC.encode(sent))).record
    assert isinstance(record, PublishEvent)
    assert (record.run_id, record.key, record.event_id) == (correlation_id("tick", ""), "", "e-2")
    assert (record.payload, record.ttl_ms) == (b"[1]", 0)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"nope", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"key": "k"}', '"name" must be'),
        (b'{"name": "x", "key": [1]}', '"key" must be'),
        (b'{"name": "x", "event_id": 3}', '"event_id" must be'),
        (b'{"name": "x", "ttl": "soon"}', "not a duration"),
        (b'{"name": "x", "ttl": -1}', "must not be negative"),
    ],
)
def test_an_events_record_that_is_not_an_event_is_dead_lettered(value, says):
    letter = _letter(_route(_rec("shop.events", value)))
    assert letter.code == Reason.UNDECODABLE and says in letter.reason, letter.reason


def test_an_avro_record_of_another_type_on_events_is_dead_lettered():
    cmd = runstream.schemas.records.Cancel("r-1", False)
    letter = _letter(_route(_rec("shop.events", CODEC.encode(cmd))))
    assert letter.code == Reason.NOT_A_COMMAND, letter.reason


# -- registration ----------------------------------------------------------------


def test_a_topic_is_a_source_once_and_never_one_of_the_namespace():
    app = _app()
    with pytest.raises(ValueError, match="twice"):
        app.source("orders")
    with pytest.raises(ValueError, match=r"reads shop\.events always"):
        app.source("shop.events")
    with pytest.raises(runstream.errors.TopicError):
        app.source("no spaces")


def test_a_forwarder_whose_app_cannot_be_loaded_exits_at_once_with_its_own_code(tmp_path):
    """`runstream sources serve` under its supervisor, no broker needed: one clear line,
    exit 78, never started again."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-m", "runstream", "sources", "serve", "no_such_module_here:app"]
    done = subprocess.run(
        [*argv, "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == EXIT_CANNOT_LOAD, done.stderr
    lines = [line for line in done.stderr.splitlines() if "cannot load the App" in line]
    assert len(lines) == 1 and "No module named 'no_such_module_here'" in lines[0], done.stderr
    assert "not starting it again" in done.stderr
