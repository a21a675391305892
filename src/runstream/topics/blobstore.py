"""The blobs topic at the Kafka edge: read a large payload by its reference, and write
one from a client or a task worker (`engine.blobs` has the format).

A reader finds a blob fast without an index: every chunk of it lives on the partition
its hash picks, and its reference carries the time it was written, so the reader asks
Kafka for the first offset at or after that time (less a margin for clocks) and reads on
from there until it has every chunk, verifying the hash. A blob written again later (a
redo, the same bytes sent twice) is found the same way: compaction may keep only the
newer copy, which lies further on. Nothing found before the end, or in time, is a
`BlobUnavailable`, never a hang.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from runstream.engine import blobs
from runstream.engine.blobs import MemoryBlobs, Ref
from runstream.errors import BlobUnavailable, CommandNotDelivered
from runstream.settings import Settings
from runstream.topics.admin import (
    Config,
    client_config,
    consume_ready,
    ensure_topics,
    partition_count,
)
from runstream.topics.spec import Topics

log = logging.getLogger("runstream.blobs")

#: How far before a reference's time the reader starts (the writer's clock may lag).
SKEW_MS = 60_000
#: Having read to the end, how long the reader waits for a chunk still being committed.
GRACE_S = 2.0


class KafkaBlobs:
    """Large payloads of ``topic`` (``<ns>.blobs``), with an LRU of the ones resolved.

    Thread-safe; the consumer is opened at the first read, so a process that never meets
    a large payload never connects to the topic.
    """

    def __init__(
        self, config: Config, topic: str, *, timeout: float = 30.0, cache_bytes: int = 256 << 20
    ) -> None:
        self.topic, self.timeout = topic, timeout
        self._config = dict(config)
        self._cache = MemoryBlobs(cache_bytes)
        self._lock = threading.Lock()
        self._consumer: Any = None
        self._partitions = 0

    def remember(self, ref: Ref, data: bytes) -> None:
        self._cache.remember(ref, data)

    def read(self, ref: Ref) -> bytes:
        data = self._cache.get(ref)
        if data is None:
            with self._lock:
                data = self._cache.get(ref) or self._fetch(ref)
            self._cache.remember(ref, data)
        return data

    def write(self, producer: Any, data: bytes, chunk: int) -> Ref:
        """Write ``data``'s chunks with ``producer`` (idempotent, not transactional) and
        wait until Kafka has them all: only then may a record carry the reference."""
        ref, parts = blobs.split(data, chunk, int(time.time() * 1000))
        p = blobs.partition_of(ref, self._partition_count())
        refused: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                refused.append(str(err))

        for i, part in enumerate(parts):
            producer.produce(self.topic, part, ref.key(i), partition=p, on_delivery=delivered)
            producer.poll(0)
        if producer.flush(self.timeout) > 0 or refused:
            why = refused[0] if refused else f"not written in {self.timeout:g}s"
            raise CommandNotDelivered(f"blob {ref.sha256[:16]}... to {self.topic}: {why}")
        self.remember(ref, data)
        return ref

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    # -- reading -------------------------------------------------------------------
    def _open(self) -> Any:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self._config,
                    "group.id": f"runstream.blobs.{time.time_ns()}",  # never commits
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    # Chunks are verified by their hash, so an aborted copy is as good as
                    # a committed one, and a transaction left open on the partition (its
                    # last stable offset) never hides a committed blob beyond it.
                    "isolation.level": "read_uncommitted",
                    "fetch.wait.max.ms": 50,
                    "max.partition.fetch.bytes": 8 * 1024 * 1024,
                }
            )
        return self._consumer

    def _partition_count(self) -> int:
        if not self._partitions:
            md = self._open().list_topics(self.topic, timeout=self.timeout).topics.get(self.topic)
            if md is None or md.error is not None or not md.partitions:
                raise BlobUnavailable(f"topic {self.topic} does not exist: runstream topics create")
            self._partitions = len(md.partitions)
        return self._partitions

    def _fetch(self, ref: Ref) -> bytes:
        what = f"blob {ref.sha256[:16]}... ({ref.size:,} bytes, {ref.chunks} chunks)"
        try:
            consumer = self._open()
            p = blobs.partition_of(ref, self._partition_count())
            asked = TopicPartition(self.topic, p, max(ref.at_ms - SKEW_MS, 0))
            [start] = consumer.offsets_for_times([asked], timeout=self.timeout)
            if start.offset < 0:  # nothing written since that time
                raise BlobUnavailable(f"{what} is not on {self.topic} [{p}]")
            consumer.assign([TopicPartition(self.topic, p, start.offset)])
            try:
                return ref.verify(self._chunks(consumer, ref, what, p))
            finally:
                consumer.unassign()
        except KafkaException as exc:
            raise BlobUnavailable(f"{what} cannot be read: {exc.args[0]}") from None

    def _chunks(self, consumer: Any, ref: Ref, what: str, p: int) -> bytes:
        wanted = {ref.key(i): i for i in range(ref.chunks)}
        parts: dict[int, bytes] = {}
        deadline = time.monotonic() + self.timeout
        at_end: float | None = None
        while len(parts) < ref.chunks:
            now = time.monotonic()
            if now > deadline or (at_end is not None and now - at_end > GRACE_S):
                why = "in time" if now > deadline else "before the end of the partition"
                raise BlobUnavailable(
                    f"{what} is not found on {self.topic} [{p}] {why}: "
                    f"{len(parts)} of its chunks read"
                )
            for msg in consume_ready(consumer, 0.2, 500):
                err = msg.error()
                if err is None:
                    at_end = None
                    i = wanted.get(msg.key() or b"")
                    if i is not None:
                        parts[i] = msg.value() or b""
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end = at_end or time.monotonic()
                else:
                    raise KafkaException(err)
        return b"".join(parts[i] for i in range(ref.chunks))


def blob_producer(config: Config) -> Producer:
    """A plain idempotent producer for a client's or a task worker's blobs."""
    return Producer({**config, "enable.idempotence": True, "linger.ms": 5})


def blob_store(ns: str, settings: Settings) -> KafkaBlobs:
    """A reader of ``ns``'s blobs topic, for `blobs.active` (``runstream runs show``)."""
    config = client_config(settings.bootstrap(), settings.kafka)
    return KafkaBlobs(config, Topics(ns).blobs, timeout=settings.connect_timeout)


def blobs_topic_ready(config: Config, topics: Topics, partitions: int, s: Settings) -> bool:
    """The blobs topic exists once this returns True: created if missing (a namespace of
    an older release) and creating topics is on. False: it is missing and may not be
    created; the engine then runs with large payloads off (a chunk produced in a
    transaction to a missing topic would abort it again and again)."""
    if partition_count(config, topics.blobs) is not None:
        return True
    if not s.create_topics:
        log.warning(
            "%s does not exist and create_topics is off: large payloads are off "
            "(runstream topics create %s adds it)",
            topics.blobs,
            topics.ns,
        )
        return False
    ensure_topics(str(config["bootstrap.servers"]), topics.ns, partitions, kafka=s.kafka)
    return True
