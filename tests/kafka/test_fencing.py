"""A takeover fences a dead instance's open transaction instead of waiting it out.

An instance killed inside a transaction leaves its journal records undecided: they hold
the partition's last stable offset until the coordinator aborts the transaction, its
timeout after it began (`topics.fencing`). Here the dead instance is a producer with an
engine's transactional id whose journal record names it as the writer, with a timeout of
ten minutes: the engine that takes the partition must abort it at once.
"""

from __future__ import annotations

import time
from itertools import count

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

import runstream
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.schemas.records import RunStarted
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.fencing import fence_abandoned
from runstream.topics.txn import evidence

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, wait_for

pytestmark = pytest.mark.kafka


def test_a_takeover_fences_a_dead_instances_open_transaction_instead_of_waiting_it_out(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    p = partition_for(b"hidden", PARTITIONS)
    dead = Producer(
        {
            **client_config(kafka_bootstrap),
            "transactional.id": f"{ns}.engine.gone",  # instance "gone"'s first producer
            "transaction.timeout.ms": 600_000,
        }
    )
    dead.init_transactions(30)
    dead.begin_transaction()
    started = RunStarted("hidden", int(time.time() * 1000), workflow="w", version="1", input=b"1")
    dead.produce(
        f"{ns}.journal",
        Codec.default().encode(started),
        b"hidden",
        partition=p,
        headers=evidence("gone.0badc0de", 1, [p], []),
    )
    dead.flush(30)

    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = None
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the client")
        # A run on the held partition completes long before the ten minutes are out.
        run_id = next(
            r for i in count() if partition_for((r := f"after-{i}").encode(), PARTITIONS) == p
        )
        client.start("three_steps", 1, run_id=run_id)
        assert client.result(run_id, timeout=90) == 4
        with pytest.raises(runstream.RunNotFound):  # the dead instance's fact was aborted
            client.get_run("hidden")
        with pytest.raises(KafkaException) as fenced:  # and the dead instance is fenced
            dead.commit_transaction(30)
        assert "fenc" in str(fenced.value).lower() or "epoch" in str(fenced.value).lower()
    finally:
        if client is not None:
            client.close()
        worker.stop()


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def test_an_open_transaction_of_an_instance_still_in_the_group_is_not_fenced(kafka_bootstrap, ns):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    config = client_config(kafka_bootstrap)
    member = Consumer(  # instance "alive" in the engine's group (any topic will do)
        {**config, "group.id": f"{ns}.engine", "client.id": f"{ns}.engine.alive"}
    )
    member.subscribe([f"{ns}.lifecycle"])
    writers = {}
    try:
        wait_for(lambda: member.poll(0.2) is None and member.assignment(), what="joining")
        for p, instance in enumerate(("alive", "gone")):
            writer = Producer({**config, "transactional.id": f"{ns}.engine.{instance}"})
            writer.init_transactions(30)
            writer.begin_transaction()
            headers = evidence(f"{instance}.0badc0de", 1, [p], [])
            writer.produce(f"{ns}.journal", b"fact", b"run", partition=p, headers=headers)
            writer.flush(30)
            writers[instance] = writer

        fenced = fence_abandoned(
            lambda: AdminClient(dict(config)), config, ns, f"{ns}.journal", [0, 1], own="me"
        )

        assert fenced == {"gone"}
        writers["alive"].commit_transaction(30)  # its transaction goes on
        with pytest.raises(KafkaException):
            writers["gone"].commit_transaction(30)
    finally:
        member.close()


def test_every_dead_writer_is_found_however_many_records_one_of_them_left(kafka_bootstrap, ns):
    """The look at each partition's oldest open transaction stopped after ten records
    in all: one dead instance's busy partition used them up and the other's transaction,
    on another partition, was waited out."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    config = client_config(kafka_bootstrap)
    writers = {}
    for p, (instance, records) in enumerate((("busy", 50), ("quiet", 1))):
        writer = Producer({**config, "transactional.id": f"{ns}.engine.{instance}"})
        writer.init_transactions(30)
        writer.begin_transaction()
        headers = evidence(f"{instance}.0badc0de", 1, [p], [])
        for _ in range(records):
            writer.produce(f"{ns}.journal", b"fact", b"run", partition=p, headers=headers)
        writer.flush(30)
        writers[instance] = writer

    fenced = fence_abandoned(
        lambda: AdminClient(dict(config)), config, ns, f"{ns}.journal", [0, 1, 2], own="me"
    )

    assert fenced == {"busy", "quiet"}
    for writer in writers.values():
        with pytest.raises(KafkaException):
            writer.commit_transaction(30)
