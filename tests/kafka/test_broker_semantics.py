"""Kafka behaviour the engine relies on, proven against a real broker (not the librdkafka mock,
which does not store transactional offsets)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from runstream.engine.partitioner import partition_for
from runstream.settings import Settings
from runstream.topics.admin import client_config, consume_ready

pytestmark = pytest.mark.kafka


def create_topics(admin: AdminClient, names: list[str], partitions: int = 1) -> None:
    futures = admin.create_topics([NewTopic(n, partitions) for n in names])
    for f in futures.values():
        f.result(timeout=30)


def read_values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Every value of partition 0 visible at `isolation`, from the beginning to the end."""
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"{topic}-reader-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,  # tells us when we reached the end (the LSO)
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return values
                raise AssertionError(msg.error())
            values.append(msg.value())
    finally:
        consumer.close()
    raise AssertionError(f"no end of {topic} within 30 s; read {values}")


def txn_producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer({**client_config(bootstrap), "transactional.id": txn_id})
    producer.init_transactions(30)
    return producer


def test_read_committed_sees_committed_not_aborted(kafka_bootstrap, kafka_admin, ns):
    topic = f"{ns}.events"
    create_topics(kafka_admin, [topic])
    producer = txn_producer(kafka_bootstrap, f"{ns}-tx")
    for value, commit in ((b"c1", True), (b"a1", False), (b"c2", True)):
        producer.begin_transaction()
        producer.produce(topic, value)
        producer.flush(30)  # make sure the aborted record really reaches the log
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    assert read_values(kafka_bootstrap, topic, "read_committed") == [b"c1", b"c2"]
    # the aborted record is in the log; only the isolation level hides it
    assert read_values(kafka_bootstrap, topic, "read_uncommitted") == [b"c1", b"a1", b"c2"]


def test_send_offsets_to_transaction_moves_offset_only_on_commit(kafka_bootstrap, kafka_admin, ns):
    src, dst, group = f"{ns}.in", f"{ns}.out", f"{ns}-group"
    create_topics(kafka_admin, [src, dst])
    plain = Producer(client_config(kafka_bootstrap))
    for i in range(3):
        plain.produce(src, f"in-{i}".encode())
    assert plain.flush(30) == 0

    consumer = Consumer(
        {
            **client_config(kafka_bootstrap),
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(src, 0, OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.offset())
        assert got == [0, 1, 2]
        next_offsets = [TopicPartition(src, 0, 3)]  # the next offset to consume

        producer = txn_producer(kafka_bootstrap, f"{ns}-tx")

        def committed() -> int:
            return consumer.committed([TopicPartition(src, 0)], timeout=10)[0].offset

        producer.begin_transaction()
        producer.produce(dst, b"out")
        producer.send_offsets_to_transaction(next_offsets, consumer.consumer_group_metadata(), 30)
        producer.abort_transaction(30)
        assert committed() == OFFSET_INVALID

        producer.begin_transaction()
        producer.produce(dst, b"out")
        producer.send_offsets_to_transaction(next_offsets, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        assert committed() == 3
    finally:
        consumer.close()


def test_consume_waits_out_its_timeout_for_a_full_batch_and_consume_ready_does_not(
    kafka_bootstrap, kafka_admin, ns
):
    """Why every read goes through `consume_ready`: librdkafka's ``consume(n, timeout)``
    returns records it has already fetched only once the timeout has passed (it fills
    the batch), so a reader that loops on it holds each record back that long."""
    topic = f"{ns}.ready"
    create_topics(kafka_admin, [topic])
    plain = Producer(client_config(kafka_bootstrap))
    for i in range(3):
        plain.produce(topic, f"r{i}".encode())
    assert plain.flush(30) == 0

    def reader() -> Consumer:
        consumer = Consumer({**client_config(kafka_bootstrap), "group.id": f"{ns}-r"})
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        assert consumer.poll(30) is not None  # fetched: the rest is in its queue too
        consumer.seek(TopicPartition(topic, 0, 1))
        return consumer

    batch, ready = reader(), reader()
    try:
        began = time.monotonic()
        got = [m.value() for m in batch.consume(500, 3.0)]
        assert got == [b"r1", b"r2"] and time.monotonic() - began >= 2.9
        began = time.monotonic()
        got = [m.value() for m in consume_ready(ready, 30.0, 500)]
        assert got[0] == b"r1" and time.monotonic() - began < 15  # not its 30 s
    finally:
        batch.close()
        ready.close()


def test_murmur2_random_puts_a_key_in_the_same_partition_of_every_topic(
    kafka_bootstrap, kafka_admin, ns
):
    partitions = 6
    topics = [f"{ns}.runs", f"{ns}.timers"]
    create_topics(kafka_admin, topics, partitions)
    placed: dict[str, dict[bytes, int]] = {t: {} for t in topics}

    def delivered(err, msg):
        assert err is None, err
        placed[msg.topic()][msg.key()] = msg.partition()

    producer = Producer({**client_config(kafka_bootstrap), "partitioner": "murmur2_random"})
    keys = [f"run-{i}".encode() for i in range(40)]
    for topic in topics:
        for key in keys:
            producer.produce(topic, b"v", key=key, on_delivery=delivered)
    assert producer.flush(30) == 0

    first, second = (placed[t] for t in topics)
    assert first == second and len(first) == len(keys)
    assert len(set(first.values())) > 1  # keys really spread out
    # and the same partition the Java client's default partitioner would choose
    assert all(p == partition_for(k, partitions) for k, p in first.items())


def test_a_member_whose_loop_is_blocked_past_its_session_timeout_keeps_its_partitions(
    kafka_bootstrap, kafka_admin, ns
):
    """The group session is kept by librdkafka's own thread (the engine's heartbeat
    interval, `Settings.group_session`), not by polls: a loop stuck in a long decision or
    a slow restore is not taken for dead; only max.poll.interval.ms bounds it."""
    topic, session = f"{ns}.commands", Settings(session_timeout_ms=6000)
    create_topics(kafka_admin, [topic])
    events: list[str] = []
    consumer = Consumer(
        {
            **client_config(kafka_bootstrap),
            **session.group_session(),
            "group.id": f"{ns}-group",
            "client.id": f"{ns}-member",
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    consumer.subscribe(
        [topic],
        on_assign=lambda c, tps: events.append("assigned"),
        on_revoke=lambda c, tps: events.append("revoked"),
        on_lost=lambda c, tps: events.append("lost"),
    )
    try:
        deadline = time.monotonic() + 30
        while "assigned" not in events and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert events == ["assigned"]
        time.sleep(1.5 * session.session_timeout_ms / 1000)  # the loop blocked: no poll
        group = kafka_admin.describe_consumer_groups([f"{ns}-group"])[f"{ns}-group"].result()
        assert [m.client_id for m in group.members] == [f"{ns}-member"]
        assert [tp.partition for tp in group.members[0].assignment.topic_partitions] == [0]
        consumer.poll(1.0)
        assert events == ["assigned"]  # neither revoked nor lost
    finally:
        consumer.close()
