"""The engine end to end on the real broker: one instance on a thread of the test."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer

import runstream
from runstream.engine import lifecycle, payload
from runstream.engine.partitioner import partition_for
from runstream.engine.reducer import apply
from runstream.engine.state import RunState
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, owns, read_topic, wait_for

pytestmark = pytest.mark.kafka


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path, monkeypatch):
    """One running engine instance, with .app, .client and .log (the step log)."""
    log = tmp_path / "steps.log"
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(log))
    app = make_app(ns, kafka_bootstrap)
    worker = ThreadWorker(app, tmp_path / "state", activation_budget=0.5)
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the worker's topics")
    yield SimpleNamespace(app=app, client=client, log=log)
    client.close()
    worker.stop()


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _at_least(n, records):
    return records if len(records) >= n else None


def _steps(log) -> Counter[str]:
    return Counter(log.read_text().splitlines()) if log.exists() else Counter()


def test_three_steps_run_once_each_and_the_journal_agrees(engine, kafka_bootstrap, ns):
    client, log = engine.client, engine.log
    run_ids = [client.start("three_steps", i, run_id=f"r{i}") for i in range(20)]
    assert [client.result(r, timeout=60) for r in run_ids] == [i + 3 for i in range(20)]
    assert sum(_steps(log).values()) == 60
    journal = read_topic(kafka_bootstrap, f"{ns}.journal")
    completed = Counter((r["run_id"], r["seq"]) for n, r, _ in journal if n == "StepCompleted")
    assert len(completed) == 60 and set(completed.values()) == {1}
    for _, rec, msg in journal:  # co-partitioned with commands, by Kafka's murmur2
        assert msg.partition() == partition_for(rec["run_id"].encode(), PARTITIONS)
    info = client.get_run("r3")
    assert (info.status, info.output, info.steps, info.workflow) == (
        "completed",
        6,
        3,
        "three_steps",
    )
    with pytest.raises(runstream.RunNotFound):
        client.get_run("no-such-run")


def test_start_is_idempotent_by_run_id(engine):
    client, log = engine.client, engine.log
    client.start("three_steps", 1, run_id="same")
    client.start("three_steps", 100, run_id="same")
    assert client.result("same", timeout=60) == 4
    assert sum(_steps(log).values()) == 3


def test_signal_sent_before_the_wait_is_buffered(engine, kafka_bootstrap, ns):
    client = engine.client
    client.signal("early", "approve", "ann")  # the run does not exist yet: dead-lettered
    client.start("nap_then_approval", 2.0, run_id="early")  # sleeps 2 s before it waits
    wait_for(lambda: _sleeping(kafka_bootstrap, ns, "early"), what="the run asleep")
    client.signal("early", "approve", "bob", signal_id="sig-1")  # before the wait: buffered
    client.signal("early", "approve", "bob-again", signal_id="sig-1")  # a retry: counted once
    assert client.result("early", timeout=60) == {"approved_by": "bob"}
    facts = [
        (n, r) for n, r, _ in read_topic(kafka_bootstrap, f"{ns}.journal") if r["run_id"] == "early"
    ]
    names = [n for n, _ in facts]
    assert names.index("SignalBuffered") < names.index("TimerFired") < names.index("SignalReceived")
    assert names.count("SignalBuffered") == 1 and "SignalAwaited" not in names
    dlq = read_topic(kafka_bootstrap, f"{ns}.dlq")
    assert [(r["code"], r["reason"]) for _, r, _ in dlq] == [
        ("unknown-run", "signal 'approve' for unknown run 'early'")
    ]


def _sleeping(bootstrap: str, ns: str, run_id: str) -> bool:
    return any(
        r["run_id"] == run_id and (r["reason"] or "").startswith("sleeping")
        for _, r, _ in read_topic(bootstrap, f"{ns}.lifecycle", timeout=2)
    )


def test_result_of_a_rejected_or_unknown_run_raises_at_once(engine, kafka_bootstrap, ns, tmp_path):
    """At once: by the first answer, with no question asked again (the client asks again
    only after 2 s without an answer, then at 6, 14, 29, 44 and 59 s). A rejected start is
    answered by its own StartRun (it asks for the run's end: no Query at all); an unknown
    run by the owner's answer to the first Query. No time is measured."""
    client = engine.client
    # An engine still joining its group (a fresh broker creates its internal topics then)
    # would leave the first question unanswered for a while: that is not what is tested.
    wait_for(lambda: len(owns(tmp_path / "state", ns, "w1")) == PARTITIONS, what="w1 to own all")
    client.start("no_such_workflow", {}, run_id="rejected")
    with pytest.raises(runstream.RunRejected, match=r"unknown-workflow.*no_such_workflow"):
        client.result("rejected", timeout=60)  # not a TimeoutError after a minute
    with pytest.raises(runstream.RunNotFound):
        client.result("never-started", timeout=60)
    queries = Counter(
        r["run_id"] for n, r, _ in read_topic(kafka_bootstrap, f"{ns}.commands") if n == "Query"
    )
    assert queries == {"never-started": 1}
    assert client.get_run("rejected").status == "rejected"


def test_workflow_code_that_loops_is_parked_and_the_others_flow(engine):
    client = engine.client
    client.start("spin", None, run_id="spinner")
    client.start("three_steps", 1, run_id="neighbour")
    assert client.result("neighbour", timeout=60) == 4
    wait_for(lambda: client.get_run("spinner").status == "parked", what="parked")
    assert "ran past its time budget" in client.get_run("spinner").reason


def test_signal_wait_times_out(engine):
    client = engine.client
    client.start("approval", 0.5, run_id="late")
    assert client.result("late", timeout=60) == {"approved": False}


def test_cancel_with_compensation_runs_them_in_reverse(engine):
    client, log = engine.client, engine.log
    client.start("checkout", {"id": 7, "amount": 10}, run_id="o7")
    wait_for(lambda: _steps(log)["charge 7"], what="charge")
    wait_for(lambda: client.get_run("o7").status == "running")
    client.cancel("o7", compensate=True, reason="customer changed mind")
    with pytest.raises(runstream.RunCancelled, match="customer changed mind"):
        client.result("o7", timeout=60)
    lines = log.read_text().splitlines()
    assert lines == ["reserve 7", "charge 7", "refund 7", "release 7"]
    client.cancel("o7")  # cancelling a finished run changes nothing
    assert client.get_run("o7").status == "cancelled"


def test_failure_compensates_and_fails_the_run(engine):
    client, log = engine.client, engine.log
    client.start("checkout", {"id": 8, "amount": -1}, run_id="o8")
    with pytest.raises(runstream.RunFailed, match="negative amount"):
        client.result("o8", timeout=60)
    assert log.read_text().splitlines() == ["reserve 8", "charge 8", "release 8"]


def test_continue_as_new_chains_runs(engine):
    client = engine.client
    client.start("countdown", 2, run_id="cd")
    assert client.result("cd", timeout=60) == "done at cd~2"
    assert client.get_run("cd~1").status == "completed"


def test_bad_input_is_dead_lettered_and_never_blocks(engine, kafka_bootstrap, ns):
    client = engine.client
    producer = Producer(client_config(kafka_bootstrap))
    codec = Codec.default()
    key = b"junk"
    producer.produce(
        f"{ns}.commands", b"\x00not avro at all", key, partition=partition_for(key, PARTITIONS)
    )
    producer.flush(10)
    client.start("no_such_workflow", {}, run_id="unknown-wf")
    client.start("checkout", {"id": "not a number"}, run_id="bad-input")
    producer.produce(
        f"{ns}.commands",
        codec.encode_raw("RunCancelled", {"run_id": "x", "at_ms": 0, "reason": ""}),
        b"x",
        partition=partition_for(b"x", PARTITIONS),
    )  # a fact is not a command
    producer.flush(10)
    client.start("three_steps", 1, run_id="after")  # the partitions keep going
    assert client.result("after", timeout=60) == 4

    dlq = wait_for(
        lambda: _at_least(4, read_topic(kafka_bootstrap, f"{ns}.dlq")), what="4 dead letters"
    )
    reasons = {r["run_id"]: r["reason"] for _, r, _ in dlq}
    assert "no workflow named 'no_such_workflow'" in reasons["unknown-wf"]
    assert "invalid" in reasons["bad-input"] and "id" in reasons["bad-input"]
    junk = next(r for _, r, _ in dlq if r["value"] == b"\x00not avro at all")
    assert "undecodable" in junk["reason"] and junk["source_topic"] == f"{ns}.commands"
    assert junk["offset"] >= 0 and junk["key"] == b"junk"
    assert any("RunCancelled is not a command" in r["reason"] for _, r, _ in dlq)
    rejected = {
        r["run_id"]
        for n, r, _ in read_topic(kafka_bootstrap, f"{ns}.lifecycle")
        if r.get("type") == "run.rejected"
    }
    assert {"unknown-wf", "bad-input"} <= rejected


def test_lifecycle_stream_tells_the_whole_story(engine, kafka_bootstrap, ns):
    """Every lifecycle event of the run, in order, is the one its journal's facts tell
    (`engine.lifecycle.event` of each fact, on the state the facts before it make), with
    nothing missing, repeated or added; and the story is the one the workflow lived."""
    client = engine.client
    client.start("sleepy", 0.2, run_id="story")
    assert client.result("story", timeout=60) == "rested"
    codec = Codec.default()

    def story(topic: str) -> list[Any]:
        return [
            codec.decode(m.value())
            for _, r, m in read_topic(kafka_bootstrap, f"{ns}.{topic}")
            if r["run_id"] == "story"
        ]

    facts, events = story("journal"), story("lifecycle")
    assert [type(f).__name__ for f in facts] == [
        "RunStarted",
        *["StepStarted", "StepCompleted", "TimerScheduled", "TimerFired"],
        *["StepStarted", "StepCompleted"] * 2,
        "RunCompleted",
    ]
    state, told = RunState("story"), []
    for fact in facts:
        apply(state, fact)
        told.append(lifecycle.event(fact, state))
    assert events == [e for e in told if e is not None]
    assert [(e.type, e.seq, e.status) for e in events] == [
        ("run.started", None, "running"),
        ("step.started", 1, "running"),
        ("step.completed", 1, "running"),
        ("run.suspended", 2, "running"),
        ("step.started", 3, "running"),
        ("step.completed", 3, "running"),
        ("step.started", 4, "running"),
        ("step.completed", 4, "running"),
        ("run.completed", None, "completed"),
    ]
    assert all(e.workflow == "sleepy" for e in events)
    assert events[-1].duration_ms >= 200 and payload.loads(events[-1].output) == "rested"
    assert [e.at_ms for e in events] == sorted(e.at_ms for e in events)


def _greeter(version: str):
    async def greet(ctx: runstream.Context) -> str:
        return f"v{version} got {await ctx.wait_for_signal('go')}"

    return greet


def test_versions_are_pinned_and_unknown_versions_park(kafka_bootstrap, ns, tmp_path):
    def app_with(*versions: str) -> runstream.App:
        app = runstream.App(ns, kafka_bootstrap)
        for v in versions:
            app.workflow(name="greet", version=v)(_greeter(v))
        return app

    state = tmp_path / "state"
    worker = ThreadWorker(app_with("1"), state)
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
    client.start("greet", None, run_id="old")
    wait_for(lambda: client.get_run("old").status == "running")
    worker.stop()

    worker = ThreadWorker(app_with("2"), state)  # a deploy that dropped version 1
    client.signal("old", "go", "hi")
    wait_for(lambda: client.get_run("old").status == "parked", what="parked")
    assert "version '1' is not registered" in client.get_run("old").reason
    worker.stop()

    worker = ThreadWorker(app_with("1", "2"), state)  # version 1 is back: the run resumes
    assert client.result("old", timeout=60) == "v1 got hi"
    client.start("greet", None, run_id="new")
    client.signal("new", "go", "yo")
    assert client.result("new", timeout=60) == "v2 got yo"
    lifecycle = read_topic(kafka_bootstrap, f"{ns}.lifecycle")
    assert any(
        r["type"] == "run.suspended" and "not registered" in (r["reason"] or "")
        for _, r, _ in lifecycle
    )
    client.close()
    worker.stop()


def _dump_projections(state: Path) -> dict[str, list]:
    from runstream.projections.store import PartitionStore

    dumps = {}
    for d in sorted(state.glob("*/*/p*")):
        store = PartitionStore(d, Codec.default(), read_only=True)
        dumps[d.name] = store.dump()
        store.close()
    return dumps


def test_rebuild_from_the_journal_gives_the_same_projection(kafka_bootstrap, ns, tmp_path):
    app = make_app(ns, kafka_bootstrap)
    state = tmp_path / "state"
    worker = ThreadWorker(app, state)
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
    for i in range(12):
        client.start("three_steps", i, run_id=f"done-{i}")
        client.start("sleepy", 3600, run_id=f"asleep-{i}")
        client.start("approval", None, run_id=f"waiting-{i}")
        client.signal(f"waiting-{i}", "other", i)  # buffered: nobody waits for it
    for i in range(12):
        client.result(f"done-{i}", timeout=60)
        wait_for(lambda i=i: client.get_run(f"asleep-{i}").steps == 1)
    worker.stop()
    before = _dump_projections(state)
    assert len(before) == PARTITIONS and sum(len(d) for d in before.values()) > 150

    shutil.rmtree(state)
    worker = ThreadWorker(app, state)
    for i in range(12):  # answered only once the run's partition is restored
        assert client.get_run(f"waiting-{i}").status == "running"
    worker.stop()
    assert _dump_projections(state) == before
    client.close()
