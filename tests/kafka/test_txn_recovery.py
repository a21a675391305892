"""The engine log's recovery from a transaction whose outcome is unknown, on a real
broker: the producer is recreated (never aborted), the open transaction is fenced and
stays invisible, the consumer is rewound to the committed offsets, and a commit that
did land is recognised as such; the journal's headers name the transaction that did
not commit, and the audit of them is clean. (Each error class and the worker's redo of
the batch: ``tests/component/test_txn_errors.py``.)"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from runstream.audit.txns import TxnLedger
from runstream.engine.work import LogRecord
from runstream.errors import KafkaFatal
from runstream.settings import Settings
from runstream.topics.admin import client_config
from runstream.topics.base import TransactionAborted
from runstream.topics.kafka import KafkaLog, open_engine_log, read_to_end
from runstream.topics.spec import Topics
from runstream.topics.watchdog import Watchdog

from .kit import wait_for


class Owner:
    def __init__(self) -> None:
        self.owned: list[int] = []

    def assigned(self, partitions: list[int]) -> None:
        self.owned += partitions

    def revoked(self, partitions: list[int], lost: bool) -> None:
        self.owned = [p for p in self.owned if p not in partitions]


def started_log(bootstrap: str, ns: str) -> KafkaLog:
    """An engine log owning the namespace's one partition, with three commands on it."""
    settings = Settings(bootstrap_servers=bootstrap, partitions=1)
    log = open_engine_log(settings, Topics(ns), "i1", Watchdog(exit_on_hang=False), lambda: False)
    assert log is not None
    owner = Owner()
    assert log.start(owner, lambda: False)
    wait_for(lambda: log.poll(0.2, 10) == [] and owner.owned == [0], what="the assignment")
    log.committed([0])  # as a restore does
    log.resume([0])
    producer = Producer(client_config(bootstrap))
    for i in range(3):
        producer.produce(log.topics.commands, f"c{i}".encode(), b"r", partition=0)
    producer.flush(30)
    return log


def poll_commands(log: KafkaLog) -> list[int]:
    offsets: list[int] = []
    wait_for(lambda: offsets.extend(r.offset for r in log.poll(0.2, 10)) or len(offsets) >= 3)
    return offsets


def records(bootstrap: str, ns: str) -> list[LogRecord]:
    return [r for batch in read_to_end(client_config(bootstrap), f"{ns}.journal") for r in batch]


def journal(bootstrap: str, ns: str) -> list[bytes | None]:
    return [r.value for r in records(bootstrap, ns)]


def test_a_commit_that_times_out_recreates_the_producer_fences_it_and_rewinds(kafka_bootstrap, ns):
    log = started_log(kafka_bootstrap, ns)
    try:
        assert poll_commands(log) == [0, 1, 2]
        log.begin([0])
        log.send_offsets({0: 3})
        log.produce(log.topics.journal, 0, b"r", b"fact")
        # The record is not acknowledged yet (a round trip, after linger.ms): the commit's
        # flush times out, a real _TIMED_OUT, before its EndTxn is sent. (Given the time,
        # the EndTxn may land even though the call timed out: see the next test.)
        log.call_timeout = 0
        with pytest.raises(TransactionAborted, match="commit_transaction"):
            log.commit()
        assert log.recreations == 1 and log.aborts == 0
        assert journal(kafka_bootstrap, ns) == []  # fenced by the new producer's init
        assert log.committed([0]) == {0: 0}
        assert poll_commands(log) == [0, 1, 2]  # rewound
        log.call_timeout = 30
        log.begin([0])  # the recreated producer works
        log.produce(log.topics.journal, 0, b"r", b"fact again")
        log.send_offsets({0: 3})
        assert set(log.commit()) == {0}  # the journal's end on partition 0
        assert journal(kafka_bootstrap, ns) == [b"fact again"]
        assert log.committed([0]) == {0: 3}
        (record,) = records(kafka_bootstrap, ns)
        headers = dict(record.headers)
        assert headers["runstream-writer"].startswith(b"i1.")
        assert headers["runstream-txn"] == b"2" and headers["runstream-txn-parts"] == b"0"
        assert headers["runstream-aborted"] == b"1"  # the transaction that timed out
        ledger = TxnLedger()
        ledger.add(record.key, record.partition, record.offset, record.headers)
        assert ledger.violations() == [] and ledger.named_aborted == 1
    finally:
        log.close()


@pytest.mark.parametrize("moves_offsets", [True, False])
def test_after_a_recreation_a_commit_that_landed_is_known_as_such(
    kafka_bootstrap, ns, moves_offsets
):
    """Told by the offsets it moved, or (a batch of internal work only) by its journal
    record being visible."""
    log = started_log(kafka_bootstrap, ns)
    try:
        assert poll_commands(log) == [0, 1, 2]
        log.begin()
        log.produce(log.topics.journal, 0, b"r", b"fact")
        log.send_offsets({0: 3 if moves_offsets else 0})
        log.commit()
        log._recreate()  # as after a commit whose answer was lost
        assert log._landed()
        log.begin()
        log.produce(log.topics.journal, 0, b"r", b"not committed")
        log.send_offsets({0: 3})
        log._recreate()
        assert not log._landed()
        assert journal(kafka_bootstrap, ns) == [b"fact"]
    finally:
        log.close()


class FailsOnce:
    """The log's real consumer (or any object), whose next ``committed``,
    ``get_watermark_offsets`` and ``_list_ends`` fail once with ``code``, as they do while
    a coordinator or a leader moves (a broker paused: seen in the chaos suite)."""

    def __init__(self, consumer: object, code: int) -> None:
        self._consumer, self.code, self.failed = consumer, code, set[str]()

    def _once(self, what: str) -> None:
        if what not in self.failed:
            self.failed.add(what)
            raise KafkaException(KafkaError(self.code, f"Failed: {what}"))

    def committed(self, *args: object, **kw: object) -> object:
        self._once("committed")
        return self._consumer.committed(*args, **kw)  # type: ignore[attr-defined]

    def get_watermark_offsets(self, *args: object, **kw: object) -> object:
        self._once("get_watermark_offsets")
        return self._consumer.get_watermark_offsets(*args, **kw)  # type: ignore[attr-defined]

    def _list_ends(self, *args: object, **kw: object) -> object:
        self._once("list_offsets")
        return self._consumer._list_ends(*args, **kw)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._consumer, name)


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError._UNKNOWN_PARTITION,
    ],
    ids=["timed-out", "not-coordinator", "not-leader", "unknown-partition"],
)
def test_reading_offsets_asks_again_while_a_coordinator_or_leader_moves(kafka_bootstrap, ns, code):
    """A rewind (after an aborted transaction) reads the group's committed offsets, and
    a restore the partitions' ends; an error while a broker is away asked nothing again
    and ended the instance with a traceback."""
    log = started_log(kafka_bootstrap, ns)
    try:
        assert poll_commands(log) == [0, 1, 2]
        log._consumer = FailsOnce(log._consumer, code)  # type: ignore[assignment]
        ends = FailsOnce(SimpleNamespace(_list_ends=log._list_ends), code)
        log._list_ends = ends._list_ends  # type: ignore[method-assign]
        log._rewind()
        assert log.end_offsets([0]) == {0: 3}
        assert log._consumer.failed == {"committed", "get_watermark_offsets"}  # type: ignore[attr-defined]
        assert ends.failed == {"list_offsets"}
        assert poll_commands(log) == [0, 1, 2]  # rewound to the group's offset: nothing taken
    finally:
        log.close()


class Refused:
    """An admin client whose every answer is refused as one kept across a broker's
    restart is (stale metadata: FENCED_LEADER_EPOCH, seen in the chaos suite)."""

    def list_offsets(self, asked: dict[object, object], **kw: object) -> dict[object, object]:
        refused: Future[object] = Future()
        refused.set_exception(KafkaException(KafkaError(KafkaError.FENCED_LEADER_EPOCH)))
        return dict.fromkeys(asked, refused)


def test_a_kept_admin_client_that_is_refused_is_replaced_and_asked_again(kafka_bootstrap, ns):
    """The restore keeps one admin client for the partitions' ends (a new client's first
    question can take 3 s); one that went stale must not end the instance."""
    log = started_log(kafka_bootstrap, ns)
    try:
        assert log.end_offsets([0]) == {0: 3}
        kept = log._admin_client
        assert kept is not None and log.end_offsets([0]) == {0: 3}
        assert log._admin_client is kept  # not a new client per question
        log._admin_client = Refused()  # type: ignore[assignment]
        assert log.end_offsets([0]) == {0: 3}
        assert log._admin_client is not None and not isinstance(log._admin_client, Refused)
    finally:
        log.close()


def test_a_static_member_fenced_by_its_own_instance_id_ends_the_log_as_fatal(kafka_bootstrap, ns):
    """librdkafka fences a static member for good when the group sees its instance id
    come back under another member id (its own rejoin after a session timeout, its
    issue 3437: seen in the chaos suite after an engine's SIGSTOP). The consumer is dead
    from then on; its `_FATAL` error was logged as a warning and the instance polled a
    dead consumer for ever, owning nothing. It must end (KafkaFatal) so it restarts."""
    settings = Settings(bootstrap_servers=kafka_bootstrap, partitions=1, instance_id="i1")
    log = open_engine_log(settings, Topics(ns), "i1", Watchdog(exit_on_hang=False), lambda: False)
    assert log is not None
    owner = Owner()
    assert log.start(owner, lambda: False)
    wait_for(lambda: log.poll(0.2, 10) == [] and owner.owned == [0], what="the assignment")
    usurper = Consumer(
        {
            **client_config(kafka_bootstrap),
            "group.id": f"{ns}.engine",
            "group.instance.id": "i1",
            "session.timeout.ms": 6000,
            "partition.assignment.strategy": "cooperative-sticky",  # the engine's
        }
    )
    try:
        usurper.subscribe([log.topics.commands])
        usurper.poll(1)  # joins under the same instance id: the log's member is fenced

        def fenced() -> bool:
            usurper.poll(0.1)
            log.poll(0.2, 10)
            return False

        with pytest.raises(KafkaFatal, match="fenced"):
            wait_for(fenced, timeout=60, what="the fenced consumer's error")
    finally:
        usurper.close()
        log.close()
