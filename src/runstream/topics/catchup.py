"""Read a topic's partitions from offsets the reader keeps itself: to their end, or on.

For read models that store their own offsets (`projections.runs`, fed from
``<ns>.lifecycle``), for `runstream runs tail`, and for one run's journal records. Reads
committed records only; a partition's end is where librdkafka reports its EOF (the last
stable offset, past any transaction marker), never a comparison with the high watermark
(KAFKA.md 3.3).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from runstream.engine.work import LogRecord
from runstream.errors import KafkaFatal, KafkaUnavailable
from runstream.topics.admin import Config, consume_ready, transient, wait_for_cluster
from runstream.topics.kafka import as_record
from runstream.topics.logs import last_error

__all__ = ["PartitionReader", "TopicLayout"]

#: A batch of records and, per partition read, the offset to read next after it.
Batch = tuple[list[LogRecord], dict[int, int]]


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """What a reader must know before it trusts offsets it stored: the topic's id (a
    recreated topic has another) and each partition's (low, high) watermarks."""

    topic_id: str
    bounds: dict[int, tuple[int, int]]


class PartitionReader:
    """Reads ``topic`` with its own assignment (no consumer group, nothing committed).

    Args:
        config: `admin.client_config` plus the user's extra librdkafka settings.
        connect_timeout: how long to wait for a broker before `KafkaUnavailable`.
    """

    def __init__(self, config: Config, topic: str, connect_timeout: float = 10.0) -> None:
        self.topic, self._config = topic, dict(config)
        self._bootstrap = str(config["bootstrap.servers"])
        self._timeout = connect_timeout
        self._consumer = Consumer(
            {
                **config,
                "group.id": f"runstream.reader.{time.time_ns()}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",  # an offset retention dropped: the oldest left
                "fetch.wait.max.ms": 100,
            }
        )

    def layout(self) -> TopicLayout | None:
        """The topic's id and watermarks; None if it does not exist.

        Raises:
            KafkaUnavailable: no broker answers within the connect timeout.
        """
        wait_for_cluster(self._config, self._timeout)
        admin = AdminClient(self._config)
        future = admin.describe_topics(TopicCollection([self.topic]), request_timeout=30)
        try:
            description = future[self.topic].result()
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise self._unavailable(f"describing {self.topic}", exc) from None
        bounds = {}
        for info in description.partitions:
            low, high = self._watermarks(TopicPartition(self.topic, info.id))
            bounds[info.id] = (int(low), int(high))
        return TopicLayout(str(description.topic_id), bounds)

    def _watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        """``tp``'s watermarks, asked again while Kafka's answer is transient (a topic
        created a moment ago: its leader is not known yet, NOT_LEADER_FOR_PARTITION)."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                low, high = self._consumer.get_watermark_offsets(tp, timeout=self._timeout)
                return int(low), int(high)
            except KafkaException as exc:
                if not transient(exc.args[0]) or time.monotonic() > deadline:
                    raise self._unavailable(f"reading the offsets of {self.topic}", exc) from None
            time.sleep(0.2)

    def offset_at(self, partition: int, at_ms: int) -> int | None:
        """The first offset of ``partition`` with a timestamp at or after ``at_ms``; None
        if there is none."""
        tp = TopicPartition(self.topic, partition, at_ms)
        try:
            [found] = self._consumer.offsets_for_times([tp], timeout=self._timeout)
        except KafkaException as exc:
            raise self._unavailable(f"looking up offsets of {self.topic}", exc) from None
        return int(found.offset) if found.offset >= 0 else None

    def read(
        self,
        start: Mapping[int, int],
        *,
        follow: bool = False,
        idle_timeout: float = 30.0,
        batch: int = 5000,
        wait: float = 0.5,
    ) -> Iterator[Batch]:
        """The records of the partitions in ``start``, from those offsets, in batches
        with the offsets reached. Without ``follow`` it ends once every partition is at
        its end; with it, it goes on and also yields empty batches (a chance to stop),
        at least every ``wait`` seconds.

        Raises:
            TimeoutError: (not following) no record nor end for ``idle_timeout`` seconds,
                e.g. an unfinished transaction holds the partition's end.
        """
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in start.items()])
        positions, at_end = dict(start), set[int]()
        idle_since = time.monotonic()
        try:
            while follow or len(at_end) < len(start):
                records = []
                for msg in consume_ready(self._consumer, wait, batch):
                    err, p = msg.error(), msg.partition() or 0
                    if err is None:
                        records.append(as_record(msg))
                        positions[p] = (msg.offset() or 0) + 1
                    elif err.code() == KafkaError._PARTITION_EOF:
                        positions[p] = max(positions[p], msg.offset() or 0)
                        at_end.add(p)
                    else:
                        raise KafkaFatal(f"reading {self.topic}: {err}")
                if records or follow:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > idle_timeout:
                    raise TimeoutError(
                        f"{self.topic} did not reach its end within {idle_timeout:g}s "
                        f"(an unfinished transaction?)"
                    )
                if records or follow or len(at_end) == len(start):
                    yield records, dict(positions)
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        self._consumer.close()

    def _unavailable(self, what: str, exc: KafkaException) -> KafkaUnavailable:
        return KafkaUnavailable(self._bootstrap, what, last_error() or str(exc.args[0]))
