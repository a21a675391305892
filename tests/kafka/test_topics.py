"""Topic declarations, creation and co-partitioning against a real broker."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from runstream.cli import exits
from runstream.cli.main import cli
from runstream.engine.partitioner import partition_for
from runstream.errors import TopicError
from runstream.topics.admin import (
    check_copartitioned,
    client_config,
    describe_topics,
    ensure_topics,
)
from runstream.topics.spec import Topics

pytestmark = pytest.mark.kafka

WEEK_MS = str(7 * 24 * 3600 * 1000)


def test_partition_for_matches_librdkafka_murmur2_random(kafka_bootstrap: str, ns: str) -> None:
    ensure_topics(kafka_bootstrap, ns, partitions=12)
    topic = Topics(ns).commands
    producer = Producer({**client_config(kafka_bootstrap), "partitioner": "murmur2_random"})
    keys = [f"run-{i}-{ns}".encode() for i in range(200)]
    # a few awkward keys too: empty-ish, binary, long, non-ASCII
    keys += [b"x", b"\x00\xff\x80", "übung-é".encode(), b"k" * 300]
    delivered: dict[bytes, int] = {}

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        delivered[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    for key in keys:
        producer.produce(topic, key=key, value=b"v", on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert len(delivered) == len(keys)
    mismatches = {
        k: (p, partition_for(k, 12)) for k, p in delivered.items() if p != partition_for(k, 12)
    }
    assert not mismatches
    assert len(set(delivered.values())) == 12  # the keys really spread


def test_ensure_topics_is_idempotent(kafka_bootstrap: str, ns: str) -> None:
    t = Topics(ns)
    created = ensure_topics(kafka_bootstrap, ns, partitions=3, task_groups=["payments"])
    assert created == sorted(
        [
            *(t.commands, t.journal, t.lifecycle, t.events, t.replies, t.dlq, t.state),
            t.blobs,
            t.tasks("payments"),
        ]
    )
    assert ensure_topics(kafka_bootstrap, ns, partitions=3, task_groups=["payments"]) == []
    assert ensure_topics(kafka_bootstrap, ns, partitions=3) == []
    assert check_copartitioned(kafka_bootstrap, ns) == 3

    rows = {r["name"]: r for r in describe_topics(kafka_bootstrap, ns)}
    assert set(rows) == set(created)
    for r in rows.values():
        assert r["exists"] and r["partitions"] == 3 and r["replication"] == 1
        compacted = r["name"] in (t.state, t.blobs)  # snapshots; content-addressed chunks
        assert r["configs"]["cleanup.policy"] == ("compact" if compacted else "delete")
        assert r["configs"]["min.insync.replicas"] == "1"  # broker default: RF is 1
        # small index files (the broker's default is 10 MiB: slow first writes)
        assert r["configs"]["segment.index.bytes"] == str(256 * 1024), r["name"]
        assert r["configs"]["index.interval.bytes"] == str(16 * 1024), r["name"]
    assert rows[t.journal]["family"] == "journal"
    assert rows[t.tasks("payments")]["family"] == "tasks"
    assert rows[t.journal]["configs"]["retention.ms"] == "-1"
    assert rows[t.journal]["configs"]["retention.bytes"] == "-1"
    assert rows[t.dlq]["configs"]["retention.ms"] == "-1"
    assert rows[t.commands]["configs"]["retention.ms"] == WEEK_MS
    assert rows[t.lifecycle]["configs"]["retention.ms"] == WEEK_MS
    assert rows[t.state]["family"] == "state"  # snapshots: compacted, the same partitions


def test_ensure_topics_adds_a_task_group_later(kafka_bootstrap: str, ns: str) -> None:
    ensure_topics(kafka_bootstrap, ns, partitions=2)
    assert ensure_topics(kafka_bootstrap, ns, partitions=2, task_groups=["mail"]) == [
        f"{ns}.tasks.mail"
    ]


def test_partition_count_is_fixed_at_creation(kafka_bootstrap: str, ns: str) -> None:
    ensure_topics(kafka_bootstrap, ns, partitions=4)
    with pytest.raises(TopicError, match=r"already exists with 4 partitions, not 6"):
        ensure_topics(kafka_bootstrap, ns, partitions=6)
    assert check_copartitioned(kafka_bootstrap, ns) == 4


def test_replication_beyond_the_cluster_is_a_topic_error(kafka_bootstrap: str, ns: str) -> None:
    with pytest.raises(TopicError, match="cannot create topics"):
        ensure_topics(kafka_bootstrap, ns, partitions=1, replication=3, timeout=10)


def test_check_copartitioned_missing(kafka_bootstrap: str, ns: str) -> None:
    with pytest.raises(TopicError, match=rf"runstream topics create -n {ns}"):
        check_copartitioned(kafka_bootstrap, ns)
    rows = describe_topics(kafka_bootstrap, ns)
    assert rows and not any(r["exists"] for r in rows)


def test_check_copartitioned_mismatch(kafka_bootstrap: str, ns: str) -> None:
    t = Topics(ns)
    admin = AdminClient(client_config(kafka_bootstrap))
    futures = admin.create_topics([NewTopic(t.commands, 4), NewTopic(t.journal, 3)])
    for f in futures.values():
        f.result(timeout=30)
    # a created topic shows up in the broker's metadata a moment after the future resolves
    deadline = time.monotonic() + 30
    while not {t.commands, t.journal} <= set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, "created topics never showed up"
        time.sleep(0.1)
    with pytest.raises(TopicError) as info:
        check_copartitioned(kafka_bootstrap, ns)
    message = str(info.value)
    assert "4 partitions" in message and "has 3" in message and "co-partitioned" in message
    # and ensure_topics refuses to build on a broken namespace
    with pytest.raises(TopicError):
        ensure_topics(kafka_bootstrap, ns, partitions=4)


def test_cli_create_and_describe(kafka_bootstrap: str, ns: str) -> None:
    runner = CliRunner()
    result = runner.invoke(
        cli, ["topics", "create", "-n", ns, "--partitions", "2", "--bootstrap", kafka_bootstrap]
    )
    assert result.exit_code == 0, result.output
    assert f"created {ns}.journal" in result.output
    again = runner.invoke(
        cli, ["topics", "create", "-n", ns, "--partitions", "2", "--bootstrap", kafka_bootstrap]
    )
    assert again.exit_code == 0 and "already exist" in again.output

    described = runner.invoke(cli, ["topics", "describe", "-n", ns, "--bootstrap", kafka_bootstrap])
    assert described.exit_code == 0, described.output
    lines = described.output.splitlines()
    assert lines[0].split()[:3] == ["TOPIC", "PARTITIONS", "RF"]
    journal = next(line for line in lines if line.startswith(f"{ns}.journal"))
    assert journal.split()[1:5] == ["2", "1", "delete", "-1"]

    wrong = runner.invoke(
        cli, ["topics", "create", "-n", ns, "--partitions", "5", "--bootstrap", kafka_bootstrap]
    )
    assert wrong.exit_code == exits.ERROR  # one line, the CLI's one error format
    assert wrong.stderr.startswith("TopicError: ") and "fixed" in wrong.stderr
    assert len(wrong.stderr.splitlines()) == 1
