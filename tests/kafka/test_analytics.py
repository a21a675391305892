"""Lifecycle events for analytics tools (issue 25.1), against the real broker: an engine
with ``lifecycle_format=json`` feeds `examples/analytics` (a plain consumer into DuckDB),
whose queries answer what the runs did; a namespace that switches from avro to json
stays readable by Runstream's own readers; ``runs export`` writes JSON lines and Parquet.
"""

from __future__ import annotations

import json
import statistics
from datetime import datetime

import duckdb
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

import runstream
from examples.analytics import lifecycle_to_duckdb as example
from examples.analytics.app import make_app
from runstream.cli.main import cli
from runstream.topics.admin import client_config, ensure_topics

from .kit import PARTITIONS, ThreadWorker, kill, spawn_worker, terminate, wait_for

pytestmark = pytest.mark.kafka

ORDERS = range(1, 9)  # 4 and 8: the card is declined; 3 and 6: a reservation is retried
REFUNDS = (1, 2)


def run_orders(client: runstream.Client, orders: range, prefix: str = "") -> None:
    """Start ``orders`` (and the refunds) and wait for each run's end."""
    for o in orders:
        client.start("checkout", o, run_id=f"{prefix}order-{o}")
    for o in REFUNDS:
        client.start("refund", o, run_id=f"{prefix}refund-{o}")
    for o in orders:
        if o % 4 == 0:
            with pytest.raises(runstream.RunFailed, match="card declined"):
                client.result(f"{prefix}order-{o}", timeout=60)
        else:
            assert client.result(f"{prefix}order-{o}", timeout=60) == f"s-{o}"
    for o in REFUNDS:
        assert client.result(f"{prefix}refund-{o}", timeout=60) == f"s--{o}"


def test_the_json_lifecycle_stream_in_duckdb_answers_status_per_hour_p95_and_failing_steps(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(
        make_app(ns, kafka_bootstrap), tmp_path / "state", lifecycle_format="json"
    )
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            run_orders(client, ORDERS)
    finally:
        worker.stop()

    rows, skipped = example.read_json_records(kafka_bootstrap, f"{ns}.lifecycle")
    assert skipped == 0 and rows
    with duckdb.connect() as db:
        example.load(db, rows)
        got = example.answers(db)

    by_status: dict[str, int] = {}
    for r in got["runs_per_status_per_hour"]:
        assert isinstance(r["hour"], datetime) and r["hour"].minute == 0
        by_status[r["status"]] = by_status.get(r["status"], 0) + r["runs"]
    assert by_status == {"completed": 6 + len(REFUNDS), "failed": 2}

    # every checkout reserves (8), 6 are charged and shipped; each refund ships once
    durations: dict[str, list[int]] = {}
    for r in rows:
        if r["type"] == "step.completed":
            durations.setdefault(r["workflow"], []).append(r["duration_ms"])
    p95 = {r["workflow"]: r for r in got["p95_step_duration_per_workflow"]}
    assert {w: r["steps"] for w, r in p95.items()} == {"checkout": 8 + 6 + 6, "refund": 2}
    for w, ds in durations.items():  # quantile_cont: linear between the closest ranks
        expected = statistics.quantiles(ds, n=20, method="inclusive")[18]
        assert p95[w]["p95_ms"] == pytest.approx(expected)
        assert p95[w]["max_ms"] == max(ds)

    top = [(r["workflow"], r["step"], r["failures"], r["runs"]) for r in got["top_failing_steps"]]
    assert top == [("checkout", "charge", 2, 2), ("checkout", "reserve", 2, 2)]
    assert "card declined" in got["top_failing_steps"][0]["last_error"]


def _value(text: str | None) -> object:
    """A Parquet JSON-text column's value (None: the run has none)."""
    return None if text is None else json.loads(text)


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_a_namespace_switched_from_avro_to_json_stays_readable_and_exports(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    for fmt, prefix in (("avro", "a-"), ("json", "j-")):  # the same namespace, then json
        worker = ThreadWorker(
            make_app(ns, kafka_bootstrap), tmp_path / "state", lifecycle_format=fmt
        )
        try:
            with runstream.Client(ns, kafka_bootstrap) as client:
                run_orders(client, range(1, 5), prefix)
        finally:
            worker.stop()
    # a foreign producer's odd bytes in each format: skipped by every reader, never a stop
    producer = Producer(client_config(kafka_bootstrap))
    for odd in (
        b'{"oops": true}',
        b'{"type": "run.started", "run_id": 7}',
        b"\x00\x00\x00\x00\x01?",
    ):
        producer.produce(f"{ns}.lifecycle", odd, b"a-order-1")
    assert producer.flush(30) == 0
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(tmp_path / "cache")]

    listed = invoke("runs", "list", *common, "--limit", "100", "--json")
    assert listed.exit_code == 0, listed.output
    runs = {r["run_id"]: r for r in json.loads(listed.stdout)["runs"]}
    ids = {f"{p}{k}" for p in ("a-", "j-") for k in ("order-1", "order-2", "order-3", "order-4")}
    ids |= {f"{p}refund-{o}" for p in ("a-", "j-") for o in REFUNDS}
    assert set(runs) == ids
    for p in ("a-", "j-"):  # both formats folded alike: output, error, steps
        assert runs[f"{p}order-3"]["status"] == "completed"
        assert runs[f"{p}order-3"]["output"] == "s-3" and runs[f"{p}order-3"]["steps"] == 3
        assert runs[f"{p}order-4"]["status"] == "failed"
        assert "card declined" in runs[f"{p}order-4"]["error"]
    shown = invoke("runs", "show", "j-order-3", *common, "--json")
    assert shown.exit_code == 0, shown.output
    assert "step.failed" in shown.stdout  # its timeline, decoded from json records

    rows, skipped = example.read_json_records(kafka_bootstrap, f"{ns}.lifecycle")
    assert {r["run_id"] for r in rows} == {i for i in ids if i.startswith("j-")}
    assert skipped > 0  # the avro records, which a JSON-only tool leaves aside

    jsonl, parquet = tmp_path / "runs.jsonl", tmp_path / "runs.parquet"
    out = invoke("runs", "export", *common, "--format", "jsonl", "--output", str(jsonl))
    assert out.exit_code == 0, out.output
    exported = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert {r["run_id"]: r for r in exported} == runs
    out = invoke("runs", "export", *common, "--format", "parquet", "--output", str(parquet))
    assert out.exit_code == 0, out.output
    with duckdb.connect() as db:
        table = db.execute(
            "SELECT run_id, status, tags, output FROM read_parquet(?) ORDER BY run_id",
            [str(parquet)],
        ).fetchall()
    assert [(run, status, tags, _value(out)) for run, status, tags, out in table] == sorted(
        (r["run_id"], r["status"], r["tags"], r["output"]) for r in runs.values()
    )
    failed = invoke("runs", "export", *common, "--status", "failed")  # to standard output
    assert failed.exit_code == 0, failed.output
    assert sorted(json.loads(x)["run_id"] for x in failed.stdout.splitlines()) == [
        "a-order-4",
        "j-order-4",
    ]


def test_a_json_lifecycle_engine_sigkilled_mid_flight_writes_each_event_once(
    kafka_bootstrap, ns, tmp_path
):
    """`runstream worker --lifecycle-format json` SIGKILLed while runs sleep and step, then
    restarted: every run's events are JSON, one start and one end each, every step
    completed once (an aborted transaction's records are never read committed)."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    state, args = tmp_path / "state", ("--lifecycle-format", "json")
    runs = [f"nap-{i}" for i in range(20)]
    first = spawn_worker(kafka_bootstrap, ns, state, "w1", args=args)
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            for run_id in runs:
                client.start("sleepy", 1.0, run_id=run_id)
            wait_for(
                lambda: client.get_run(runs[-1]).status == "running", timeout=60, what="a start"
            )
            kill(first)  # mid-flight: steps done or running, runs asleep
            second = spawn_worker(kafka_bootstrap, ns, state, "w1", args=args)
            try:
                assert {client.result(r, timeout=120) for r in runs} == {"rested"}
            finally:
                assert terminate(second) == 0
    finally:
        if first.poll() is None:
            kill(first)
    rows, skipped = example.read_json_records(kafka_bootstrap, f"{ns}.lifecycle")
    assert skipped == 0
    for run_id in runs:
        mine = [r for r in rows if r["run_id"] == run_id]
        kinds = [r["type"] for r in mine]
        assert kinds.count("run.started") == 1 and kinds.count("run.completed") == 1
        done = [r["seq"] for r in mine if r["type"] == "step.completed"]
        assert sorted(done) == sorted(set(done)) and len(done) == 3
