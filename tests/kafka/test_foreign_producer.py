"""The cross-language contract: a producer that knows only the .avsc starts a run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

import runstream
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.spec import Topics

from .kit import ThreadWorker

pytestmark = pytest.mark.kafka

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "produce_start_run.py"

# Run the example with `import runstream` made impossible, to prove it needs only
# confluent-kafka, fastavro and the .avsc file.
_NO_RUNSTREAM = (
    "import runpy, sys; sys.modules['runstream'] = None; "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _consume_one(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> Message:
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"{topic}-test-reader",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            return msg
    finally:
        consumer.close()
    raise AssertionError(f"nothing on {topic} within {timeout}s")


def test_example_script_starts_a_run_an_engine_completes(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    ensure_topics(kafka_bootstrap, ns, partitions=12)
    app = runstream.App(ns, kafka_bootstrap)

    @app.workflow
    async def order(ctx: runstream.Context, value: dict) -> dict:
        return {"took": value}

    run_id = f"order-{ns}-42"
    payload = {"order_id": 42, "items": ["book", "pen"], "note": "rush"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _NO_RUNSTREAM,
            str(SCRIPT),
            "--bootstrap",
            kafka_bootstrap,
            "--namespace",
            ns,
            "--workflow",
            "order",
            "--run-id",
            run_id,
            "--input",
            json.dumps(payload),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"started {run_id}" in proc.stdout

    msg = _consume_one(kafka_bootstrap, Topics(ns).commands, 12)
    assert msg.key() == run_id.encode()
    assert msg.partition() == partition_for(run_id.encode(), 12)
    name, record = Codec.default().decode_raw(msg.value())
    assert name == "StartRun"
    assert record["run_id"] == run_id
    assert record["workflow"] == "order"
    assert json.loads(record["input"]) == payload
    assert record["version"] is None and record["parent_run_id"] is None
    assert record["tags"] == {}
    assert abs(record["sent_at_ms"] - time.time() * 1000) < 120_000

    worker = ThreadWorker(app, tmp_path / "state", partitions=12)
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            assert client.result(run_id, timeout=60) == {"took": payload}
    finally:
        worker.stop()
