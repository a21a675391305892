"""Payloads larger than Kafka takes: each gets its clear outcome, checked before any
record reaches Kafka, and the instance never restarts (issue 7, defect a). With large
payloads through the blobs topic off (``blob_threshold_bytes=0``): with them on, such
payloads travel as references (test_blobs.py), and a foreign producer's record over the
limit is refused the same way."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

import runstream
from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.schemas.records import Signal, StartRun
from runstream.settings import Settings
from runstream.topics.admin import client_config

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka

TWO_MB = 2_000_000
NEAR_LIMIT = 990_000  # Kafka takes it (1 MiB); the engine's payload limit is smaller


def _raw_producer(bootstrap: str) -> Producer:
    """A producer that knows nothing of Runstream's limits (but Kafka's partitioner)."""
    return Producer(
        {
            **client_config(bootstrap),
            "partitioner": "murmur2_random",
            "message.max.bytes": 1_048_000,
        }
    )


def test_payloads_too_large_get_their_outcome_and_the_instance_carries_on(
    kafka_bootstrap, ns, tmp_path
):
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state", blob_threshold_bytes=0)
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the worker's topics")
    codec, raw = Codec.default(), _raw_producer(kafka_bootstrap)

    def produce(cmd) -> None:
        key = cmd.run_id.encode()
        raw.produce(
            f"{ns}.commands", codec.encode(cmd), key, partition=partition_for(key, PARTITIONS)
        )
        assert raw.flush(30) == 0

    try:
        with pytest.raises(runstream.PayloadTooLarge, match="StartRun"):  # never sent
            client.start("three_steps", "x" * TWO_MB, run_id="huge")
        produce(StartRun("near", "three_steps", input=payload.dumps("x" * NEAR_LIMIT)))
        with pytest.raises(runstream.RunRejected, match="oversize"):
            client.result("near", timeout=60)

        client.start("approval", None, run_id="waits")
        with pytest.raises(runstream.PayloadTooLarge, match="Signal"):
            client.signal("waits", "approve", "y" * TWO_MB)
        produce(
            Signal(
                "waits", "approve", payload=payload.dumps("y" * NEAR_LIMIT), signal_id="big-signal"
            )
        )

        client.start("big_output", TWO_MB, run_id="big-step")
        out = client.result("big-step", timeout=60)
        assert out.startswith("step failed: the step's output is 2,000,002 bytes; the limit")

        client.start("three_steps", 1, run_id="after")  # the instance carries on
        assert client.result("after", timeout=60) == 4
        client.signal("waits", "approve", "small")
        assert client.result("waits", timeout=60) == {"approved": True, "by": "small"}
    finally:
        client.close()
        worker.stop()
    assert worker.worker.stats["aborted"] == 0  # no transaction ever carried an oversize record
    letters = {
        r["run_id"]: (r["code"], r["value"]) for _, r, _ in read_topic(kafka_bootstrap, f"{ns}.dlq")
    }
    assert letters == {"near": ("oversize", None), "waits": ("oversize", None)}
    failed = [
        r
        for n, r, _ in read_topic(kafka_bootstrap, f"{ns}.journal")
        if n == "StepFailed" and r["run_id"] == "big-step"
    ]
    assert len(failed) == 1 and failed[0]["retry_at_ms"] is None  # not retried


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap, settings=Settings(blob_threshold_bytes=0))
    except runstream.RunstreamError:
        return None


class _FatChildren(runstream.interceptors.Interceptor):
    """Adds a header larger than any Kafka record to every child's start."""

    def workflow_outbound(
        self, next: runstream.interceptors.WorkflowOutbound
    ) -> runstream.interceptors.WorkflowOutbound:
        class Out(runstream.interceptors.WorkflowOutbound):
            async def child(self, input: runstream.interceptors.ChildInput) -> object:
                input.headers["fat"] = "x" * 1_100_000
                return await self.next.child(input)

        return Out(next)


def test_a_child_made_too_large_by_an_interceptors_headers_fails_without_an_abort(
    kafka_bootstrap, ns, tmp_path
):
    app = make_app(ns, kafka_bootstrap, interceptors=[_FatChildren()])
    worker = ThreadWorker(app, tmp_path / "state", blob_threshold_bytes=0)
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the worker's topics")
    try:
        client.start("parent", 1, run_id="fat-parent")
        with pytest.raises(runstream.RunFailed, match="oversize"):
            client.result("fat-parent", timeout=60)
        client.start("three_steps", 1, run_id="after")  # the instance carries on
        assert client.result("after", timeout=60) == 4
    finally:
        client.close()
        worker.stop()
    assert worker.worker.stats["aborted"] == 0  # no transaction carried the child's start
