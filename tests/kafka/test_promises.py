"""Durable promises on the real broker: completed by the client, the CLI and a plain
producer's record; kept when they come before the await; refused the second time; and
an engine SIGKILLed between the promise's creation and its completion."""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

import runstream
from runstream.audit import check_run
from runstream.cli.main import cli

from .flows import make_app
from .kit import (
    PARTITIONS,
    ThreadWorker,
    client_or_none,
    journal_facts,
    kill,
    owns,
    read_topic,
    spawn_worker,
    terminate,
    wait_for,
)

pytestmark = pytest.mark.kafka

SCHEMAS = Path(runstream.__file__).parent / "schemas"


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path, monkeypatch):
    """One engine instance on a thread, with .client and .log (the step log)."""
    log = tmp_path / "steps.log"
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(log))
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the worker's topics")
    yield SimpleNamespace(client=client, log=log)
    client.close()
    worker.stop()


def _mailed(log: Path) -> Counter[str]:
    """The promise ids the ``mail`` step sent, with how often each was sent."""
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[2] for line in lines if line.startswith("mail "))


def _mailed_id(log: Path, run_id: str) -> str:
    """The promise id the run mailed, once its step ran."""

    def sent() -> str | None:
        return next((p for p in _mailed(log) if p.startswith(f"{run_id}/")), None)

    return wait_for(sent, timeout=60, what=f"{run_id}'s mail step")


def _dead_letters(bootstrap: str, ns: str, n: int) -> list[dict]:
    def enough() -> list[dict] | None:
        dlq = [rec for _, rec, _ in read_topic(bootstrap, f"{ns}.dlq")]
        return dlq if len(dlq) >= n else None

    return wait_for(enough, timeout=30, what=f"{n} dead letters")


def test_a_promise_resolved_or_rejected_by_the_client_completes_the_run(
    engine, kafka_bootstrap, ns
):
    client, log = engine.client, engine.log
    client.start("awaits_promise", run_id="yes")
    client.start("awaits_promise", run_id="no")
    yes, no = _mailed_id(log, "yes"), _mailed_id(log, "no")
    assert yes == "yes/promise/1" and client.get_run("yes").status == "running"

    client.resolve(yes, {"approved_by": "ann"})
    client.reject(no, "the budget is spent")
    assert client.result("yes", timeout=30) == {"value": {"approved_by": "ann"}}
    assert client.result("no", timeout=30) == {"rejected": "the budget is spent"}
    assert _mailed(log) == {yes: 1, no: 1}
    facts = journal_facts(kafka_bootstrap, ns, "yes")
    assert [type(f).__name__ for f in facts][:2] == ["RunStarted", "PromiseCreated"]
    assert check_run(facts) == []


def test_a_promise_resolved_before_the_run_reaches_it_is_kept_for_the_await(
    engine, kafka_bootstrap, ns
):
    client, log = engine.client, engine.log
    client.start("awaits_promise", True, run_id="gated")
    pid = _mailed_id(log, "gated")
    runner = CliRunner()
    out = runner.invoke(
        cli, ["promise", "resolve", pid, '{"n": 1}', "-n", ns, "--bootstrap", kafka_bootstrap]
    )
    assert out.exit_code == 0, out.output

    def kept() -> bool:
        return any(
            type(f).__name__ == "PromiseCompleted"
            for f in journal_facts(kafka_bootstrap, ns, "gated")
        )

    wait_for(kept, what="the completion to be recorded")
    assert client.get_run("gated").status == "running"  # still waiting for "go"
    client.signal("gated", "go")
    assert client.result("gated", timeout=30) == {"value": {"n": 1}}


def test_a_second_completion_is_refused_to_the_dlq_and_changes_nothing(engine, kafka_bootstrap, ns):
    client, log = engine.client, engine.log
    client.start("awaits_promise", True, run_id="twice")
    pid = _mailed_id(log, "twice")
    client.resolve(pid, "first")
    client.reject(pid, "second")  # refused: the promise completed already
    runner = CliRunner()
    common = ["-n", ns, "--bootstrap", kafka_bootstrap]
    out = runner.invoke(cli, ["promise", "reject", pid, "third", *common])
    assert out.exit_code == 0, out.output
    out = runner.invoke(cli, ["promise", "resolve", "not-a-promise", "1", *common])
    assert out.exit_code == 2 and "is not a promise id" in out.output
    dlq = _dead_letters(kafka_bootstrap, ns, 2)
    assert [d["code"] for d in dlq] == ["promise-completed", "promise-completed"]
    assert f"promise {pid!r} was resolved already" in dlq[0]["reason"]
    client.signal("twice", "go")
    assert client.result("twice", timeout=30) == {"value": "first"}
    client.resolve(pid, "after the end")
    assert _dead_letters(kafka_bootstrap, ns, 3)[2]["code"] == "promise-completed"
    facts = journal_facts(kafka_bootstrap, ns, "twice")
    assert [type(f).__name__ for f in facts].count("PromiseCompleted") == 1
    assert check_run(facts) == []


def test_a_plain_producers_record_resolves_a_promise(engine, kafka_bootstrap, ns):
    """The README's contract, with nothing but confluent-kafka, fastavro and the .avsc."""
    client, log = engine.client, engine.log
    client.start("awaits_promise", run_id="polyglot")
    pid = _mailed_id(log, "polyglot")

    schema = json.loads((SCHEMAS / "runstream.CompletePromise.avsc").read_text())
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    run_id = pid.rpartition("/promise/")[0]  # the key: the promise id up to its last /promise/
    record = {
        "run_id": run_id,
        "promise_id": pid,
        "value": json.dumps({"from": "go"}).encode(),
        "error": None,
        "sent_at_ms": int(time.time() * 1000),
    }
    schemaless_writer(buf, parse_schema(schema), record)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
        }
    )
    producer.produce(f"{ns}.commands", key=run_id.encode(), value=buf.getvalue())
    assert producer.flush(30) == 0
    assert client.result("polyglot", timeout=30) == {"value": {"from": "go"}}


def test_an_engine_killed_between_the_promise_and_its_resolve_completes_the_run_once(
    kafka_bootstrap, ns, tmp_path
):
    """SIGKILL once the promise's id is recorded and the step that mailed it has
    committed; a new process of the same instance takes over; the resolve then completes
    the run with the value, and the mail step ran once."""
    log, state = tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        client.start("awaits_promise", run_id="crash")

        def mailed_and_committed() -> bool:
            names = [type(f).__name__ for f in journal_facts(kafka_bootstrap, ns, "crash")]
            return names == ["RunStarted", "PromiseCreated", "StepStarted", "StepCompleted"]

        wait_for(mailed_and_committed, timeout=60, what="the mail step's commit")
        kill(worker)
        worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log)
        client.resolve(_mailed_id(log, "crash"), "after the crash")
        assert client.result("crash", timeout=90) == {"value": "after the crash"}
        client.close()
    finally:
        if worker.poll() is None:
            terminate(worker)
    assert _mailed(log) == {"crash/promise/1": 1}
    facts = journal_facts(kafka_bootstrap, ns, "crash")
    assert [type(f).__name__ for f in facts].count("PromiseCreated") == 1
    assert check_run(facts) == []
