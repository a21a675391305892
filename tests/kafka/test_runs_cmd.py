"""`runstream runs ...` and `runstream versions` against the real broker.

A few runs go through a real engine (tags from `client.start` and `runstream start --tag`
must reach `runs list --tag`); 10,000 more are lifecycle records produced straight to
``<ns>.lifecycle`` with the codec, as any foreign producer of that public topic would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

import runstream
from runstream.cli import exits
from runstream.cli.main import cli
from runstream.cli.runs_cmd import model_path
from runstream.projections.runs import RunsModel
from runstream.schemas.codec import Codec
from runstream.schemas.records import LifecycleEvent
from runstream.topics.admin import client_config, ensure_topics

from .flows import make_app
from .kit import PARTITIONS, ROOT, ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka

BULK = 10_000
T0 = 1_700_000_000_000


def bulk_events() -> list[LifecycleEvent]:
    """10,000 runs: ``bulk`` or ``other`` workflow, 50 customers, every third completed."""
    out = []
    for i in range(BULK):
        run, workflow = f"bulk-{i:05}", "bulk" if i % 2 else "other"
        tags = {"customer": f"c-{i % 50}"}
        out.append(
            LifecycleEvent(
                "run.started",
                run,
                at_ms=T0 + i,
                workflow=workflow,
                version="1",
                status="running",
                tags=tags,
            )
        )
        if i % 3 == 0:
            out.append(
                LifecycleEvent(
                    "run.completed",
                    run,
                    at_ms=T0 + i + 5,
                    workflow=workflow,
                    version="1",
                    status="completed",
                )
            )
    return out


def produce(bootstrap: str, topic: str, events: list[LifecycleEvent]) -> None:
    producer = Producer({**client_config(bootstrap), "partitioner": "murmur2_random"})
    codec = Codec.default()
    for ev in events:
        while True:
            try:
                producer.produce(topic, codec.encode(ev), ev.run_id.encode())
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def invoke(*args: str, **env: str):
    return CliRunner().invoke(cli, list(args), env=env or None)


def as_json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_runs_list_finds_runs_by_status_workflow_and_tag_after_one_pass(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(tmp_path / "cache")]
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("three_steps", 1, run_id="real-1", tags={"customer": "c-9"})
            assert client.result("real-1", timeout=60) == 4
            client.start("approval", run_id="waits", tags={"team": "ops"})
            out = invoke(
                "start",
                "three_steps",
                "5",
                "--run-id",
                "real-2",
                "--tag",
                "customer=c-9",
                "--wait",
                "-n",
                ns,
                "--bootstrap",
                kafka_bootstrap,
            )
            assert out.exit_code == 0, out.output
            wait_for(lambda: client.get_run("waits").status == "running", what="run 'waits'")
    finally:
        worker.stop()
    events = bulk_events()
    produce(kafka_bootstrap, f"{ns}.lifecycle", events)
    on_topic = len(read_topic(kafka_bootstrap, f"{ns}.lifecycle", timeout=60))

    # A fresh cache: one pass over the topic, then the answer.
    page = as_json(
        invoke(
            "runs",
            "list",
            *common,
            "--status",
            "running",
            "--workflow",
            "bulk",
            "--tag",
            "customer=c-7",
            "--limit",
            "1000",
            "--json",
        )
    )
    assert page["read"] == on_topic
    expected = [f"bulk-{i:05}" for i in reversed(range(BULK)) if i % 2 and i % 3 and i % 50 == 7]
    assert [r["run_id"] for r in page["runs"]] == expected and page["count"] == len(expected)
    assert all(r["tags"] == {"customer": "c-7"} for r in page["runs"])

    # Nothing new: nothing read again.
    page = as_json(invoke("runs", "list", *common, "--tag", "customer=c-9", "--json"))
    assert page["read"] == 0
    found = {r["run_id"]: r for r in page["runs"]}
    assert {"real-1", "real-2"} <= set(found) and page["count"] == BULK // 50 + 2
    assert (found["real-1"]["status"], found["real-1"]["workflow"]) == ("completed", "three_steps")

    def count(*filters: str) -> int:
        return as_json(invoke("runs", "list", *common, *filters, "--json"))["count"]

    assert count() == BULK + 3
    assert count("--workflow", "other") == BULK // 2
    assert count("--status", "completed") == len(range(0, BULK, 3)) + 2
    assert count("--status", "completed", "--workflow", "other") == len(range(0, BULK, 6))

    # Pages continue where the previous one ended.
    first = as_json(
        invoke("runs", "list", *common, "--workflow", "other", "--limit", "3", "--json")
    )
    second = as_json(
        invoke(
            "runs",
            "list",
            *common,
            "--workflow",
            "other",
            "--limit",
            "3",
            "--after",
            first["after"],
            "--json",
        )
    )
    assert [r["run_id"] for r in first["runs"] + second["runs"]] == [
        f"bulk-{i:05}" for i in (9998, 9996, 9994, 9992, 9990, 9988)
    ]

    versions = {
        (v["workflow"], v["version"]): v
        for v in as_json(invoke("versions", *common, "--json"))["versions"]
    }
    assert versions["bulk", "1"]["open"] == len([i for i in range(1, BULK, 2) if i % 3])
    assert versions["three_steps", "1"]["open"] == 0
    assert versions["approval", "1"]["open"] == 1

    # The human table, from the environment's namespace.
    out = invoke(
        "runs", "list", *common[2:], "--tag", "team=ops", RUNSTREAM_NAMESPACE=ns, COLUMNS="200"
    )
    assert out.exit_code == 0, out.output
    assert "waits" in out.stdout and "running" in out.stdout and "1 of 1 runs" in out.stdout


def test_runs_show_and_history_tell_one_runs_story(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(tmp_path / "cache")]
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("three_steps", 10, run_id="r1", tags={"customer": "c-1"})
            assert client.result("r1", timeout=60) == 13
    finally:
        worker.stop()

    shown = as_json(invoke("runs", "show", "r1", *common, "--json"))
    run = shown["run"]
    assert (run["status"], run["workflow"], run["input"], run["output"]) == (
        "completed",
        "three_steps",
        10,
        13,
    )
    assert run["tags"] == {"customer": "c-1"} and run["steps"] == 3
    assert run["ended_at_ms"] - run["started_at_ms"] == run["duration_ms"]
    types = [e["type"] for e in shown["timeline"]]
    assert types[0] == "run.started" and types[-1] == "run.completed"
    assert types.count("step.completed") == 3
    gaps = [e["since_previous_ms"] for e in shown["timeline"]]
    assert gaps[0] == 0 and sum(gaps) == run["ended_at_ms"] - run["started_at_ms"]

    out = invoke("runs", "show", "r1", *common, COLUMNS="200")
    assert out.exit_code == 0 and "three_steps" in out.stdout and "run.completed" in out.stdout

    facts = as_json(invoke("runs", "history", "r1", *common, "--json"))["facts"]
    names = [f["type"] for f in facts]
    assert names[0] == "RunStarted" and names[-1] == "RunCompleted"
    assert names.count("StepCompleted") == 3
    assert facts[0]["input"] == 10 and facts[-1]["output"] == 13
    assert [f["output"] for f in facts if f["type"] == "StepCompleted"] == [11, 12, 13]


def test_a_run_with_a_70_kib_tag_does_not_wedge_runs_list(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(tmp_path / "cache")]
    big = "x" * (70 << 10)
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("three_steps", 1, run_id="big", tags={"note": big})
            assert client.result("big", timeout=60) == 4
            assert as_json(invoke("runs", "list", *common, "--json"))["count"] == 1
            client.start("three_steps", 2, run_id="later", tags={"note": "small"})
            assert client.result("later", timeout=60) == 5
    finally:
        worker.stop()
    page = as_json(invoke("runs", "list", *common, "--json"))
    assert [r["run_id"] for r in page["runs"]] == ["later", "big"]
    tagged = as_json(invoke("runs", "list", *common, "--tag", "note=small", "--json"))
    assert [r["run_id"] for r in tagged["runs"]] == ["later"]


def test_a_model_another_process_holds_is_read_as_last_written(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    produce(kafka_bootstrap, f"{ns}.lifecycle", bulk_events()[:4])
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(tmp_path / "cache")]
    assert as_json(invoke("runs", "list", *common, "--json"))["count"] == 3
    produce(kafka_bootstrap, f"{ns}.lifecycle", bulk_events()[4:6])
    holder = RunsModel(model_path(tmp_path / "cache", kafka_bootstrap, ns))
    try:
        out = invoke("runs", "list", *common, "--json")
        assert as_json(out)["count"] == 3 and as_json(out)["read"] == 0
        assert "another process is updating" in out.stderr
    finally:
        holder.close()
    assert as_json(invoke("runs", "list", *common, "--json"))["count"] == 4


def test_runs_errors_are_one_line_with_what_to_do(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    cases = {
        "TopicError: no topic nosuch.lifecycle": [
            "runs",
            "list",
            "-n",
            "nosuch",
            "--bootstrap",
            kafka_bootstrap,
            *cache,
        ],
        "RunNotFound: no run 'nope'": [
            "runs",
            "show",
            "nope",
            "-n",
            ns,
            "--bootstrap",
            kafka_bootstrap,
            *cache,
        ],
        "RunNotFound: no run 'nope' in": [
            "runs",
            "history",
            "nope",
            "-n",
            ns,
            "--bootstrap",
            kafka_bootstrap,
            *cache,
        ],
        "KafkaUnavailable: cannot reach Kafka at 127.0.0.1:1": [
            "runs",
            "list",
            "-n",
            ns,
            "--bootstrap",
            "127.0.0.1:1",
            *cache,
        ],
    }
    codes = {"TopicError": exits.ERROR, "RunNotFound": exits.NOT_FOUND}
    codes["KafkaUnavailable"] = exits.KAFKA_UNREACHABLE
    for start, args in cases.items():
        out = CliRunner().invoke(cli, args, env={"RUNSTREAM_CONNECT_TIMEOUT": "2"})
        assert out.exit_code == codes[start.partition(":")[0]], (args, out.output)
        assert out.output.startswith(start) and out.output.count("\n") == 1, out.output
        assert "Traceback" not in out.output


def test_runs_tail_prints_matching_lifecycle_events_as_json_lines(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RUNSTREAM_NAMESPACE": ns}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runstream",
            "runs",
            "tail",
            "--bootstrap",
            kafka_bootstrap,
            "--workflow",
            "wanted",
            "--status",
            "completed",
            "--limit",
            "3",
            "--json",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # tail begins at the topic's end once it is connected: keep producing until it has
        # seen three matching events (each round also produces two it must skip).
        n, deadline = 0, time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            n += 1
            produce(
                kafka_bootstrap,
                f"{ns}.lifecycle",
                [
                    LifecycleEvent(
                        "run.started",
                        f"w-{n}",
                        at_ms=T0 + n,
                        workflow="wanted",
                        version="1",
                        status="running",
                    ),
                    LifecycleEvent(
                        "run.completed",
                        f"u-{n}",
                        at_ms=T0 + n,
                        workflow="unwanted",
                        version="1",
                        status="completed",
                    ),
                    LifecycleEvent(
                        "run.completed",
                        f"w-{n}",
                        at_ms=T0 + n,
                        workflow="wanted",
                        version="1",
                        status="completed",
                    ),
                ],
            )
            time.sleep(0.5)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    lines = [json.loads(line) for line in stdout.decode().splitlines()]
    assert len(lines) == 3
    assert all(
        (e["type"], e["workflow"], e["status"]) == ("run.completed", "wanted", "completed")
        for e in lines
    )
    assert len({e["run_id"] for e in lines}) == 3
