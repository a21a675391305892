"""A new owner's restore against transactions still being decided (issue 19, defect 9).

A transaction's commit markers land on each partition it wrote independently: the one on
``__consumer_offsets`` can become visible before the one on the journal partition. A new
owner that read the journal only to its last stable offset would then miss the last facts
its predecessor committed, and take the predecessor's commands as done. Here a transaction
that wrote facts to the journal is held open (as a journal marker still on its way is) while
an engine takes the partition: the engine's restore must wait for it, and hold the facts
once it commits.

Past a transaction known to be decided (what this instance's last life committed), a
partition whose end is one offset further holds only that transaction's marker: the
restore does not fetch it, and reads every partition with more after it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import runstream
from runstream.engine.partitioner import partition_for
from runstream.errors import KafkaFatal
from runstream.schemas.codec import Codec
from runstream.schemas.records import RunStarted, SignalAwaited
from runstream.settings import Settings
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.kafka import open_engine_log
from runstream.topics.spec import Topics
from runstream.topics.watchdog import Watchdog

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, wait_for

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("decision", ["commit", "abort"])
def test_restore_waits_for_a_journal_transaction_still_being_decided(
    decision, kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    run_id, codec, now = "hidden", Codec.default(), int(time.time() * 1000)
    p = partition_for(run_id.encode(), PARTITIONS)
    predecessor = Producer(
        {**client_config(kafka_bootstrap), "transactional.id": f"{ns}.predecessor"}
    )
    predecessor.init_transactions(30)
    predecessor.begin_transaction()
    for fact in (
        RunStarted(run_id, now, workflow="approval", version="1", input=b"null"),
        SignalAwaited(run_id, now, seq=1, name="approve", timeout_at_ms=None),
    ):
        predecessor.produce(f"{ns}.journal", codec.encode(fact), run_id.encode(), partition=p)
    predecessor.flush(30)

    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = None
    try:
        # The engine takes the partition while the predecessor's facts are undecided; they
        # are committed a moment after it did.
        wait_for(lambda: _owns(kafka_bootstrap, f"{ns}.engine", p), what="the assignment")
        decide = getattr(predecessor, f"{decision}_transaction")
        committer = threading.Timer(2.0, lambda: decide(30))
        committer.start()
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the client")
        committer.join()
        if decision == "commit":  # the engine holds the predecessor's facts: the run goes on
            client.signal(run_id, "approve", "ann")
            assert client.result(run_id, timeout=60) == {"approved": True, "by": "ann"}
        else:  # aborted facts never count, and the restore did not wait for ever
            with pytest.raises(runstream.RunNotFound):
                client.get_run(run_id)
            client.start("three_steps", 1, run_id="after")
            assert client.result("after", timeout=60) == 4
    finally:
        if client is not None:
            client.close()
        worker.stop()


def test_restore_fetches_no_decided_partition_whose_end_is_its_commit_marker(kafka_bootstrap, ns):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    journal = f"{ns}.journal"
    writer = Producer({**client_config(kafka_bootstrap), "transactional.id": f"{ns}.w"})
    writer.init_transactions(30)
    for partitions in ([0, 1, 2], [1]):  # 0 and 2: fact, marker; 1: fact, marker twice
        writer.begin_transaction()
        for p in partitions:
            writer.produce(journal, b"fact", b"run", partition=p)
        writer.commit_transaction(30)
    settings = Settings(bootstrap_servers=kafka_bootstrap)
    log = open_engine_log(settings, Topics(ns), "i1", Watchdog(exit_on_hang=False), _never)
    assert log is not None
    fetched: list[list[int]] = []
    log._restorer = _Assigns(log._restorer, fetched)
    try:
        read = log.read_journal({0: 1, 1: 1, 2: 1}, _never, decided=[0, 1])
        assert [(r.partition, r.offset) for r in read] == [(1, 2)]
        assert fetched == [[1, 2]]  # 0 is only the marker of a decided transaction
        assert list(log.read_journal({0: 1}, _never, decided=[0])) == []
        assert fetched == [[1, 2]]  # nothing fetched at all
    finally:
        log.close()


def _journal_of_ten(bootstrap: str, ns: str) -> str:
    """``<ns>.journal`` with ten committed records on partition 0."""
    ensure_topics(bootstrap, ns, PARTITIONS)
    journal = f"{ns}.journal"
    writer = Producer({**client_config(bootstrap), "transactional.id": f"{ns}.w"})
    writer.init_transactions(30)
    writer.begin_transaction()
    for i in range(10):
        writer.produce(journal, f"fact {i}".encode(), b"run", partition=0)
    writer.commit_transaction(30)  # the marker: offset 10
    return journal


def _restorer_log(bootstrap: str, ns: str) -> Any:
    settings = Settings(bootstrap_servers=bootstrap)
    log = open_engine_log(settings, Topics(ns), "i1", Watchdog(exit_on_hang=False), _never)
    assert log is not None
    return log


def test_a_restore_whose_journal_records_were_deleted_fails_instead_of_skipping_them(
    kafka_bootstrap, ns
):
    # A fetch refused as out of range (here: records deleted under the restore; in the
    # 3-node drill: a leader killed mid-restore) made the restorer jump to the end, and the
    # new owner took up the partition without the facts it skipped.
    journal = _journal_of_ten(kafka_bootstrap, ns)
    admin = AdminClient(client_config(kafka_bootstrap))
    [done] = admin.delete_records([TopicPartition(journal, 0, 5)]).values()
    done.result(30)
    log = _restorer_log(kafka_bootstrap, ns)
    try:
        with pytest.raises(KafkaFatal, match=r"partition 0 .*begins at offset 5.* offset 2"):
            list(log.read_journal({0: 2}, _never))
    finally:
        log.close()


def test_a_restore_refused_out_of_range_for_a_moment_reads_on_from_where_it_was(
    kafka_bootstrap, ns
):
    _journal_of_ten(kafka_bootstrap, ns)
    log = _restorer_log(kafka_bootstrap, ns)
    log._restorer = _RefusedOnce(log._restorer)  # as a leader moving can refuse a fetch
    try:
        read = [(r.offset, r.value) for r in log.read_journal({0: 2}, _never)]
        assert read == [(i, f"fact {i}".encode()) for i in range(2, 10)]
        assert log._restorer.refused == 1
    finally:
        log.close()


def test_a_restore_ignores_a_refusal_of_a_partition_it_is_not_reading(kafka_bootstrap, ns):
    _journal_of_ten(kafka_bootstrap, ns)
    log = _restorer_log(kafka_bootstrap, ns)
    log._restorer = _RefusedOnce(log._restorer, partition=1)  # read to its end, or not at all
    try:
        read = [r.offset for r in log.read_journal({0: 2, 1: 0}, _never)]
        assert read == list(range(2, 10))
        assert log._restorer.refused == 1
    finally:
        log.close()


class _RefusedOnce:
    """The real restorer, whose first answer is an out-of-range refusal of ``partition``
    (the error librdkafka gives with ``auto.offset.reset=error``)."""

    def __init__(self, consumer: Any, partition: int = 0) -> None:
        self._consumer, self.refused, self._partition = consumer, 0, partition

    def poll(self, timeout: float) -> Any:
        if not self.refused:
            self.refused += 1
            return _Refusal(self._partition)
        return self._consumer.poll(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


class _Refusal:
    def __init__(self, partition: int) -> None:
        self._partition = partition

    def error(self) -> KafkaError:
        return KafkaError(KafkaError._AUTO_OFFSET_RESET, "fetch failed: offset out of range")

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return -1001

    def topic(self) -> str:
        return "journal"


class _Assigns:
    """A consumer that notes which partitions each ``assign`` hands it."""

    def __init__(self, consumer: Any, assigned: list[list[int]]) -> None:
        self._consumer, self._assigned = consumer, assigned

    def assign(self, tps: list[Any]) -> None:
        self._assigned.append(sorted(tp.partition for tp in tps))
        self._consumer.assign(tps)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _never() -> bool:
    return False


def _owns(bootstrap: str, group: str, partition: int) -> bool:
    admin = AdminClient(client_config(bootstrap))
    [described] = admin.describe_consumer_groups([group]).values()
    try:
        members = described.result(10).members
    except KafkaException:
        return False
    return any(tp.partition == partition for m in members for tp in m.assignment.topic_partitions)


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def test_the_command_consumer_never_hands_over_a_command_twice_after_an_offset_reset(
    kafka_bootstrap, ns
):
    # An out-of-range fetch resets the command consumer to the partition's start
    # (auto.offset.reset=earliest); the commands it had handed over before must not come
    # again (a start of a purged run would run it again).
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    commands = Producer(client_config(kafka_bootstrap))
    for i in range(6):
        commands.produce(f"{ns}.commands", f"command {i}".encode(), b"run", partition=0)
    commands.flush(30)
    log = _restorer_log(kafka_bootstrap, ns)
    try:
        log._consumer.assign([TopicPartition(f"{ns}.commands", 0, 0)])
        log.committed([0])  # what a restore asks: nothing committed, the first offset
        first = _poll_until(log, 6)
        assert [r.offset for r in first] == list(range(6))
        # the reset, done to the consumer as librdkafka does it (not through log.seek)
        log._consumer.seek(TopicPartition(f"{ns}.commands", 0, 0))
        commands.produce(f"{ns}.commands", b"command 6", b"run", partition=0)
        commands.flush(30)
        assert [r.offset for r in _poll_until(log, 1)] == [6]
        log.seek(0, 4)  # the engine's own rewind (a batch redone) reads them again
        assert [r.offset for r in _poll_until(log, 3)] == [4, 5, 6]
    finally:
        log.close()


def _poll_until(log: Any, count: int, timeout: float = 30) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out += log.poll(0.2, 100)
    time.sleep(0.5)  # and nothing more comes
    return out + log.poll(0.2, 100)
