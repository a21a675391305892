"""The Kafka clients of a task worker (`runstream.taskworker`): the consumer of one
task group and the producer of its results, heartbeats and dead letters.

The consumer is the group's own (group id ``<ns>.tasks.<group>``): manual commits,
``read_committed`` (the engine produces tasks in its transactions), cooperative-sticky
assignment. The producer is idempotent (acks=all, no duplicates from its own retries)
but not transactional: a result is settled by its attempt id, so a second one for the
same attempt changes nothing, and the worker commits a task's offset only once Kafka
has acknowledged its result (docs/remote-steps.md, section 1).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from runstream.engine.limits import Limits
from runstream.engine.work import LogRecord
from runstream.errors import KafkaFatal, KafkaUnavailable, TopicError
from runstream.settings import Settings
from runstream.topics.admin import (
    Config,
    check_copartitioned,
    client_config,
    max_record_bytes,
    wait_for_cluster,
)
from runstream.topics.blobstore import KafkaBlobs
from runstream.topics.kafka import consume_records, ensure_task_topics, taking
from runstream.topics.spec import Topics

log = logging.getLogger("runstream.tasks")

#: Called once Kafka took a record (None) or refused it for good (why).
Delivered = Callable[[str | None], None]


def open_task_log(
    settings: Settings,
    topics: Topics,
    group: str,
    worker_id: str,
    stopping: Callable[[], bool],
) -> TaskLog | None:
    """The clients, once a broker answers and the namespace exists; None when stopped
    first. Until then, try again and again, each attempt waiting longer (up to 30 s) and
    saying so in one line: a worker may well start before the namespace's first engine."""
    delay = 1.0
    while not stopping():
        try:
            return _open(settings, topics, group, worker_id, stopping, delay)
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
    group: str,
    worker_id: str,
    stopping: Callable[[], bool],
    connect_timeout: float,
) -> TaskLog:
    s, ns = settings, topics.ns
    config = client_config(s.bootstrap(), s.kafka)
    wait_for_cluster(config, connect_timeout, stopping)
    bootstrap = str(config["bootstrap.servers"])
    partitions = check_copartitioned(bootstrap, ns, kafka=s.kafka)  # TopicError: not set up yet
    # Engines create the task topics of the groups their App declares; a worker may come
    # first, or serve a group no engine of this version declares yet.
    ensure_task_topics(config, topics, partitions, [group], s)
    max_record = s.max_record_bytes or max_record_bytes(config, [topics.commands, topics.dlq])
    config = taking(config, max_record)
    return TaskLog(
        config,
        topics,
        group,
        partitions,
        worker_id,
        limits=Limits(max_record, blob_threshold=s.blob_threshold_bytes),
        group_session=s.group_session(),
    )


class TaskLog:
    """A task worker's view of Kafka: the tasks of its partitions, and a producer.

    Call `poll`, `serve`, `commit`, `pause`, `resume` and `close` from one thread (the
    worker's loop): rebalance callbacks and delivery reports run there. `send` may be
    called from any thread.

    Args:
        config: `client_config` plus the user's extra librdkafka settings.
        partitions: the partition count of ``<ns>.commands`` (results go to the
            partition of their run, as every producer of commands must).
    """

    def __init__(
        self,
        config: Config,
        topics: Topics,
        group: str,
        partitions: int,
        worker_id: str,
        *,
        limits: Limits,
        group_session: Mapping[str, int],
    ) -> None:
        self.topics, self.partitions, self.limits = topics, partitions, limits
        self.topic = topics.tasks(group)
        self.blobs = KafkaBlobs(config, topics.blobs)  # a large output, before its result
        self._paused = False
        self._closed = False
        # Each assigned partition's next offset, from the first task handed over: an
        # offset reset (an out-of-range fetch: earliest) reads the partition again from
        # its start, and a task handed over must not run twice. Forgotten when the
        # partition comes or goes (its next owner may not have got as far).
        self._next: dict[int, int] = {}
        self._fatal: str | None = None
        self._consumer = Consumer(
            {
                **config,
                "group.id": self.topic,
                "client.id": f"{self.topic}.{worker_id}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                **group_session,  # session timeout and heartbeat interval
                # The broker answers a waiting fetch as soon as a transaction's tasks turn
                # visible; this only bounds the empty fetches of an idle worker.
                "fetch.wait.max.ms": 100,
            }
        )
        self._producer = Producer(
            {
                **config,
                "client.id": f"{self.topic}.{worker_id}",
                "enable.idempotence": True,
                "acks": "all",
                # A result leaves at once when none is in flight; under load, the results
                # that end meanwhile follow in one request, not one each.
                "linger.ms": 0,
                "max.in.flight.requests.per.connection": 1,
                "partitioner": "murmur2_random",  # dead letters: Kafka's partitioner
            }
        )

    def subscribe(
        self,
        assigned: Callable[[list[int]], None],
        revoked: Callable[[list[int], bool], None],
    ) -> None:
        """Join the group; ``assigned(partitions)`` and ``revoked(partitions, lost)`` are
        called from `poll` (and `close`) as partitions come and go."""

        def on_assign(consumer: Consumer, tps: list[TopicPartition]) -> None:
            self._forget(tps)
            consumer.incremental_assign(tps)
            if self._paused:  # the new ones too: the worker holds all it may now
                consumer.pause(tps)
            assigned([tp.partition for tp in tps])

        self._consumer.subscribe(
            [self.topic],
            on_assign=on_assign,
            on_revoke=lambda c, tps: revoked(self._forget(tps), False),
            on_lost=lambda c, tps: revoked(self._forget(tps), True),
        )

    def _forget(self, tps: list[TopicPartition]) -> list[int]:
        partitions = [tp.partition for tp in tps]
        for p in partitions:
            self._next.pop(p, None)
        return partitions

    # -- consuming -------------------------------------------------------------------
    def poll(self, timeout: float, limit: int) -> list[LogRecord]:
        """Up to ``limit`` task records: waits up to ``timeout`` for the first."""
        records = consume_records(self._consumer, timeout, limit, f"consuming {self.topic}")
        nexts, fresh = self._next, []
        for rec in records:
            if rec.offset >= nexts.get(rec.partition, 0):
                nexts[rec.partition] = rec.offset + 1
                fresh.append(rec)
        if len(fresh) < len(records):
            log.warning(
                "%s: %d tasks read again after an offset reset skipped",
                self.topic,
                len(records) - len(fresh),
            )
        return fresh

    def pause(self) -> None:
        """Fetch nothing more until `resume` (the group session stays alive). librdkafka
        drops what it prefetched and fetches again from the next offset on resume."""
        if not self._paused:
            self._paused = True
            self._consumer.pause(self._consumer.assignment())

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            assigned = self._consumer.assignment()
            self._consumer.resume(assigned)
            # librdkafka fetches a resumed partition only once its broker thread wakes up,
            # up to a second later when nothing else is being fetched; a seek to where the
            # worker stands wakes it at once (measured: 950 ms -> 5 ms to the next task).
            for tp in self._consumer.position(assigned):
                if tp.offset >= 0:
                    try:
                        self._consumer.seek(tp)
                    except KafkaException as exc:  # it still resumes, only later
                        log.debug("seeking %s [%d]: %s", self.topic, tp.partition, exc)

    def commit(self, offsets: Mapping[int, int], *, wait: bool) -> bool:
        """Commit these next offsets of the task topic; False if Kafka refused (a
        rebalance took the partitions meanwhile: their next owner runs those tasks)."""
        if not offsets:
            return True
        tps = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        try:
            if not wait:
                self._consumer.commit(offsets=tps, asynchronous=True)
                return True
            refused = [
                tp for tp in self._consumer.commit(offsets=tps, asynchronous=False) if tp.error
            ]
        except KafkaException as exc:
            refused_all = exc.args[0]
            log.warning("committing %s offsets %s: %s", self.topic, dict(offsets), refused_all)
            return False
        for tp in refused:
            log.warning(
                "committing %s [%d] at %d: %s", self.topic, tp.partition, tp.offset, tp.error
            )
        return not refused

    # -- producing -------------------------------------------------------------------
    def send(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes,
        done: Delivered | None = None,
    ) -> None:
        """Produce one record; ``done`` is called from `serve` once Kafka took it (a
        failure librdkafka gave up on is produced again, unless it can never succeed)."""
        if self._closed:
            return  # a body that outlived the stop: its task runs again elsewhere
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = partition

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                if done is not None:
                    done(None)
            elif err.fatal():
                self._fatal = f"producing to {topic}: {err}"
            elif err.retriable() or err.code() == KafkaError._MSG_TIMED_OUT:
                log.warning("producing to %s: %s; producing it again", topic, err)
                self._produce(topic, kwargs, delivered)
            elif done is not None:
                done(err.str())
            else:
                log.warning("producing to %s: %s", topic, err)

        self._produce(topic, kwargs, delivered)

    def _produce(
        self, topic: str, kwargs: dict[str, Any], delivered: Callable[[Any, Any], None]
    ) -> None:
        while not self._closed:
            try:
                self._producer.produce(topic, on_delivery=delivered, **kwargs)
                return
            except BufferError:  # the local queue is full: the loop's serve() drains it
                time.sleep(0.01)
            except KafkaException as exc:
                raise KafkaFatal(f"producing to {topic}: {exc.args[0]}") from exc

    def serve(self, timeout: float = 0.0) -> None:
        """Run the delivery reports that came (the ``done`` callbacks)."""
        self._producer.poll(timeout)
        if self._fatal is not None:
            raise KafkaFatal(self._fatal)

    def flush(self, timeout: float) -> bool:
        """Wait until Kafka took every record sent; False if some are still pending."""
        return self._producer.flush(timeout) == 0

    def write_blob(self, data: bytes) -> bytes:
        """Put a large output on the blobs topic (flushed); the reference to send."""
        return self.blobs.write(self._producer, data, self.limits.payload).encode()

    def close(self) -> None:
        """Leave the group and release the clients. Never raises: it runs on the way out."""
        self.blobs.close()
        try:
            self._consumer.close()  # revokes: the worker commits what it can
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing the task consumer: %s", exc)
        self._closed = True
        self._producer.flush(1)
