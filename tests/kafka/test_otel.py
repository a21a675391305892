"""OpenTelemetry traces through Kafka (`runstream.otel`): the demo's order saga started
under a client span (collected by the SDK's in-memory exporter in this process) runs on an
engine process and a task worker process (`otel_app.py`: each writes the spans it ends to
a file), the engine is SIGKILLed while the run waits for its approval, and another engine
instance with an empty disk finishes it. One trace holds every step, body, wait, child and
run, each under its parent, with no step span twice; a plain producer's traceparent
(a Kafka record header only) starts a trace too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from confluent_kafka import Producer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import runstream
from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.otel import run_span_id
from runstream.schemas.codec import Codec
from runstream.schemas.records import StartRun
from runstream.topics.admin import client_config

from .kit import PARTITIONS, ROOT, kill, owns, read_topic, spawn_worker, terminate, wait_for

pytestmark = pytest.mark.kafka

APP = "tests.kafka.otel_app:app"


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _task_worker(bootstrap: str, ns: str, spans: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RUNSTREAM_TEST_NS": ns,
        "RUNSTREAM_BOOTSTRAP_SERVERS": bootstrap,
        "RUNSTREAM_TEST_SPANS": str(spans),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
    }
    argv = ["tasks", "serve", APP, "--group", "payments", "--concurrency", "2"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runstream", *argv], env=env, cwd=ROOT, stdout=out, stderr=out
        )


def _waits_for_approval(bootstrap: str, ns: str, run_id: str) -> bool:
    names = [
        name
        for name, rec, _ in read_topic(bootstrap, f"{ns}.journal", timeout=10)
        if rec.get("run_id") == run_id
    ]
    return "SignalAwaited" in names


def _hex(value: str | None) -> int | None:
    return None if value is None else int(value, 16)


def _engine_spans(path: Path) -> list[dict[str, Any]]:
    """The spans the engine and task worker processes wrote: name, ids, kind, attributes,
    the process (service.name)."""
    out = []
    for line in path.read_text().splitlines():
        s = json.loads(line)
        out.append(
            {
                "name": s["name"],
                "trace": _hex(s["context"]["trace_id"]),
                "id": _hex(s["context"]["span_id"]),
                "parent": _hex(s["parent_id"]),
                "kind": s["kind"],
                "attrs": s["attributes"],
                "process": s["resource"]["attributes"]["service.name"],
            }
        )
    return out


def test_a_saga_is_one_trace_across_client_engine_task_worker_and_a_crash(
    kafka_bootstrap, ns, tmp_path
):
    spans_file = tmp_path / "spans.jsonl"
    env = {"RUNSTREAM_TEST_SPANS": str(spans_file)}
    first, second = tmp_path / "w1", tmp_path / "w2"
    first.mkdir()
    second.mkdir()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("the shop's web server")

    engine = spawn_worker(kafka_bootstrap, ns, first, "w1", app=APP, **env)
    tasks = _task_worker(kafka_bootstrap, ns, spans_file, tmp_path / "tasks.log")
    client = None
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engine's topics")
        wait_for(lambda: len(owns(first, ns, "w1")) == PARTITIONS, what="w1 to own all")
        with tracer.start_as_current_span("place order", kind=SpanKind.PRODUCER):
            client.start("checkout", {"id": "A"}, run_id="order-A", headers={"tenant": "acme"})
        wait_for(
            lambda: _waits_for_approval(kafka_bootstrap, ns, "order-A"),
            timeout=90,
            what="order-A to wait for its approval",
        )
        kill(engine)  # SIGKILL: w2, with an empty disk, rebuilds the run from the journal
        engine = spawn_worker(kafka_bootstrap, ns, second, "w2", app=APP, **env)
        client.signal("order-A", "approve", {"by": "ann"})
        result = client.result("order-A", timeout=120)
        assert result == {
            "reservation": "rsv-A",
            "payment": "pay-A",
            "parcel": "box-A",
            "by": "ann",
        }

        # A plain producer sets only the Kafka record header: the run joins that trace.
        foreign_trace, foreign_parent = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
        traceparent = f"00-{foreign_trace:032x}-{foreign_parent:016x}-01"
        start = StartRun("plain-1", "shipping", input=payload.dumps({"id": "P"}))
        producer = Producer(client_config(kafka_bootstrap))
        key = b"plain-1"
        producer.produce(
            f"{ns}.commands",
            Codec.default().encode(start),
            key,
            partition=partition_for(key, PARTITIONS),
            headers=[("traceparent", traceparent.encode())],
        )
        producer.flush(10)
        assert client.result("plain-1", timeout=60) == "box-P"
    finally:
        if client is not None:
            client.close()
        if engine.poll() is None:
            terminate(engine)
        if tasks.poll() is None:
            terminate(tasks)

    (place,) = exporter.get_finished_spans()
    trace_id, client_span = place.context.trace_id, place.context.span_id
    everything = _engine_spans(spans_file)
    spans = [s for s in everything if s["attrs"].get("workflow.run.id") != "plain-1"]
    assert {s["trace"] for s in spans} == {trace_id}  # one trace: client, engines, worker
    count = Counter(s["name"] for s in spans)
    # each step once, though w2 replayed the run's history after the crash
    assert count["step reserve_stock"] == 1
    assert count["step charge_card"] == 1
    assert count["step pack"] == 1
    assert count["reserve_stock"] == 2  # its bodies: the first attempt failed
    assert count["charge_card"] == 1 and count["pack"] == 1
    assert count["run checkout"] == 1 and count["run shipping"] == 1
    assert count["child shipping"] == 1 and count["sleep"] == 1 and count["signal approve"] == 1

    one = {s["name"]: s for s in spans}
    run = one["run checkout"]
    assert run["id"] == run_span_id("order-A") and run["parent"] == client_span
    assert run["attrs"]["workflow.name"] == "checkout"
    assert run["attrs"]["workflow.run.status"] == "completed"
    for name in ("step reserve_stock", "step charge_card", "sleep", "signal approve"):
        assert one[name]["parent"] == run["id"], name
    assert one["step pack"]["parent"] == one["run shipping"]["id"]
    assert one["run shipping"]["parent"] == one["child shipping"]["id"]
    assert one["child shipping"]["parent"] == run["id"]
    for body in ("reserve_stock", "charge_card", "pack"):
        parents = {s["parent"] for s in spans if s["name"] == body}
        assert parents == {one[f"step {body}"]["id"]}, body

    # the task record carries the step's traceparent as a Kafka header too (any consumer)
    (task,) = [m for _, _, m in read_topic(kafka_bootstrap, f"{ns}.tasks.payments")]
    task_headers = dict(task.headers())
    assert task_headers["tenant"] == b"acme"  # the client's own header, to the task worker
    traceparent = task_headers["traceparent"].decode()
    assert traceparent.split("-")[1:3] == [
        f"{trace_id:032x}",
        f"{one['step charge_card']['id']:016x}",
    ]
    # the remote body ran in the task worker, as a Kafka consumer span
    charge = one["charge_card"]
    assert charge["kind"] == "SpanKind.CONSUMER"
    assert charge["attrs"]["messaging.system"] == "kafka"
    assert charge["process"] != one["reserve_stock"]["process"]
    # the steps before the crash were emitted by w1, the end by w2 (which replayed)
    assert one["step charge_card"]["process"] != run["process"]
    replayed = [
        s
        for s in spans
        if s["name"] == "activation checkout"
        and s["attrs"]["workflow.replaying"]
        and s["process"] == run["process"]
    ]
    assert replayed
    assert len({s["process"] for s in spans}) == 3  # w1, the task worker, w2

    plain = [s for s in everything if s["attrs"].get("workflow.run.id") == "plain-1"]
    plain_run = next(s for s in plain if s["name"] == "run shipping")
    assert plain_run["trace"] == foreign_trace and plain_run["parent"] == foreign_parent
    assert {s["trace"] for s in plain} == {foreign_trace}
