"""The cross-language contract for remote steps: a task worker that knows only
confluent-kafka, fastavro and the .avsc files (examples/any_language_worker) serves a
task group, alone and for a real engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import runstream
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.spec import Topics

from .kit import PARTITIONS, ROOT, ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka

WORKER = ROOT / "examples" / "any_language_worker" / "worker.py"
SCHEMAS = Path(str(resources.files("runstream.schemas")))
GROUP = "polyglot"

# Run the example with `import runstream` made impossible (also `import runstream.x`),
# to prove it needs only confluent-kafka, fastavro and the .avsc files.
_NO_RUNSTREAM = (
    "import runpy, sys; sys.modules['runstream'] = None; "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def spawn_example_worker(bootstrap: str, ns: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:  # the child keeps its own fd
        return subprocess.Popen(
            [
                *(sys.executable, "-c", _NO_RUNSTREAM, str(WORKER)),
                *("--bootstrap", bootstrap, "--namespace", ns, "--group", GROUP),
                *("--schemas", str(SCHEMAS)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM (if still running); its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def task(run_id: str, name: str, *args: Any, **fields: Any) -> bytes:
    """A StepTask as the engine writes it (attempt id and seq chosen by the test)."""
    return Codec.default().encode_raw(
        "StepTask",
        {
            "run_id": run_id,
            "seq": 3,
            "attempt": 2,
            "name": name,
            "args": json.dumps(args).encode(),
            "attempt_id": f"{run_id}/3/2/e7",
            "group": GROUP,
            **fields,
        },
    )


def produce_tasks(producer: Producer, topic: str, tasks: dict[str, bytes], commit: bool) -> None:
    """In one Kafka transaction, as the engine does; ``commit=False`` aborts it."""
    producer.begin_transaction()
    for run_id, value in tasks.items():
        producer.produce(topic, key=run_id.encode(), value=value)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)
        producer.abort_transaction(30)


def results(bootstrap: str, ns: str, kind: str = "StepResult") -> dict[str, tuple[dict, Any]]:
    """run id -> (record, message) of the ``kind`` records on the commands topic."""
    return {
        rec["run_id"]: (rec, msg)
        for name, rec, msg in read_topic(bootstrap, Topics(ns).commands)
        if name == kind
    }


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _at_least(n: int, found: dict[str, Any]) -> dict[str, Any] | None:
    return found if len(found) >= n else None


def test_the_example_worker_answers_tasks_without_runstream(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    # Started before its topic exists (as before any engine ran): it waits for it.
    log = tmp_path / "worker.log"
    proc = spawn_example_worker(kafka_bootstrap, ns, log)
    try:
        topic = Topics(ns).tasks(GROUP)
        wait_for(lambda: f"waiting for topic {topic}" in log.read_text(), what="the worker to wait")
        ensure_topics(kafka_bootstrap, ns, partitions=PARTITIONS, task_groups=[GROUP])
        producer = Producer(
            {
                **client_config(kafka_bootstrap),
                "transactional.id": f"{ns}-test-engine",
                "partitioner": "murmur2_random",
            }
        )
        producer.init_transactions(30)
        produce_tasks(producer, topic, {"aborted": task("aborted", "shout", "no")}, commit=False)
        produce_tasks(
            producer,
            topic,
            {
                "r-shout": task("r-shout", "shout", "hello"),
                "r-add": task("r-add", "add", 1, 2, 3.5),
                "r-unknown": task("r-unknown", "whisper", "psst"),
                "r-raises": task("r-raises", "shout", 42),  # int has no .upper()
            },
            commit=True,
        )
        got = wait_for(
            lambda: _at_least(4, results(kafka_bootstrap, ns)),
            timeout=60,
            what="four StepResults",
        )
        assert set(got) == {"r-shout", "r-add", "r-unknown", "r-raises"}  # never "aborted"
        for run_id, (rec, msg) in got.items():  # keyed and placed as the engine expects
            assert msg.key() == run_id.encode()
            assert msg.partition() == partition_for(run_id.encode(), PARTITIONS)
            assert (rec["seq"], rec["attempt"], rec["attempt_id"]) == (3, 2, f"{run_id}/3/2/e7")
            assert rec["worker"].endswith(f":{proc.pid}")

        shout, add, unknown, raises = (
            got[r][0] for r in ("r-shout", "r-add", "r-unknown", "r-raises")
        )
        assert (shout["ok"], json.loads(shout["output"])) == (True, "HELLO!")
        assert (add["ok"], json.loads(add["output"])) == (True, 6.5)
        assert (unknown["ok"], unknown["retryable"], unknown["output"]) == (False, False, b"null")
        assert unknown["error"].startswith(f"UnknownStep: group '{GROUP}' has no step 'whisper'")
        assert (raises["ok"], raises["retryable"]) == (False, True)
        assert raises["error"].startswith("AttributeError: ")
        assert "Traceback" in raises["traceback"]

        # A long step heartbeats; SIGTERM in the middle lets it finish, answer and commit.
        produce_tasks(
            producer,
            topic,
            {"r-nap": task("r-nap", "nap", 2.0, heartbeat_ms=400)},
            commit=True,
        )
        beat = wait_for(
            lambda: results(kafka_bootstrap, ns, "Heartbeat").get("r-nap"),
            timeout=60,
            what="a heartbeat of the nap",
        )[0]
        assert (beat["seq"], beat["attempt_id"]) == (3, "r-nap/3/2/e7")
        assert "left_s" in json.loads(beat["details"])
        assert stop(proc) == 0, log.read_text()
        nap = results(kafka_bootstrap, ns)["r-nap"][0]
        assert (nap["ok"], json.loads(nap["output"])) == (True, "slept 2.0s")
        assert nap["duration_ms"] >= 2000
    finally:
        stop(proc)

    # Every committed task's offset was committed (after its result): none comes again.
    tasks = [msg for name, _, msg in read_topic(kafka_bootstrap, topic) if name == "StepTask"]
    assert len(tasks) == 5
    consumer = Consumer({**client_config(kafka_bootstrap), "group.id": topic})
    try:
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10
        )
    finally:
        consumer.close()
    committed_at = {tp.partition: tp.offset for tp in committed}
    for msg in tasks:
        assert committed_at[msg.partition()] > msg.offset()


def test_a_workflow_completes_with_a_step_the_example_worker_serves(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    app = runstream.App(ns, kafka_bootstrap)

    @app.step(group=GROUP, name="shout", timeout="60s")
    def shout(text: str) -> str:
        raise AssertionError("a remote step runs in the task worker, never in the engine")

    @app.step(group=GROUP, name="whisper", retries=3)
    def whisper(text: str) -> str:
        raise AssertionError("a remote step runs in the task worker, never in the engine")

    @app.workflow
    async def greet(ctx: runstream.Context, name: str) -> dict:
        loud = await ctx.step(shout, f"hello {name}")
        return {"said": loud}

    @app.workflow
    async def hush(ctx: runstream.Context, text: str) -> str:
        return await ctx.step(whisper, text)

    engine = ThreadWorker(app, tmp_path / "state")
    log = tmp_path / "worker.log"
    proc = spawn_example_worker(kafka_bootstrap, ns, log)
    try:
        # the engine creates the namespace's topics, its task groups' included, as it starts
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engine's topics")
        with client:
            greeted = client.start(greet, "ada", run_id="greet-ada")
            hushed = client.start(hush, "psst", run_id="hush-psst")
            assert client.result(greeted, timeout=90) == {"said": "HELLO ADA!"}
            # A step the worker does not know fails at once, naming the group and the
            # step: the result says retryable=false, so the 3 retries are not used.
            with pytest.raises(runstream.RunFailed) as failed:
                client.result(hushed, timeout=90)
            assert f"group '{GROUP}' has no step 'whisper'" in failed.value.error
        assert stop(proc) == 0, log.read_text()
    finally:
        stop(proc)
        engine.stop()

    journal = read_topic(kafka_bootstrap, Topics(ns).journal)
    facts = [(name, rec["run_id"]) for name, rec, _ in journal if name.startswith("Step")]
    assert facts.count(("StepStarted", "greet-ada")) == 1
    assert facts.count(("StepCompleted", "greet-ada")) == 1
    assert facts.count(("StepStarted", "hush-psst")) == 1  # no retry
    assert facts.count(("StepFailed", "hush-psst")) == 1
