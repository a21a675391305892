"""Durable entities (`App.entity`) against the broker: one key's exclusive calls one at
a time with its state, shared reads that never wait, `runstream entities`, duplicate
calls, a workflow caller (and its cancel), a foreign producer's malformed call, and an
engine SIGKILLed mid-call (its app: `entity_app.py`)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

import runstream
from runstream.audit import check_run
from runstream.cli.main import cli
from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.schemas.records import StartRun, entity_lock_id, entity_workflow

from .entity_app import make_app
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


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path, monkeypatch):
    log, gate = tmp_path / "steps.log", tmp_path / "gate"
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(log))
    monkeypatch.setenv("RUNSTREAM_TEST_GATE", str(gate))
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the worker's topics")
    yield SimpleNamespace(client=client, log=log, gate=gate)
    client.close()
    worker.stop()


def _steps(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def _count(log: Path) -> Counter[str]:
    return Counter(" ".join(parts[:4]) for parts in _steps(log))


def _deposit(call: str, amount: int) -> dict:
    return {"call": call, "amount": amount}


def test_one_keys_calls_run_one_at_a_time_keep_state_and_reads_never_wait(
    engine, kafka_bootstrap, ns
):
    client, log = engine.client, engine.log
    ann = client.entity("ledger", "ann")
    first = ann.start("deposit", _deposit("c1", 10), call_id="c1")
    wait_for(lambda: _count(log)["post begin ann c1"] == 1, timeout=60, what="c1's step")
    second = ann.start("deposit", _deposit("c2", 5), call_id="c2")
    wait_for(lambda: ann.show()["queue"] == [second], timeout=60, what="c2 queued")
    assert ann.read("balance") == 0  # answered while c1 holds the key
    opts = ["-n", ns, "--bootstrap", kafka_bootstrap]
    shown = CliRunner().invoke(cli, ["entities", "show", "ledger", "ann", *opts, "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert (doc["in_progress"], doc["queue"], doc["state"]) == ([first], [second], {})
    step = "step make_app.<locals>.post"  # the step's name is its qualified name
    assert doc["waits_on"] == {first: [step]}
    plain = CliRunner().invoke(cli, ["entities", "show", "ledger", "ann", *opts])
    assert f"in progress: {first} (waits on: {step})" in plain.output, plain.output
    engine.gate.touch()
    assert client.result(second, timeout=60)["result"] == 15
    # the same call id again: the first result, the body not run again
    assert ann.call("deposit", _deposit("c1", 10), call_id="c1", timeout=60) == 10
    assert _count(log)["post end ann c1"] == 1
    with pytest.raises(runstream.RunFailed, match="no overdraft"):
        ann.call("overdraw", {}, timeout=60)  # fails: the state stays
    assert ann.read("balance") == 15
    deposit = '{"call": "c3", "amount": 1}'
    called = CliRunner().invoke(
        cli, ["entities", "call", "ledger", "ann", "deposit", deposit, *opts, "--call-id", "c3"]
    )
    assert called.exit_code == 0 and json.loads(called.output) == 16, called.output
    read = CliRunner().invoke(
        cli,
        ["entities", "read", "ledger", "ann", "balance", "-n", ns, "--bootstrap", kafka_bootstrap],
    )
    assert read.exit_code == 0 and json.loads(read.output) == 16, read.output
    assert client.entity("ledger", "bob").show()["state"] == {}  # a key never called


def test_a_workflow_calls_once_and_a_cancelled_callers_queued_call_leaves_the_queue(
    engine, kafka_bootstrap, ns
):
    client, log = engine.client, engine.log
    client.start("payer", {"key": "ann", "call": "p1", "amount": 7}, run_id="p1")
    wait_for(lambda: _count(log)["post begin ann p1"] == 1, timeout=60, what="p1's call")
    client.start("payer", {"key": "ann", "call": "p2", "amount": 100}, run_id="p2")
    ann = client.entity("ledger", "ann")
    wait_for(lambda: len(ann.show()["queue"]) == 1, timeout=60, what="p2's call queued")
    client.cancel("p2")
    with pytest.raises(runstream.RunCancelled):
        client.result("p2", timeout=60)
    wait_for(lambda: ann.show()["queue"] == [], timeout=60, what="p2's call withdrawn")
    engine.gate.touch()
    assert client.result("p1", timeout=60) == 7
    assert ann.read("balance") == 7 and ann.show()["state"]["calls"] == ["p1"]
    assert _count(log)["post end ann p1"] == 1 and _count(log)["post begin ann p2"] == 0
    assert check_run(journal_facts(kafka_bootstrap, ns, "p1")) == []


def test_a_foreign_producers_malformed_call_is_a_dead_letter_and_calls_go_on(
    engine, kafka_bootstrap, ns
):
    engine.gate.touch()
    bad = StartRun("odd-call", entity_workflow("ledger"), input=b'{"handler": "deposit"}')
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    producer.produce(f"{ns}.commands", key=b"odd-call", value=Codec.default().encode(bad))
    producer.produce(f"{ns}.commands", key=b"odd-bytes", value=b"\xc3\x01not avro")
    assert producer.flush(30) == 0
    ann = engine.client.entity("ledger", "ann")
    assert ann.call("deposit", _deposit("after", 3), timeout=60) == 3

    def dead() -> list[dict] | None:
        dlq = [rec for _, rec, _ in read_topic(kafka_bootstrap, f"{ns}.dlq")]
        return dlq if len(dlq) >= 2 else None

    reasons = {rec["code"]: rec["reason"] for rec in wait_for(dead, what="two dead letters")}
    assert "needs a text key" in reasons["invalid-input"]


def _spans(log: Path) -> dict[str, list[tuple[int, int]]]:
    """Per key, the (begin, end) times of each step body that ended, in begin order."""
    steps: list[list[str]] = _steps(log)
    spans: dict[str, list[tuple[int, int]]] = {}
    for parts in steps:
        if parts[1] == "end":
            key, call = parts[2], parts[3]
            begin = max(int(p[4]) for p in steps if p[1] == "begin" and p[2:4] == [key, call])
            spans.setdefault(key, []).append((begin, int(parts[4])))
    return {key: sorted(s) for key, s in spans.items()}


def _overlaps(log: Path) -> list[str]:
    return [
        f"{key}: {a} and {b} overlap"
        for key, spans in _spans(log).items()
        for a, b in itertools.pairwise(spans)
        if not a[1] < b[0]
    ]


def test_an_instance_leaving_while_calls_flow_finishes_each_once_never_overlapping(
    kafka_bootstrap, ns, tmp_path
):
    """Two instances, one key's lock on each partition; calls flow to every key while
    the first instance leaves (SIGTERM: a graceful handover of its keys' locks, their
    queues and the calls in flight): every call completes once, in the order its sender
    sent it, each key's state holds each deposit once, one key's bodies never overlap."""
    log, state = tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    env = {
        "RUNSTREAM_TEST_STEP_SECONDS": "0.3",
        "RUNSTREAM_LEAVE_ON_STOP": "true",  # a stopped instance's partitions move at once
    }
    app = "tests.kafka.entity_app:app"
    home: dict[int, str] = {}  # a key per partition of its lock
    for n in range(200):
        lock = entity_lock_id("ledger", f"k{n}").encode()
        home.setdefault(partition_for(lock, PARTITIONS), f"k{n}")
    keys = [home[p] for p in range(PARTITIONS)]
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=app, **env)
    w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", log, app=app, **env)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(
            lambda: owns(state, ns, "w1") and owns(state, ns, "w2"),
            timeout=60,
            what="both to own partitions",
        )
        runs = {
            (key, i): client.entity("ledger", key).start(
                "deposit", _deposit(f"{key}-{i}", 1), call_id=str(i)
            )
            for i in range(8)
            for key in keys
        }
        wait_for(lambda: len(_steps(log)) >= 8, timeout=60, what="some calls under way")
        assert terminate(w1) == 0
        outs = {k: client.result(r, timeout=120)["result"] for k, r in runs.items()}
        for key in keys:  # one sender's calls to a key run in the order it sent them
            assert [outs[(key, i)] for i in range(8)] == list(range(1, 9))
            shown = client.entity("ledger", key).show(timeout=30)
            assert shown["state"] == {"balance": 8, "calls": [f"{key}-{i}" for i in range(8)]}
        client.close()
    finally:
        for proc in (w1, w2):
            if proc.poll() is None:
                terminate(proc)
    ends = _count(log)
    assert all(ends[f"post end {k} {k}-{i}"] == 1 for k in keys for i in range(8)), ends
    assert not _overlaps(log)


def test_an_engine_killed_mid_call_finishes_every_call_once_never_overlapping(
    kafka_bootstrap, ns, tmp_path
):
    """SIGKILL while the first of four calls to one key is in its step (the others
    queued); a new process of the same instance recovers it: every call completes once,
    in order, the state holds each deposit once, and no two calls' step bodies overlap
    (from the bodies' own timestamps)."""
    log, state, gate = tmp_path / "steps.log", tmp_path / "state", tmp_path / "gate"
    state.mkdir()
    env = {"RUNSTREAM_TEST_GATE": str(gate)}
    app = "tests.kafka.entity_app:app"
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=app, **env)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        ann = client.entity("ledger", "ann")
        runs = [ann.start("deposit", _deposit(f"k{i}", 10**i), call_id=f"k{i}") for i in range(4)]
        wait_for(lambda: _count(log)["post begin ann k0"] == 1, timeout=60, what="k0's step")
        wait_for(lambda: len(ann.show(timeout=10)["queue"]) == 3, timeout=60, what="the queue")
        kill(worker)
        gate.touch()
        worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=app, **env)
        outs = [client.result(r, timeout=90)["result"] for r in runs]
        assert outs == [1, 11, 111, 1111]
        shown = ann.show(timeout=30)
        assert shown["state"] == {"balance": 1111, "calls": ["k0", "k1", "k2", "k3"]}
        assert shown["in_progress"] == shown["queue"] == []
        client.close()
    finally:
        if worker.poll() is None:
            terminate(worker)
    counts = _count(log)
    assert [counts[f"post end ann k{i}"] for i in range(4)] == [1, 1, 1, 1]
    assert not _overlaps(log)
    lock = journal_facts(kafka_bootstrap, ns, entity_lock_id("ledger", "ann"))
    granted = [f.holder for f in lock if type(f).__name__ == "PermitGranted"]
    assert granted == runs  # one grant each, in the order the calls came
    for r in runs:
        assert check_run(journal_facts(kafka_bootstrap, ns, r)) == []
    assert (
        payload.loads([f for f in lock if type(f).__name__ == "PermitReleased"][-1].value)[
            "balance"
        ]
        == 1111
    )
