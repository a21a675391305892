"""The Kafka clients of a source forwarder (`runstream.sources`): a consumer of the
source topics and one transactional producer of the commands they become.

The consumer is a member of the group ``<ns>.sources`` (manual commits only through
the producer's transactions, ``read_committed``, cooperative-sticky, from the earliest
offset when the group has none). The producer's transactional id is
``<ns>.sources.<instance id>``: a restarted forwarder fences its predecessor's open
transaction, and the group metadata sent with the offsets (KIP-447) fences a zombie of
another instance. Each batch's commands and the source offsets after it commit in one
transaction, under the engine's error policy (`topics.txn`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from runstream.engine.limits import Limits
from runstream.engine.work import LogRecord
from runstream.errors import KafkaFatal, KafkaUnavailable, TopicError
from runstream.settings import Settings
from runstream.topics.admin import (
    Config,
    check_copartitioned,
    client_config,
    max_record_bytes,
    partition_count,
    refused,
    wait_for_cluster,
)
from runstream.topics.kafka import consume_records, taking
from runstream.topics.spec import Topics
from runstream.topics.txn import Action, Transactions, classify
from runstream.topics.watchdog import Watchdog

log = logging.getLogger("runstream.sources")

#: A source topic's partition and the next offset to read there.
Offsets = Mapping[tuple[str, int], int]


def sources_group(topics: Topics) -> str:
    """The consumer group of a namespace's source forwarders."""
    return f"{topics.ns}.sources"


def open_source_log(
    settings: Settings,
    topics: Topics,
    sources: Sequence[str],
    instance_id: str,
    watchdog: Watchdog,
    stopping: Callable[[], bool],
) -> SourceLog | None:
    """The clients once a broker answers and the namespace and every source topic
    exist; None when stopped first. Until then, try again, each attempt waiting longer
    (up to 30 s) and saying so in one line."""
    delay = 1.0
    while not stopping():
        try:
            return _open(settings, topics, sources, instance_id, watchdog, stopping, delay)
        except (KafkaUnavailable, TopicError) as exc:
            if stopping():
                break
            log.warning("%s; trying again in %gs", exc, delay)
            until = time.monotonic() + delay
            while time.monotonic() < until and not stopping():
                time.sleep(0.1)
            delay = min(delay * 2, 30.0)
    return None


def _open(
    settings: Settings,
    topics: Topics,
    sources: Sequence[str],
    instance_id: str,
    watchdog: Watchdog,
    stopping: Callable[[], bool],
    connect_timeout: float,
) -> SourceLog:
    s = settings
    config = client_config(s.bootstrap(), s.kafka)
    wait_for_cluster(config, connect_timeout, stopping)
    partitions = check_copartitioned(str(config["bootstrap.servers"]), topics.ns, kafka=s.kafka)
    missing = [t for t in sources if partition_count(config, t) is None]
    if missing:
        raise TopicError(f"source topic(s) {', '.join(missing)} do not exist")
    max_record = s.max_record_bytes or max_record_bytes(config, [topics.commands, topics.dlq])
    return SourceLog(
        taking(config, max_record),
        topics,
        sources,
        partitions,
        instance_id,
        static=bool(s.instance_id) and not s.leave_on_stop,
        transaction_timeout_ms=s.transaction_timeout_ms,
        group_session=s.group_session(),
        watchdog=watchdog,
        limits=Limits(max_record),
    )


class SourceLog(Transactions):
    """A forwarder's view of Kafka: the records of its source partitions, and the
    transactions that turn them into commands. Call everything from one thread.

    Args:
        config: `client_config` plus the user's extra librdkafka settings.
        sources: the topics to read.
        partitions: the partition count of ``<ns>.commands``.
        static: join the group with static membership (``group.instance.id``).
    """

    def __init__(
        self,
        config: Config,
        topics: Topics,
        sources: Sequence[str],
        partitions: int,
        instance_id: str,
        *,
        static: bool,
        transaction_timeout_ms: int,
        group_session: Mapping[str, int],
        watchdog: Watchdog,
        limits: Limits,
    ) -> None:
        self.topics, self.sources, self.limits = topics, sources, limits
        self.partitions = partitions
        self.watchdog = watchdog
        self.call_timeout = 30.0  # seconds a call to the coordinator waits (then: unknown)
        self._sent: dict[tuple[str, int], int] = {}  # the offsets of the open transaction
        group = sources_group(topics)
        self._producer_config = {
            **config,
            "transactional.id": f"{group}.{instance_id}",
            "transaction.timeout.ms": transaction_timeout_ms,
            "linger.ms": 5,
            # The next transaction's AddPartitions is refused until the last one's markers
            # are written (CONCURRENT_TRANSACTIONS), then retried after a backoff that
            # grows to 1 s by default: keep it short, as the engine does.
            "retry.backoff.ms": 5,
            "retry.backoff.max.ms": 20,
            "partitioner": "murmur2_random",  # dead letters, keyed by the original key
        }
        self._producer = Producer(self._producer_config)
        self._consumer = Consumer(
            {
                **config,
                **({"group.instance.id": instance_id} if static else {}),
                "group.id": group,
                "client.id": f"{group}.{instance_id}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                **group_session,  # session timeout and heartbeat interval
                "fetch.wait.max.ms": 50,
            }
        )

    def start(self, stopping: Callable[[], bool]) -> bool:
        """Fence an older producer with our transactional id, then join the group.
        False if a stop was requested meanwhile."""
        deadline = time.monotonic() + 60
        while not stopping():
            try:
                self._producer.init_transactions(1)  # short steps: stay stoppable
                break
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or time.monotonic() > deadline:
                    raise KafkaFatal(f"cannot initialise transactions: {err}") from exc
        else:
            return False
        self._consumer.subscribe(list(self.sources))
        return True

    def poll(self, timeout: float, limit: int) -> list[LogRecord]:
        """Up to ``limit`` records of the partitions assigned once the poll returns.

        A rebalance runs inside the poll (librdkafka's cooperative assignment, no
        callback): records it returned before a partition was revoked are dropped, so
        that the partition's next owner, which starts at the committed offset, is the
        only one to forward them."""
        records = consume_records(self._consumer, timeout, limit, "consuming the sources")
        if not records:
            return records
        owned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        return [r for r in records if (r.topic, r.partition) in owned]

    # -- the transaction (what its errors mean: `topics.txn`) --------------------------
    def begin(self) -> None:
        self._sent = {}
        self._must("begin_transaction", self._producer.begin_transaction)

    def produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        try:
            self._produce(topic, kwargs)
        except KafkaException as exc:
            err = exc.args[0]
            action = classify("produce", err)
            if action is Action.RETRY:
                self._transact("produce", lambda: self._produce(topic, kwargs))
            else:
                self._act("produce", action, err)

    def _produce(self, topic: str, kwargs: dict[str, Any]) -> None:
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:  # the local queue is full: let librdkafka send some
                self._producer.poll(0.05)

    def commit(self, offsets: Offsets) -> None:
        """Send ``offsets`` (each source partition's next offset) with the transaction,
        then commit it.

        Raises:
            TransactionAborted: it did not commit; the consumer is rewound: redo.
        """
        self._sent = dict(offsets)
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        metadata = self._consumer.consumer_group_metadata()
        self._transact(
            "send_offsets_to_transaction",
            lambda: self._producer.send_offsets_to_transaction(tps, metadata, self.call_timeout),
        )
        self._transact(
            "commit_transaction", lambda: self._producer.commit_transaction(self.call_timeout)
        )

    def _abort_call(self) -> None:
        self._producer.abort_transaction(self.call_timeout)

    def _recreate(self) -> None:
        """A new producer with the same transactional id; the old one is dropped without
        a call that would abort or flush (its outcome is unknown), and the new one's
        init_transactions waits until the open transaction has ended and fences it."""
        with self.watchdog.watch("dropping the producer", 45):
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer = Producer(self._producer_config)  # the last reference goes
        self._must("init_transactions", lambda: self._producer.init_transactions(30), 75)

    def committed(self, tps: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """The group's committed offset of each of ``tps`` (the first offset if none)."""
        out: dict[tuple[str, int], int] = {}
        if not tps:
            return out
        with self.watchdog.watch("committed", 45):
            try:
                for tp in self._consumer.committed(tps, timeout=30):
                    offset = tp.offset
                    if offset < 0:
                        offset = self._consumer.get_watermark_offsets(tp, timeout=15)[0]
                    out[(tp.topic, tp.partition)] = offset
            except KafkaException as exc:
                raise refused(self._producer_config, "reading committed offsets", exc) from None
        return out

    def _rewind(self) -> None:
        """Seek every assigned partition to the group's committed offset (after an abort
        the consumer would keep its position: KAFKA-17582)."""
        assigned = self._consumer.assignment()
        for (topic, p), offset in self.committed(assigned).items():
            try:
                self._consumer.seek(TopicPartition(topic, p, offset))
            except KafkaException as exc:  # not fetching yet: it starts there anyway
                log.debug("rewinding %s [%d]: %s", topic, p, exc.args[0])

    def _landed(self) -> bool:
        """Whether the transaction whose commit was unknown committed: the group's
        offsets are where it sent them (or beyond: then another member forwarded them)."""
        if not self._sent:
            return False
        now = self.committed([TopicPartition(t, p) for t, p in self._sent])
        return all(now[tp] >= o for tp, o in self._sent.items())

    def close(self) -> None:
        """Leave the group and release the clients. Never raises: it runs on the way out."""
        for what, close in (
            ("consumer", self._consumer.close),
            ("producer", lambda: self._producer.flush(1)),
        ):
            try:
                close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("closing the %s: %s", what, exc)


def group_topics(config: Config, group_id: str, timeout: float = 10.0) -> list[str]:
    """The topics consumer group ``group_id`` has committed offsets of, sorted.

    Raises:
        KafkaUnavailable, TopicError: no broker answers, or Kafka refused.
    """
    admin = AdminClient(dict(config))
    ask = ConsumerGroupTopicPartitions(group_id)
    [future] = admin.list_consumer_group_offsets([ask], request_timeout=timeout).values()
    try:
        answer = future.result()
    except KafkaException as exc:
        raise refused(config, f"reading the offsets of consumer group {group_id}", exc) from None
    return sorted({tp.topic for tp in answer.topic_partitions or ()})
