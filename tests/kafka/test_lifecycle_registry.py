"""``lifecycle_format=avro-registry`` against a real Confluent-compatible Schema Registry
(Apicurio Registry on loopback, `tests/registry`): the engine registers the schema at
start, and confluent-kafka's own `AvroDeserializer` reads the lifecycle topic, as Kafka
Connect, Flink or ksqlDB would."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import runstream
from examples.analytics.app import make_app
from runstream import Settings, Worker
from runstream.cli.main import cli
from runstream.errors import ConfigError
from runstream.schemas.codec import Codec
from runstream.topics import lifecycle_wire
from runstream.topics.admin import client_config, ensure_topics
from tests.registry.registry import running

from .kit import PARTITIONS, ThreadWorker
from .test_analytics import REFUNDS, run_orders

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(tmp_path_factory.mktemp("registry") / "registry.log") as url:
        yield url


def values(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed value of ``topic``, partition by partition."""
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": "registry-test",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        pending, out = set(parts), []
        while pending:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                pending.discard(msg.partition())
                continue
            out.append(msg.value())
        return out
    finally:
        consumer.close()


def test_confluents_avro_deserializer_reads_the_lifecycle_topic_of_an_avro_registry_namespace(
    kafka_bootstrap, ns, tmp_path, schema_registry
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    for prefix in ("1-", "2-"):  # a restarted engine registers again: the same schema id
        worker = ThreadWorker(
            make_app(ns, kafka_bootstrap),
            tmp_path / "state",
            lifecycle_format="avro-registry",
            schema_registry_url=schema_registry,
        )
        try:
            with runstream.Client(ns, kafka_bootstrap) as client:
                run_orders(client, range(1, 5), prefix)
        finally:
            worker.stop()

    topic = f"{ns}.lifecycle"
    raw = values(kafka_bootstrap, topic)
    codec = Codec.default()
    events = []
    with SchemaRegistryClient({"url": schema_registry}) as registry:
        registered = registry.get_latest_version(f"{topic}-value")
        assert json.loads(registered.schema.schema_str)["name"] == "LifecycleEvent"
        assert raw and {v[:5] for v in raw} == {b"\0" + registered.schema_id.to_bytes(4, "big")}
        deserializer = AvroDeserializer(registry)
        context = SerializationContext(topic, MessageField.VALUE)
        for value in raw:
            event = deserializer(value, context)
            ours = lifecycle_wire.decode(codec, value)  # Runstream's readers agree
            assert event == {f: getattr(ours, f) for f in event}
            events.append(event)
    by_run: dict[str, list[dict]] = {}
    for e in events:
        by_run.setdefault(e["run_id"], []).append(e)
    runs = {f"{p}order-{o}" for p in ("1-", "2-") for o in range(1, 5)}
    runs |= {f"{p}refund-{o}" for p in ("1-", "2-") for o in REFUNDS}
    assert set(by_run) == runs
    for p in ("1-", "2-"):
        started, *_, ended = by_run[f"{p}order-3"]
        assert started["type"] == "run.started" and started["input"] == b"3"
        assert ended["type"] == "run.completed" and ended["output"] == b'"s-3"'
        assert [e["error"] for e in by_run[f"{p}order-3"] if e["type"] == "step.failed"] == [
            "ConnectionError: stock service unavailable"
        ]
        assert by_run[f"{p}order-4"][-1]["type"] == "run.failed"

    listed = CliRunner().invoke(
        cli,
        ["runs", "list", "-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir",
         str(tmp_path / "cache"), "--status", "failed", "--json"],
    )  # fmt: skip
    assert listed.exit_code == 0, listed.output
    assert {r["run_id"] for r in json.loads(listed.stdout)["runs"]} == {"1-order-4", "2-order-4"}


def test_an_engine_whose_registry_refuses_the_schema_does_not_start(
    kafka_bootstrap, ns, tmp_path: Path, schema_registry
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    settings = Settings(
        state_dir=tmp_path / "state",
        exit_on_hang=False,
        lifecycle_format="avro-registry",
        schema_registry_url=schema_registry + "/no-such-api",  # answers 404
    )
    worker = Worker(make_app(ns, kafka_bootstrap), settings)
    failed: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run(worker, failed))
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], ConfigError)
    assert "cannot register the lifecycle schema" in str(failed[0])
    assert worker.status == "stopped"


def _run(worker: Worker, failed: list[BaseException]) -> None:
    try:
        worker.run()
    except BaseException as exc:  # the test looks at it
        failed.append(exc)
