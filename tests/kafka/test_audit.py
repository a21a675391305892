"""The journal audit against the real broker: a clean namespace passes, a duplicated
fact or a misplaced record fails the `runstream audit` command, and a large synthetic
journal is read in one pass, each fact once (its facts/s are printed, never asserted:
speed is for `python -m benchmarks`)."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

import runstream
from runstream.audit import audit
from runstream.cli.main import cli
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.txn import evidence

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


@pytest.fixture
def finished_namespace(kafka_bootstrap, ns, tmp_path):
    """A namespace where a few workflows of each kind ran, and one waits for a signal."""
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
    try:
        for i in range(5):
            client.start("three_steps", i, run_id=f"three-{i}")
            client.start("sleepy", 0.1, run_id=f"sleepy-{i}")
        client.start("approval", None, run_id="approved")
        client.signal("approved", "approve", "ann")
        client.start("checkout", {"id": 1, "amount": -1}, run_id="compensated")
        client.start("countdown", 2, run_id="cd")
        client.start("approval", None, run_id="waiting")
        for run in ("three-4", "sleepy-4", "approved", "cd"):
            client.result(run, timeout=60)
        with pytest.raises(runstream.RunFailed):
            client.result("compensated", timeout=60)
        wait_for(lambda: client.get_run("waiting").status == "running", what="waiting run")
    finally:
        client.close()
        worker.stop()
    return ns


def test_a_clean_namespace_passes(kafka_bootstrap, finished_namespace):
    ns = finished_namespace
    report = audit(kafka_bootstrap, ns)
    assert report.ok, [str(v) for v in report.violations]
    assert report.statuses == {
        "completed": 5 + 5 + 1 + 3,  # three_steps, sleepy, approval, countdown x3
        "failed": 1,
        "suspended: open signal wait": 1,
    }
    assert report.runs == 16 and report.facts > 100 and report.facts_per_second > 0
    assert report.transactions > 0  # every journal record carries its transaction's evidence

    strict = audit(kafka_bootstrap, ns, expect_finished=True)
    assert [(v.run_id, v.message) for v in strict.violations] == [
        ("waiting", "the run has not finished (open signal wait)")
    ]

    result = CliRunner().invoke(cli, ["audit", "-n", ns, "--bootstrap", kafka_bootstrap, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["violations"] == []


def test_a_duplicate_step_completed_fails_the_audit(kafka_bootstrap, finished_namespace):
    ns = finished_namespace
    journal = read_topic(kafka_bootstrap, f"{ns}.journal")
    _, rec, msg = next(
        (n, r, m) for n, r, m in journal if n == "StepCompleted" and r["run_id"] == "three-2"
    )
    producer = Producer(client_config(kafka_bootstrap))
    # the very same bytes again, where the engine would have put them
    producer.produce(f"{ns}.journal", msg.value(), msg.key(), partition=msg.partition())
    # and a copy of another run's fact on a partition its run id does not hash to
    _, _, other = next((n, r, m) for n, r, m in journal if r["run_id"] == "sleepy-0")
    wrong = (other.partition() + 1) % PARTITIONS
    producer.produce(f"{ns}.journal", other.value(), other.key(), partition=wrong)
    assert producer.flush(10) == 0

    result = CliRunner().invoke(cli, ["audit", "-n", ns, "--bootstrap", kafka_bootstrap])
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "3 VIOLATIONS" in out
    # the copy lands after the run's end: a second StepCompleted, and a fact after the end
    line = next(line for line in out.splitlines() if "second time" in line)
    assert "'three-2'" in line and f"StepCompleted seq {rec['seq']}" in line
    assert f" @{msg.offset()}," in line
    assert "'three-2'" in next(line for line in out.splitlines() if "after the terminal" in line)
    assert f"'sleepy-0' [p{wrong} @" in out and "belong on partition" in out


def test_a_visible_transaction_the_engine_named_aborted_and_a_torn_one_fail_the_audit(
    kafka_bootstrap, finished_namespace
):
    """What KAFKA-17754 would leave: a later record of the engine's writer names a
    visible transaction aborted, and says it wrote to a partition where nothing of it is."""
    ns = finished_namespace
    journal = read_topic(kafka_bootstrap, f"{ns}.journal")
    # the writer's last transaction, and one record of it
    seq, msg = max(((int(dict(m.headers())["runstream-txn"]), m) for *_, m in journal), key=first)
    writer = dict(msg.headers())["runstream-writer"]
    other = (msg.partition() + 1) % PARTITIONS
    forged = evidence(writer.decode(), seq + 1, [msg.partition(), other], [seq])
    producer = Producer(client_config(kafka_bootstrap))
    producer.produce(
        f"{ns}.journal", msg.value(), msg.key(), partition=msg.partition(), headers=forged
    )
    assert producer.flush(10) == 0

    result = CliRunner().invoke(cli, ["audit", "-n", ns, "--bootstrap", kafka_bootstrap])
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert f"transaction {seq} of writer {writer.decode()} is visible, but" in out
    assert f"transaction {seq + 1} of writer {writer.decode()} is torn" in out
    assert f"not on [{other}] which it wrote to" in out


def first(pair: tuple[int, object]) -> int:
    return pair[0]


def _synthetic_run(codec: Codec, run_id: str, now: int) -> list[bytes]:
    """The 8 facts of a finished run: step, durable sleep, step."""
    base = {"run_id": run_id, "at_ms": now}
    step = {"name": "tests.tick", "attempt": 1}
    done = {**step, "output": b"1", "duration_ms": 1}
    return [
        codec.encode_raw(
            "RunStarted",
            {
                **base,
                "workflow": "synthetic",
                "version": "1",
                "input": b"null",
                "parent_run_id": None,
                "tags": {},
            },
        ),
        codec.encode_raw("StepStarted", {**base, **step, "seq": 1}),
        codec.encode_raw("StepCompleted", {**base, **done, "seq": 1}),
        codec.encode_raw("TimerScheduled", {**base, "seq": 2, "due_ms": now}),
        codec.encode_raw("TimerFired", {**base, "seq": 2}),
        codec.encode_raw("StepStarted", {**base, **step, "seq": 3}),
        codec.encode_raw("StepCompleted", {**base, **done, "seq": 3}),
        codec.encode_raw("RunCompleted", {**base, "output": b"null", "continued_as": None}),
    ]


def write_synthetic_journal(bootstrap: str, ns: str, runs: int, partitions: int) -> int:
    """Write ``runs`` finished runs' facts straight to ``<ns>.journal``; returns the facts."""
    ensure_topics(bootstrap, ns, partitions)
    codec, now = Codec.default(), int(time.time() * 1000)
    # idempotence keeps each partition's order through retries (the audit would see a
    # run's RunStarted land after its later facts otherwise)
    producer = Producer(
        {
            **client_config(bootstrap),
            "enable.idempotence": True,
            "linger.ms": 50,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    journal, facts = f"{ns}.journal", 0
    for i in range(runs):
        run_id = f"synthetic-{i:07d}"
        key = run_id.encode()
        p = partition_for(key, partitions)
        for value in _synthetic_run(codec, run_id, now):
            while True:
                try:
                    producer.produce(journal, value, key, partition=p)
                    break
                except BufferError:
                    producer.poll(0.1)
            facts += 1
        producer.poll(0)
    assert producer.flush(60) == 0
    return facts


@pytest.mark.slow
def test_audit_of_a_large_journal_reads_each_fact_once_and_passes(kafka_bootstrap, ns):
    """200,000 facts: the report counts each written fact once (a second pass, or a record
    read twice, would count more) and every run, all completed, with no violation."""
    runs = 25_000  # 200,000 facts
    started = time.monotonic()
    facts = write_synthetic_journal(kafka_bootstrap, ns, runs, PARTITIONS)
    written_in = time.monotonic() - started
    report = audit(kafka_bootstrap, ns, expect_finished=True)
    assert report.ok, [str(v) for v in report.violations[:5]]
    assert (report.runs, report.facts, report.statuses) == (runs, facts, {"completed": runs})
    print(
        f"\naudit: {report.facts:,} facts of {report.runs:,} runs in {report.seconds:.2f}s = "
        f"{report.facts_per_second:,.0f} facts/s (written in {written_in:.1f}s)"
    )
