"""How far a consumer group is through one topic: its live members, its lag per
partition, and when the oldest record it has not committed was produced.

For `runstream tasks status` (the task workers of ``<ns>.tasks.<group>``), from the
admin API, one consumer that only asks for the group's committed offsets and one
throwaway reader; nothing here joins the group or commits.

Lag counts offsets from the group's committed offset (the low watermark when it has
none) to the partition's last stable offset. Transaction markers and aborted records
take offsets too, so a librdkafka consumer that has read everything still sits one
offset behind a transactionally written partition (the commit marker after its last
record). The reader that looks for the oldest record therefore settles it: a partition
with no committed record past the group's offset has lag 0; others keep their offset
count, an upper bound.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from runstream.errors import KafkaFatal, TopicError
from runstream.topics.admin import (
    Config,
    consume_ready,
    refused,
    unavailable,
    wait_for_cluster,
)

__all__ = [
    "GroupStatus",
    "Member",
    "PartitionLag",
    "assignments",
    "group_status",
    "topics_with_prefix",
]

_EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class Member:
    """A live member of the group, as the group coordinator sees it."""

    member_id: str
    client_id: str
    host: str
    instance_id: str | None  # static membership (group.instance.id)
    partitions: int  # assigned to it now


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition: ``committed`` is None when the group never committed there;
    ``oldest_at_ms`` is the timestamp of the first record past it (None: lag 0)."""

    partition: int
    committed: int | None
    end: int  # the last stable offset
    lag: int
    oldest_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """Consumer group ``group_id`` on ``topic``. ``state`` is Kafka's group state in
    lower case (``stable``, ``empty``, ``dead`` for a group that does not exist, ...)."""

    group_id: str
    topic: str
    state: str
    members: list[Member]
    partitions: list[PartitionLag]

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def oldest_at_ms(self) -> int | None:
        """When the oldest record the group has not committed was produced."""
        return min((p.oldest_at_ms for p in self.partitions if p.oldest_at_ms), default=None)


def topics_with_prefix(config: Config, prefix: str, timeout: float = 10.0) -> list[str]:
    """The names of the cluster's topics that begin with ``prefix``, sorted.

    Raises:
        KafkaUnavailable: no broker answers within ``timeout``.
    """
    wait_for_cluster(config, timeout)
    try:
        names = AdminClient(dict(config)).list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise unavailable(config, "listing topics", exc) from None
    return sorted(n for n in names if n.startswith(prefix))


def group_status(config: Config, group_id: str, topic: str, timeout: float = 10.0) -> GroupStatus:
    """Where consumer group ``group_id`` is on ``topic`` (which must exist).

    Raises:
        KafkaUnavailable: no broker answers.
        TopicError: Kafka refused a question (an ACL, a topic deleted meanwhile).
    """
    admin = AdminClient(dict(config))
    state, members = _describe(config, admin, group_id, timeout)
    partitions = _partitions(config, admin, topic, timeout)
    committed = _committed(config, group_id, topic, partitions, timeout)
    low = _offsets(config, admin, topic, partitions, _EARLIEST, timeout)
    end = _offsets(config, admin, topic, partitions, _LATEST, timeout)
    # Where the group resumes: its committed offset, or the oldest record retention kept.
    start = {p: max(committed.get(p, low[p]), low[p]) for p in partitions}
    behind = {p: o for p, o in start.items() if o < end[p]}
    oldest = _first_timestamps(config, topic, behind, timeout) if behind else {}
    rows = [
        PartitionLag(
            p,
            committed.get(p),
            end[p],
            end[p] - start[p] if p in oldest else 0,
            oldest.get(p),
        )
        for p in partitions
    ]
    return GroupStatus(group_id, topic, state, members, rows)


def assignments(
    config: Config, group_id: str, topic: str, timeout: float = 10.0
) -> dict[str, list[int]]:
    """The partitions of ``topic`` each live member of ``group_id`` holds now, by client id
    (`runstream.standby` places its warm copies by them).

    Raises:
        TopicError: Kafka refused to describe the group.
    """
    admin = AdminClient(dict(config))
    [future] = admin.describe_consumer_groups([group_id], request_timeout=timeout).values()
    try:
        desc = future.result()
    except KafkaException as exc:
        raise refused(config, f"describing consumer group {group_id}", exc) from None
    return {
        m.client_id: sorted(
            tp.partition
            for tp in (m.assignment.topic_partitions if m.assignment else [])
            if tp.topic == topic
        )
        for m in desc.members
    }


def _describe(
    config: Config, admin: AdminClient, group_id: str, timeout: float
) -> tuple[str, list[Member]]:
    [future] = admin.describe_consumer_groups([group_id], request_timeout=timeout).values()
    try:
        desc = future.result()
    except KafkaException as exc:
        raise refused(config, f"describing consumer group {group_id}", exc) from None
    members = [
        Member(
            m.member_id,
            m.client_id,
            m.host,
            m.group_instance_id,
            len(m.assignment.topic_partitions) if m.assignment else 0,
        )
        for m in desc.members
    ]
    return desc.state.name.lower(), sorted(members, key=lambda m: (m.client_id, m.member_id))


def _partitions(config: Config, admin: AdminClient, topic: str, timeout: float) -> list[int]:
    try:
        md = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise unavailable(config, f"describing {topic}", exc) from None
    if md is None or md.error is not None or not md.partitions:
        raise TopicError(f"topic {topic} does not exist at {config['bootstrap.servers']}")
    return sorted(md.partitions)


def _committed(
    config: Config, group_id: str, topic: str, partitions: list[int], timeout: float
) -> dict[int, int]:
    """Partition -> the group's committed offset, for those it committed.

    Asked through a consumer of the group that never subscribes (so never joins it nor
    disturbs its members) rather than the admin API: librdkafka's admin client crashes
    the process (SIGSEGV) when the OffsetFetch is answered NOT_COORDINATOR, as it sends
    the coordinator re-query to a consumer-group handle an admin client does not have."""
    consumer = Consumer(
        {
            **config,
            "group.id": group_id,  # never subscribed: asks for its offsets, never joins
            "enable.auto.commit": False,
            # librdkafka's committed() asks the broker for stable offsets (RequireStable)
            # when read_committed, and retries while a transaction holding offsets of the
            # group is open; read_uncommitted gets the last committed offsets at once
            # instead of waiting out the timeout behind an engine's transaction.
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        asked = [TopicPartition(topic, p) for p in partitions]
        answer = consumer.committed(asked, timeout=timeout)
    except KafkaException as exc:
        raise refused(config, f"reading the offsets of consumer group {group_id}", exc) from None
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in answer if tp.offset >= 0}


def _offsets(
    config: Config,
    admin: AdminClient,
    topic: str,
    partitions: list[int],
    spec: OffsetSpec,
    timeout: float,
) -> dict[int, int]:
    """Partition -> its earliest offset, or its last stable offset (``latest`` read
    committed: records of an open transaction are not waiting for anyone yet)."""
    futures = admin.list_offsets(
        {TopicPartition(topic, p): spec for p in partitions},
        isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=timeout,
    )
    out = {}
    for tp, future in futures.items():
        try:
            out[tp.partition] = int(future.result().offset)
        except KafkaException as exc:
            raise refused(config, f"reading the offsets of {topic}", exc) from None
    return out


def _first_timestamps(
    config: Config, topic: str, start: Mapping[int, int], timeout: float
) -> dict[int, int]:
    """Partition -> the timestamp of the first committed record at or after its offset
    in ``start``; a partition with none before its end is left out."""
    consumer = Consumer(
        {
            **config,
            "group.id": f"runstream.reader.{time.time_ns()}",  # never joined: assign only
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",  # deleted by retention meanwhile: the oldest left
            "fetch.wait.max.ms": 100,
        }
    )
    found: dict[int, int] = {}
    done: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        consumer.incremental_assign([TopicPartition(topic, p, o) for p, o in start.items()])
        while len(done) < len(start):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic} from the group's offsets found neither a record nor the "
                    f"end of partitions {sorted(set(start) - done)} within {timeout:g}s"
                )
            for msg in consume_ready(consumer, 0.5, len(start)):
                p, err = msg.partition() or 0, msg.error()
                if p in done:
                    continue
                if err is None:
                    kind, ts = msg.timestamp()
                    found[p] = ts if kind != TIMESTAMP_NOT_AVAILABLE else 0
                    done.add(p)
                    # one record is all we want of it: stop fetching the rest
                    consumer.incremental_unassign([TopicPartition(topic, p)])
                elif err.code() == KafkaError._PARTITION_EOF:
                    done.add(p)
                else:
                    raise KafkaFatal(f"reading {topic}: {err}")
    finally:
        consumer.close()
    return found
