"""Text UTF-8 cannot carry never takes an engine process down (issue 19, defect 2).

A foreign producer starts runs whose JSON input holds a lone surrogate escape
(``"A\\ud83d"``, a client that cut an emoji in two). Before the fix, the RunFailed that
quotes it could not be encoded, the engine died before its transaction, and the
supervisor restarted it into the same command again and again while every other run of
the instance waited."""

from __future__ import annotations

import psutil
import pytest
from confluent_kafka import Producer

import runstream
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.schemas.records import StartRun
from runstream.topics.admin import client_config

from .kit import PARTITIONS, owns, read_topic, spawn_worker, terminate, wait_for

pytestmark = pytest.mark.kafka

CUT = b'"A\\ud83d"'  # JSON of "A" and half an emoji


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _start_raw(bootstrap: str, ns: str, run_id: str, workflow: str, data: bytes) -> None:
    """A StartRun as a producer in another language writes it: input bytes as they came."""
    producer = Producer(client_config(bootstrap))
    key = run_id.encode()
    value = Codec.default().encode(StartRun(run_id, workflow, input=data))
    producer.produce(f"{ns}.commands", value, key, partition=partition_for(key, PARTITIONS))
    assert producer.flush(30) == 0


def test_lone_surrogate_input_fails_its_run_cleanly_and_the_instance_runs_on(
    kafka_bootstrap, ns, tmp_path
):
    state = tmp_path / "state"
    state.mkdir()
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1")
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        (engine,) = psutil.Process(worker.pid).children()  # the engine below the supervisor
        _start_raw(kafka_bootstrap, ns, "fails", "quotes_input", CUT)
        _start_raw(kafka_bootstrap, ns, "unrecordable", "waits_named", CUT)
        client.start("three_steps", 1, run_id="ordinary")
        assert client.result("ordinary", timeout=60) == 4
        with pytest.raises(runstream.RunFailed) as failed:
            client.result("fails", timeout=60)
        assert failed.value.error == "ValueError: cannot take A\ufffd"  # cleaned, not lost
        with pytest.raises(runstream.RunRejected, match="unencodable"):
            client.result("unrecordable", timeout=60)
        # one engine process all along: it never died, so the supervisor restarted nothing
        assert worker.poll() is None
        assert [p.pid for p in psutil.Process(worker.pid).children()] == [engine.pid]
    finally:
        if worker.poll() is None:
            terminate(worker)
    letters = [r for n, r, _ in read_topic(kafka_bootstrap, f"{ns}.dlq") if n == "DeadLetter"]
    assert [(r["run_id"], r["code"]) for r in letters] == [("unrecordable", "unencodable")]
    assert "SignalAwaited: field(s) name hold text UTF-8 cannot carry" in letters[0]["reason"]
    journal = read_topic(kafka_bootstrap, f"{ns}.journal")
    assert [n for n, r, _ in journal if r.get("run_id") == "unrecordable"] == ["RunRejected"]
