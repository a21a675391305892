"""`runstream dlq list|show|redrive` against dead letters an engine wrote on the real broker."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

import runstream
from runstream.cli import exits
from runstream.cli.main import cli
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka

# $EDITOR for `redrive --edit`: corrects the order the bad-input start carried.
FIX_ORDER = """
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["type"] == "StartRun" and doc["input"] == {"id": "not a number"}, doc
doc["input"] = {"id": 7, "amount": 12.5}
json.dump(doc, open(sys.argv[1], "w"))
"""


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path):
    """A running engine instance with .client and .cli(args) (the CLI on this namespace)."""
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the worker's topics")

    def run_cli(*args: str, env: dict[str, str] | None = None):
        common = ["-n", ns, "--bootstrap", kafka_bootstrap]
        return CliRunner().invoke(cli, ["dlq", *args, *common], env=env)

    yield SimpleNamespace(client=client, cli=run_cli)
    client.close()
    worker.stop()


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _letters(engine, n: int, *args: str) -> list[dict]:
    """`dlq list --json` once it shows ``n`` letters."""

    def listed():
        out = engine.cli("list", "--json", *args)
        assert out.exit_code == 0, out.output
        letters = json.loads(out.output)
        return letters if len(letters) >= n else None

    return wait_for(listed, what=f"{n} dead letters")


def _bad_input(kafka_bootstrap, ns, client) -> None:
    """The bad records of tests/kafka/test_engine.py's bad-input test."""
    producer = Producer(client_config(kafka_bootstrap))
    key = b"junk"
    junk = b"\x00not avro at all"
    producer.produce(f"{ns}.commands", junk, key, partition=partition_for(key, PARTITIONS))
    client.start("no_such_workflow", {}, run_id="unknown-wf")
    client.start("checkout", {"id": "not a number"}, run_id="bad-input")
    fact = Codec.default().encode_raw("RunCancelled", {"run_id": "x", "at_ms": 0, "reason": ""})
    producer.produce(f"{ns}.commands", fact, b"x", partition=partition_for(b"x", PARTITIONS))
    producer.flush(10)


def test_list_and_show_give_the_bad_input_records_with_their_reasons(engine, kafka_bootstrap, ns):
    _bad_input(kafka_bootstrap, ns, engine.client)
    letters = {letter["code"]: letter for letter in _letters(engine, 4)}
    assert set(letters) == {"undecodable", "unknown-workflow", "invalid-input", "not-a-command"}
    assert "no workflow named 'no_such_workflow'" in letters["unknown-workflow"]["reason"]
    assert letters["invalid-input"]["run_id"] == "bad-input"
    assert "RunCancelled is not a command" in letters["not-a-command"]["reason"]
    assert all(letter["source"]["topic"] == f"{ns}.commands" for letter in letters.values())
    assert all(letter["redrives"] == 0 for letter in letters.values())

    assert [x["code"] for x in _letters(engine, 1, "--reason", "INVALID")] == ["invalid-input"]
    assert len(_letters(engine, 4, "--since", "1h")) == 4
    out = engine.cli("list", "--json", "--since", "2999-01-01T00:00:00")
    assert json.loads(out.output) == []

    out = engine.cli("list")
    assert out.exit_code == 0 and out.output.splitlines()[-1] == f"4 dead letter(s) in {ns}.dlq"
    assert "bad-input" in out.output and "invalid-input" in out.output

    bad = letters["invalid-input"]
    out = engine.cli("show", bad["id"], "--json")
    shown = json.loads(out.output)
    assert shown["value"]["type"] == "StartRun"
    assert shown["value"]["input"] == {"id": "not a number"}
    assert shown["source"] == bad["source"] and shown["source"]["offset"] >= 0
    assert "invalid" in shown["reason"]

    out = engine.cli("show", bad["id"])
    assert out.exit_code == 0
    assert f"source:   {ns}.commands partition {bad['source']['partition']}" in out.output
    assert '"workflow": "checkout"' in out.output

    junk = letters["undecodable"]
    out = engine.cli("show", junk["id"], "--json")
    value = json.loads(out.output)["value"]
    assert value["size"] == 16 and value["undecodable"].startswith("not-single-object")
    assert value["preview"] == repr(b"\x00not avro at all")
    out = engine.cli("show", junk["id"])
    assert out.exit_code == 0 and "\x00" not in out.output  # bytes shown escaped

    out = engine.cli("show", "99:99")
    assert out.exit_code == exits.NOT_FOUND
    assert out.output.startswith("LetterNotFound: no dead letter at 99:99")
    assert len(out.output.strip().splitlines()) == 1


def test_redrive_edit_of_a_start_rejected_for_invalid_input_makes_a_run_that_completes(
    engine, kafka_bootstrap, ns, tmp_path
):
    client = engine.client
    client.start("checkout", {"id": "not a number"}, run_id="bad-input")
    with pytest.raises(runstream.RunRejected, match="invalid-input"):
        client.result("bad-input", timeout=60)
    (letter,) = _letters(engine, 1)

    editor = tmp_path / "fix_order.py"
    editor.write_text(FIX_ORDER)
    edit = {"EDITOR": f"{sys.executable} {editor}"}
    out = engine.cli("redrive", letter["id"], "--edit", env=edit)
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"redrove dead letter {letter['id']} to {ns}.commands")
    assert "(redrive 1, edited)" in out.output

    wait_for(lambda: client.get_run("bad-input").status == "running", what="the run started")
    client.signal("bad-input", "approve", "ann")
    assert client.result("bad-input", timeout=60) == {
        "reservation": "r-7",
        "paid": 12.5,
        "approved_by": "ann",
    }
    # The redrive is on the record: its count and the dead letter it came from.
    redriven = [
        msg
        for _, rec, msg in read_topic(kafka_bootstrap, f"{ns}.commands")
        if rec.get("run_id") == "bad-input" and msg.headers()
    ]
    assert len(redriven) == 1
    assert dict(redriven[0].headers()) == {
        "runstream-redrive": b"1",
        "runstream-redrive-of": f"{ns}.dlq:{letter['id']}".encode(),
    }
    assert len(_letters(engine, 1)) == 1  # nothing new failed


def test_a_redriven_record_that_fails_again_comes_back_with_its_redrive_count(engine):
    engine.client.start("no_such_workflow", {}, run_id="unknown-wf")
    (first,) = _letters(engine, 1)
    assert engine.cli("redrive", first["id"]).exit_code == 0
    by_redrives = {x["redrives"]: x for x in _letters(engine, 2)}
    assert set(by_redrives) == {0, 1}
    again = by_redrives[1]
    assert (again["code"], again["run_id"]) == ("unknown-workflow", "unknown-wf")

    out = engine.cli("redrive", again["id"], "--json")
    assert json.loads(out.output)[0]["redrive"] == 2
    assert {x["redrives"] for x in _letters(engine, 3)} == {0, 1, 2}
    out = engine.cli("list")
    assert out.exit_code == 0 and "REDRIVES" in out.output


def test_redrive_from_file_produces_the_record_written_there(engine, tmp_path):
    client = engine.client
    client.start("three_steps", "five", run_id="typo")
    (letter,) = _letters(engine, 1)
    assert letter["code"] == "invalid-input"
    fixed = tmp_path / "typo.json"
    doc = {"type": "StartRun", "run_id": "typo", "workflow": "three_steps", "input": 5}
    fixed.write_text(json.dumps(doc))
    out = engine.cli("redrive", letter["id"], "--from-file", str(fixed))
    assert out.exit_code == 0, out.output
    wait_for(lambda: client.get_run("typo").status == "completed", what="the run completed")
    assert client.get_run("typo").output == 8

    fixed.write_text('{"type": "StartRun"')
    out = engine.cli("redrive", letter["id"], "--from-file", str(fixed))
    assert out.exit_code == exits.ERROR and out.output.startswith("SchemaError: ")
    assert "is not JSON" in out.output
