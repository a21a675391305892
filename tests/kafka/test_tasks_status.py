"""`runstream tasks status` against the real broker, without an engine or a task worker.

The test plays both sides the command looks at: it produces `StepTask` records to the
task topics as the engine would, consumes them in the task workers' consumer group with
a plain consumer (one that stays a member, one that commits and leaves), and produces
journal facts straight to ``<ns>.journal``, keyed by run id.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer, TopicPartition

from runstream.cli import exits
from runstream.cli.main import cli
from runstream.cli.tasks_status import age
from runstream.errors import STEP_TIMED_OUT
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    Record,
    RunCancelled,
    StepCompleted,
    StepFailed,
    StepHandedOver,
    StepStarted,
    StepTask,
)
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.groups import group_status
from runstream.topics.spec import Topics

from .kit import PARTITIONS, wait_for

pytestmark = pytest.mark.kafka

PAY, EXPORTS, IDLE = "payments", "exports", "idle"
ROW_KEYS = {
    "group",
    "topic",
    "consumer_group",
    "state",
    "workers",
    "lag",
    "oldest_waiting",
    "partitions",
    "in_flight",
    "timeouts",
    "paused",  # a task group's pause (`runstream tasks pause`): tests/kafka/test_group_pause.py
    "held",
}
CODEC = Codec.default()


def invoke(bootstrap: str, ns: str, *args: str) -> Result:
    # wide enough that rich never folds a cell of the human table
    return CliRunner().invoke(
        cli, ["tasks", "status", "-n", ns, "--bootstrap", bootstrap, *args], env={"COLUMNS": "200"}
    )


def rows(result: Result) -> dict[str, dict]:
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert isinstance(out, list)
    return {r["group"]: r for r in out}


def task(run_id: str, group: str, seq: int = 1) -> bytes:
    attempt_id = f"{run_id}/{seq}/1"
    return CODEC.encode(
        StepTask(
            run_id, seq, attempt=1, name="charge", args=b"{}", attempt_id=attempt_id, group=group
        )
    )


def consume(bootstrap: str, ns: str, group: str, count: int) -> Consumer:
    """A task worker stand-in: a member of the group's consumer group that has read
    ``count`` tasks (committing nothing yet)."""
    topic = Topics(ns).tasks(group)
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": topic,
            "client.id": f"worker-{group}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < count:
        assert time.monotonic() < deadline, f"read {len(got)} of {count} tasks of {topic}"
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg)
    return consumer


def produce_facts(bootstrap: str, ns: str, facts: list[Record]) -> None:
    """Facts to the journal as the engine writes them: keyed by run id, in order."""
    producer = Producer({**client_config(bootstrap), "partitioner": "murmur2_random"})
    for fact in facts:
        producer.produce(Topics(ns).journal, CODEC.encode(fact), fact.run_id.encode())
    assert producer.flush(30) == 0


def started(run: str, at: int, group: str | None = PAY, seq: int = 1, attempt: int = 1):
    return StepStarted(
        run,
        at,
        seq=seq,
        name="charge",
        attempt=attempt,
        attempt_id=f"{run}/{seq}/{attempt}",
        group=group,
    )


def timed_out(run: str, at: int, seq: int = 1) -> StepFailed:
    error = f"{STEP_TIMED_OUT}no result within the attempt's timeout of 30s"
    return StepFailed(
        run, at, seq=seq, name="charge", attempt=1, error=error, traceback="", retry_at_ms=at + 1000
    )


def test_status_shows_workers_lag_oldest_task_in_flight_and_timeouts(kafka_bootstrap, ns):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS, task_groups=[PAY, EXPORTS, IDLE])
    topics = Topics(ns)
    now = int(time.time() * 1000)
    old_task_ms = now - 90_000

    # payments: 5 tasks on partition 0 (the third one 90 s old), 1 on partition 1; its
    # worker reads all 6, commits the first two of p0 and all of p1, and stays a member.
    plain = Producer(client_config(kafka_bootstrap))
    for i in range(5):
        ts = {"timestamp": old_task_ms} if i == 2 else {}
        plain.produce(topics.tasks(PAY), task(f"p{i}", PAY), f"p{i}".encode(), partition=0, **ts)
    plain.produce(topics.tasks(PAY), task("p5", PAY), b"p5", partition=1)
    # idle: two tasks nobody ever consumed (no consumer group at all)
    for i in range(2):
        plain.produce(topics.tasks(IDLE), task(f"i{i}", IDLE), f"i{i}".encode(), partition=0)
    assert plain.flush(30) == 0

    # exports: two tasks written in a transaction, as the engine writes them; its worker
    # commits both and leaves. The commit marker after them is no task: lag 0.
    tx = Producer({**client_config(kafka_bootstrap), "transactional.id": f"tx-{uuid.uuid4()}"})
    tx.init_transactions(30)
    tx.begin_transaction()
    for i in range(2):
        tx.produce(topics.tasks(EXPORTS), task(f"e{i}", EXPORTS), f"e{i}".encode(), partition=0)
    tx.commit_transaction(30)
    exporter = consume(kafka_bootstrap, ns, EXPORTS, 2)
    exporter.commit(asynchronous=False)
    exporter.close()

    worker = consume(kafka_bootstrap, ns, PAY, 6)
    try:
        worker.commit(
            offsets=[
                TopicPartition(topics.tasks(PAY), 0, 2),
                TopicPartition(topics.tasks(PAY), 1, 1),
            ],
            asynchronous=False,
        )
        produce_facts(
            kafka_bootstrap,
            ns,
            [
                # in flight: a first attempt, and a second one after a timeout
                started("open-1", now - 5000),
                started("open-2", now - 120_000),
                timed_out("open-2", now - 60_000),
                started("open-2", now - 59_000, attempt=2),
                # settled: completed, failed (not a timeout), handed over, run cancelled
                started("done", now - 3000),
                StepCompleted(
                    "done",
                    now - 2000,
                    seq=1,
                    name="charge",
                    output=b"1",
                    attempt=1,
                    duration_ms=1000,
                ),
                started("failed", now - 3000),
                StepFailed(
                    "failed",
                    now - 2000,
                    seq=1,
                    name="charge",
                    attempt=1,
                    error="ValueError: boom",
                    traceback="",
                ),
                started("moved", now - 3000),
                StepHandedOver("moved", now - 2000, seq=1, name="charge", attempt=1, ran=True),
                started("cancelled", now - 3000),
                RunCancelled("cancelled", now - 2000, reason="asked"),
                # a timeout two hours ago: outside the default 15 minutes
                started("long-ago", now - 7_300_000),
                timed_out("long-ago", now - 7_200_000),
                # a local step and another group's attempt
                started("local", now - 3000, group=None),
                started("export-1", now - 3000, group=EXPORTS),
            ],
        )
        # the worker's membership is what the command reports as live workers
        wait_for(
            lambda: rows(invoke(kafka_bootstrap, ns, "--json"))[PAY]["state"] == "stable",
            what="the payments group to be stable",
        )
        got = rows(invoke(kafka_bootstrap, ns, "--json"))

        assert set(got) == {PAY, EXPORTS, IDLE}
        for row in got.values():
            assert set(row) == ROW_KEYS
            assert set(row["timeouts"]) == {"window_ms", "count", "latest"}
            assert row["paused"] is None and row["held"] == 0

        pay = got[PAY]
        assert pay["topic"] == pay["consumer_group"] == topics.tasks(PAY)
        [member] = pay["workers"]
        assert member["client_id"] == "worker-payments"
        assert member["partitions"] == PARTITIONS  # the only member holds every partition
        assert set(member) == {"member_id", "client_id", "host", "instance_id", "partitions"}
        assert pay["lag"] == 3
        assert {p["partition"]: p["lag"] for p in pay["partitions"]} == {0: 3, 1: 0, 2: 0, 3: 0}
        assert pay["oldest_waiting"]["at_ms"] == old_task_ms
        assert 90_000 <= pay["oldest_waiting"]["age_ms"] < 90_000 + 120_000
        assert pay["in_flight"] == 2
        assert pay["timeouts"]["window_ms"] == 15 * 60 * 1000
        assert pay["timeouts"]["count"] == 1
        latest = pay["timeouts"]["latest"]
        assert (latest["run_id"], latest["seq"], latest["step"]) == ("open-2", 1, "charge")
        assert latest["at_ms"] == now - 60_000 and latest["error"].startswith(STEP_TIMED_OUT)

        exports = got[EXPORTS]
        assert exports["workers"] == [] and exports["state"] == "empty"
        assert exports["lag"] == 0 and exports["oldest_waiting"] is None
        assert exports["in_flight"] == 1 and exports["timeouts"]["count"] == 0

        idle = got[IDLE]
        assert idle["workers"] == [] and idle["lag"] == 2
        assert idle["oldest_waiting"] is not None
        assert idle["in_flight"] == 0 and idle["timeouts"]["latest"] is None

        # a longer window counts the old timeout too; --group shows that group alone
        wide = rows(invoke(kafka_bootstrap, ns, "--group", PAY, "--since", "3h", "--json"))
        assert list(wide) == [PAY]
        assert wide[PAY]["timeouts"]["count"] == 2
        assert wide[PAY]["timeouts"]["latest"]["run_id"] == "open-2"

        human = invoke(kafka_bootstrap, ns)
        assert human.exit_code == 0, human.output
        lines: dict[str, str] = {}  # group -> its row in the first table (workers follow)
        for line in human.stdout.splitlines():
            if line.startswith("│"):
                lines.setdefault(line.split()[1], line)
        assert "stable" in lines[PAY] and "1 (last: open-2 charge#1" in lines[PAY]
        assert "none" in lines[IDLE]  # no consumer group at all
        assert "worker-payments" in human.stdout
    finally:
        worker.close()


def test_group_status_reports_exactly_the_offsets_the_group_committed(kafka_bootstrap, ns):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS, task_groups=[PAY])
    topic = Topics(ns).tasks(PAY)
    plain = Producer(client_config(kafka_bootstrap))
    for i in range(5):
        plain.produce(topic, task(f"p{i}", PAY), f"p{i}".encode(), partition=0)
    plain.produce(topic, task("p5", PAY), b"p5", partition=2)
    assert plain.flush(30) == 0
    # commits for the group without ever joining it: p0 at 3, p2 at 1, p1 and p3 never
    committer = Consumer(
        {**client_config(kafka_bootstrap), "group.id": topic, "enable.auto.commit": False}
    )
    try:
        committer.commit(
            offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 2, 1)],
            asynchronous=False,
        )
    finally:
        committer.close()

    status = group_status(client_config(kafka_bootstrap), topic, topic)

    assert {p.partition: p.committed for p in status.partitions} == {0: 3, 1: None, 2: 1, 3: None}


def test_group_status_answers_while_an_open_transaction_holds_offsets_of_the_group(
    kafka_bootstrap, ns
):
    """An engine's transaction that sent offsets of the group and has not ended yet: the
    status reports the offsets committed before it, and does not wait for it to end (a
    read asking for stable offsets would wait out its whole timeout and fail)."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS, task_groups=[PAY])
    topic = Topics(ns).tasks(PAY)
    config = client_config(kafka_bootstrap)
    member = Consumer({**config, "group.id": topic, "enable.auto.commit": False})
    producer = Producer({**config, "transactional.id": f"{ns}.open"})
    try:
        member.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, task("p0", PAY), b"p0", partition=0)
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 4)], member.consumer_group_metadata(), 30
        )

        status = group_status(config, topic, topic, timeout=5)

        assert {p.partition: p.committed for p in status.partitions}[0] == 1
        producer.commit_transaction(30)
        status = group_status(config, topic, topic, timeout=5)
        assert {p.partition: p.committed for p in status.partitions}[0] == 4
    finally:
        member.close()


def test_a_namespace_without_task_groups_says_so(kafka_bootstrap, ns):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    out = invoke(kafka_bootstrap, ns)
    assert out.exit_code == 0, out.output
    assert f"no task groups in namespace {ns!r}" in out.stdout
    assert rows(invoke(kafka_bootstrap, ns, "--json")) == {}


def test_an_unknown_group_is_a_clear_error(kafka_bootstrap, ns):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS, task_groups=[PAY])
    out = invoke(kafka_bootstrap, ns, "--group", "nope")
    assert out.exit_code == exits.NOT_FOUND and out.stderr.startswith("TaskGroupNotFound: ")
    assert "no task group 'nope'" in out.output and f"task groups there: {PAY}" in out.output


def test_age_reads_like_a_duration():
    assert [age(ms) for ms in (-5, 999, 45_000, 192_000, 7_500_000, 273_600_000)] == [
        "0s",
        "0s",
        "45s",
        "3m12s",
        "2h05m",
        "3d04h",
    ]
