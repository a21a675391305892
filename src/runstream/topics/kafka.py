"""The Kafka edge: every confluent-kafka client Runstream uses is made here.

- `KafkaLog` is what an engine instance needs of Kafka (`topics.base.EngineLog`): the
  commands it owns through the consumer group, each turned into a frozen `LogRecord`
  at once; the journal, read back to its stable end on restore; and a transactional
  writer with one method per thing the engine does, under the retry-and-watchdog policy.
- `CommandSender` and `Listener` are the client's producer and reader.
- `read_to_end` reads topics from the start to their (committed) end: audit and tools.

Errors leave as Runstream's own: `KafkaUnavailable` when no broker answers,
`TransactionAborted` when a transaction must be redone, `KafkaFatal` when the producer
is unusable for good (fenced by a newer instance). What each transactional error means
and what is done about it is in `topics.txn`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from runstream.engine.limits import Limits
from runstream.engine.work import LogRecord
from runstream.errors import (
    CommandNotDelivered,
    ConfigError,
    KafkaFatal,
    KafkaUnavailable,
    PayloadTooLarge,
    TopicError,
)
from runstream.settings import Settings
from runstream.topics.admin import (
    Config,
    check_authorized,
    check_copartitioned,
    client_config,
    consume_ready,
    ensure_topics,
    max_record_bytes,
    partition_count,
    refused,
    transient,
    wait_for_cluster,
)
from runstream.topics.base import Ownership
from runstream.topics.blobstore import blobs_topic_ready
from runstream.topics.fencing import fence_abandoned
from runstream.topics.logs import last_error
from runstream.topics.spec import Topics
from runstream.topics.txn import Action, Transactions, classify, evidence
from runstream.topics.watchdog import DRAIN_GRACE, Watchdog

T = TypeVar("T")

log = logging.getLogger("runstream.kafka")

_LEADER_MOVES = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def _never() -> bool:
    return False


def open_engine_log(
    settings: Settings,
    topics: Topics,
    instance_id: str,
    watchdog: Watchdog,
    stopping: Callable[[], bool],
    task_groups: Sequence[str] = (),
) -> KafkaLog | None:
    """An engine instance's log once a broker answers; None when stopped first. The task
    topics of ``task_groups`` are created if missing (a task is produced inside a
    transaction, where a missing topic would abort it). While
    Kafka is away, try again and again, each attempt waiting longer (up to 30 s) and
    saying so in one line."""
    delay = 1.0
    while not stopping():
        try:
            return _open_engine_log(
                settings, topics, instance_id, watchdog, stopping, delay, task_groups
            )
        except KafkaUnavailable as exc:
            if stopping():
                break
            log.warning("%s; trying again", exc)
            delay = min(delay * 2, 30.0)
    return None


def _open_engine_log(
    settings: Settings,
    topics: Topics,
    instance_id: str,
    watchdog: Watchdog,
    stopping: Callable[[], bool],
    connect_timeout: float,
    task_groups: Sequence[str],
) -> KafkaLog:
    """The log with the namespace's topics (created if missing and allowed) and its
    record size limits; KafkaUnavailable when no broker answers in ``connect_timeout``."""
    s, ns = settings, topics.ns
    config = client_config(s.bootstrap(), s.kafka)
    wait_for_cluster(config, connect_timeout, stopping)
    bootstrap = str(config["bootstrap.servers"])
    try:
        partitions = check_copartitioned(bootstrap, ns, kafka=s.kafka)
    except TopicError:
        if not s.create_topics:
            raise
        ensure_topics(bootstrap, ns, s.partitions, kafka=s.kafka)  # a new namespace
        partitions = check_copartitioned(bootstrap, ns, kafka=s.kafka)
    ensure_task_topics(config, topics, partitions, task_groups, s)
    big = s.blob_threshold_bytes if blobs_topic_ready(config, topics, partitions, s) else 0
    fixed = topics.fixed()
    written = ["commands", "journal", "lifecycle", "replies", "dlq"] + (["blobs"] if big else [])
    max_record = s.max_record_bytes or max_record_bytes(config, [fixed[f] for f in written])
    config = taking(config, max_record)
    static = bool(s.instance_id) and not s.leave_on_stop
    state_topic = _state_topic(config, topics, partitions, s)
    return KafkaLog(
        config,
        topics,
        partitions,
        instance_id,
        static=static,
        transaction_timeout_ms=s.transaction_timeout_ms,
        group_session=s.group_session(),
        watchdog=watchdog,
        limits=Limits(
            max_record,
            history_events_warn=s.history_warn_events,
            history_events_max=s.history_max_events,
            history_bytes_warn=s.history_warn_bytes,
            history_bytes_max=s.history_max_bytes,
            updates_in_flight=s.updates_in_flight,
            updates_per_history=s.updates_per_history,
            blob_threshold=big,
            blob_budget=s.blob_budget_bytes,
        ),
        state_topic=state_topic,
    )


def _state_topic(config: Config, topics: Topics, partitions: int, s: Settings) -> str | None:
    """``<ns>.state`` if snapshots are on and it is there (created if missing and
    allowed: a namespace from before snapshots lacks it), co-partitioned; else None,
    and a new owner reads the whole journal."""
    if s.snapshot_interval <= 0:
        return None
    count = partition_count(config, topics.state)
    if count is None and s.create_topics:
        ensure_topics(str(config["bootstrap.servers"]), topics.ns, partitions, kafka=s.kafka)
        count = partition_count(config, topics.state)
    if count != partitions:
        log.warning(
            "no snapshots: %s %s; a new owner reads the whole journal",
            topics.state,
            "is missing" if count is None else f"has {count} partitions, not {partitions}",
        )
        return None
    return topics.state


def ensure_task_topics(
    config: Config, topics: Topics, partitions: int, groups: Sequence[str], s: Settings
) -> None:
    """The task topics of ``groups`` exist once this returns: created if missing (a task
    produced in a transaction to a missing topic would abort it), or TopicError when
    creating topics is off."""
    missing = [g for g in groups if partition_count(config, topics.tasks(g)) is None]
    if not missing:
        return
    bootstrap = str(config["bootstrap.servers"])
    if not s.create_topics:
        names = ", ".join(topics.tasks(g) for g in missing)
        raise TopicError(
            f"task topics {names} do not exist at {bootstrap} and create_topics is off: "
            f"runstream topics create -n {topics.ns} --task-group <group>"
        )
    ensure_topics(bootstrap, topics.ns, partitions, task_groups=missing, kafka=s.kafka)


def taking(config: Config, max_record: int) -> dict[str, Any]:
    """``config`` for a producer that must take what the topics take (librdkafka's
    ``message.max.bytes`` defaults to 1,000,000)."""
    limit = max(max_record + 1024, int(config.get("message.max.bytes", 0)))
    return {**config, "message.max.bytes": limit}


def as_record(msg: Message) -> LogRecord:
    """A consumed message as the frozen record the rest of Runstream sees."""
    _, ts = msg.timestamp()
    raw = msg.headers() or ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    headers = tuple((k, v.encode() if isinstance(v, str) else v or b"") for k, v in pairs)
    return LogRecord(
        msg.topic() or "",
        msg.partition() or 0,
        msg.offset() or 0,
        msg.key(),
        msg.value(),
        headers,
        ts,
    )


def known_ends(topic: str, ends: dict[int, int]) -> dict[int, int]:
    """``ends`` if Kafka gave every partition's end offset; a negative one (no answer for
    it: a leader killed while asked) raises a transient error, to be asked again. Taken
    as an end, it made a restore read nothing and skip a predecessor's committed facts."""
    missing = sorted(p for p, o in ends.items() if o < 0)
    if missing:
        why = f"{topic}: no end offset for partitions {missing} (a leader moving?)"
        raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, why, retriable=True))
    return ends


def consume_records(consumer: Consumer, timeout: float, limit: int, what: str) -> list[LogRecord]:
    """`consume_ready`'s records; an error is logged (``what`` says whose), a fatal one
    raised as KafkaFatal, a session timeout the broker refuses as ConfigError."""
    records = []
    for msg in consume_ready(consumer, timeout, limit):
        err = msg.error()
        if err is None:
            records.append(as_record(msg))
        elif err.fatal() or err.code() == KafkaError._FATAL:  # dead for good: end, restart
            raise KafkaFatal(f"{what}: {err}")
        elif err.code() == KafkaError.INVALID_SESSION_TIMEOUT:  # it would never join
            raise ConfigError(
                f"{what}: the broker refuses the group session timeout (session_timeout_ms): "
                "it must lie within the broker's group.min.session.timeout.ms (6000 by "
                "default) and group.max.session.timeout.ms"
            )
        else:
            log.warning("%s: %s", what, err)
    return records


class KafkaLog(Transactions):
    """An engine instance's view of Kafka (see `topics.base.EngineLog`).

    Args:
        config: `client_config` plus the user's extra librdkafka settings.
        topics: the namespace's topic names.
        partitions: the namespace's partition count.
        instance_id: names the transactional id and the client ids.
        static: join the group with static membership (a restart keeps the partitions;
            a stop does not hand them over until the session times out).
    """

    def __init__(
        self,
        config: Config,
        topics: Topics,
        partitions: int,
        instance_id: str,
        *,
        static: bool,
        transaction_timeout_ms: int,
        group_session: Mapping[str, int],
        watchdog: Watchdog,
        limits: Limits,
        state_topic: str | None = None,
    ) -> None:
        self.topics, self.partitions, self.limits = topics, partitions, limits
        self.state_topic = state_topic
        self.watchdog = watchdog
        self._config = config
        ns = topics.ns
        self.config = config  # for the instance's other readers (`runstream.standby`)
        self.group_id, self.client_id = f"{ns}.engine", f"{ns}.engine.{instance_id}"
        self._instance_id = instance_id
        self._journal_ends: dict[int, int] = {}
        self._sent: dict[int, int] = {}  # the command offsets of the open transaction
        self._acked: dict[int, int] = {}  # each partition's committed offset, as last known
        # Each partition's next command offset the consumer may hand over: set by the
        # restore (`committed`) and the engine's rewinds (`seek`), moved by each command
        # handed over. An offset reset (an out-of-range fetch: earliest) reads the
        # partition again from its start, and what was handed over must not come twice.
        self._next: dict[int, int] = {}
        self.call_timeout = 30.0  # seconds a call to the coordinator waits (then: unknown)
        self._admin_client: AdminClient | None = None  # see `_admin`
        # The journal's evidence of each transaction (`topics.txn.evidence`): this life's
        # name, the last sequence number given, the open transaction's, and those of the
        # transactions that ended uncommitted since the last one that committed.
        self._writer = f"{instance_id}.{uuid.uuid4().hex[:8]}"
        self._seq, self._txn_seq, self._aborted = 0, 0, list[int]()
        self._parts: Collection[int] = ()
        self._headers: list[tuple[str, bytes]] | None = None
        # Two transactional producers take turns. A transaction's commit returns before the
        # coordinator has written its markers, and until then the same producer's next
        # transaction is refused (CONCURRENT_TRANSACTIONS; librdkafka has no KIP-890). The other
        # producer is not: measured on one broker, a 24-run transaction's commit p50 17 -> 14 ms,
        # p90 39 -> 24 ms. Transactions stay strictly sequential (the next begins once the
        # previous commit returned), so journal order and committed offsets keep their order.
        # The first id is the one engines before this change used: an upgrade fences it.
        configs = [
            {
                **config,
                "transactional.id": f"{ns}.engine.{instance_id}{suffix}",
                "transaction.timeout.ms": transaction_timeout_ms,
                "linger.ms": 1,
                # A refused AddPartitions is retried after retry.backoff.ms, which grows
                # exponentially (100 ms to 1 s by default): keep it short and capped.
                "retry.backoff.ms": 5,
                "retry.backoff.max.ms": 20,
                # Connect to the brokers at once: init_transactions asked before a broker is
                # up finds no one to ask for the coordinator and asks again only on
                # librdkafka's 500 ms timer (half of the restarts here waited it out).
                "enable.sparse.connections": False,
                "partitioner": "murmur2_random",
                "on_delivery": self._delivered,
            }
            for suffix in ("", ".b")
        ]
        self._producers = [(c, Producer(c)) for c in configs]  # the current one first
        self._consumer = Consumer(
            {
                **config,
                **({"group.instance.id": instance_id} if static else {}),
                "group.id": self.group_id,
                "client.id": self.client_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                **group_session,  # session timeout and heartbeat interval
                "fetch.wait.max.ms": 50,
            }
        )
        self._restorer = Consumer(
            {
                **config,
                "group.id": f"{ns}.restore",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                # A fetch refused as out of range (a leader killed mid-restore) must not
                # move the position: "latest" skipped facts (`_read_settled`).
                "auto.offset.reset": "error",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 50,
            }
        )

    def start(self, owner: Ownership, stopping: Callable[[], bool]) -> bool:
        """Fence older instances with our transactional id, then join the group.
        False if a stop was requested meanwhile."""
        deadline = time.monotonic() + 60
        waiting = [producer for _, producer in self._producers]
        while not stopping():
            try:
                while waiting:
                    waiting[0].init_transactions(1)  # short steps: stay stoppable
                    waiting.pop(0)  # done: initialising it again would be a _STATE error
                break
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or time.monotonic() > deadline:
                    raise KafkaFatal(f"cannot initialise transactions: {err}") from exc
        else:
            return False
        self._consumer.subscribe(
            [self.topics.commands],
            on_assign=lambda c, tps: self._assigned(owner, tps),
            on_revoke=lambda c, tps: owner.revoked([tp.partition for tp in tps], lost=False),
            on_lost=lambda c, tps: owner.revoked([tp.partition for tp in tps], lost=True),
        )
        return True

    def _assigned(self, owner: Ownership, tps: list[TopicPartition]) -> None:
        self._consumer.incremental_assign(tps)
        self._consumer.pause(tps)  # no commands until the projection has caught up
        owner.assigned([tp.partition for tp in tps])

    # -- consuming -------------------------------------------------------------------
    def poll(self, timeout: float, limit: int) -> list[LogRecord]:
        records = consume_records(self._consumer, timeout, limit, "consumer")
        nexts, fresh = self._next, []
        for rec in records:
            if rec.offset >= nexts.get(rec.partition, 0):
                nexts[rec.partition] = rec.offset + 1
                fresh.append(rec)
        if len(fresh) < len(records):
            log.warning(
                "consumer: %d commands read again after an offset reset skipped",
                len(records) - len(fresh),
            )
        return fresh

    def _tps(self, partitions: Iterable[int]) -> list[TopicPartition]:
        return [TopicPartition(self.topics.commands, p) for p in partitions]

    def pause(self, partitions: Iterable[int]) -> None:
        self._consumer.pause(self._tps(partitions))

    def resume(self, partitions: Iterable[int]) -> None:
        self._consumer.resume(self._tps(partitions))

    def seek(self, partition: int, offset: int) -> None:
        self._consumer.seek(TopicPartition(self.topics.commands, partition, offset))
        self._next[partition] = offset

    def fence_abandoned(self, partitions: Collection[int]) -> None:
        """Abort the open transactions of instances gone from the group that hold these
        journal partitions (`topics.fencing`): a takeover need not wait them out."""
        with self.watchdog.watch("fencing abandoned transactions", 75, DRAIN_GRACE):
            fence_abandoned(
                self._admin,
                self._config,
                self.topics.ns,
                self.topics.journal,
                partitions,
                self._instance_id,
            )

    def committed(self, partitions: Iterable[int]) -> dict[int, int]:
        """The next command offset of each partition (its first offset if none)."""
        # Waits while another instance's transaction holds offsets of these partitions
        # (KIP-447): only then is the journal's end final.
        out = self._asking(
            "committed",
            # A time-out here is as often an open transaction the fence did not find (its
            # instance alive, or gone with no journal record on the broker) as a broker
            # out of reach.
            "reading the group's committed offsets (an open transaction holding them "
            "delays them until it ends)",
            lambda: self._committed(partitions),
        )
        self._acked.update(out)
        self._next.update(out)
        return out

    def _asking(self, call: str, what: str, ask: Callable[[], T]) -> T:
        """``ask()``, asked again while Kafka's answer is `transient` (a broker paused, a
        coordinator or a leader moving); past a minute the instance ends with
        KafkaUnavailable, and its supervisor starts it again. A stop lets a question
        under way finish (`DRAIN_GRACE`): a restore then ends, and the partitions already
        owned are handed over instead of abandoned."""
        deadline = time.monotonic() + 60
        with self.watchdog.watch(call, 75, DRAIN_GRACE):
            while True:
                try:
                    return ask()
                except KafkaException as exc:
                    err = refused(self._config, what, exc)
                    if not isinstance(err, KafkaUnavailable) or time.monotonic() > deadline:
                        raise err from None
                    log.warning("%s; asking again", err)
                    time.sleep(0.2)

    def _committed(self, partitions: Iterable[int]) -> dict[int, int]:
        out = {}
        for tp in self._consumer.committed(self._tps(partitions), timeout=15):
            offset = tp.offset
            if offset < 0:  # nothing committed yet: the partition's first offset
                offset = self._consumer.get_watermark_offsets(tp, timeout=15)[0]
            out[tp.partition] = offset
        return out

    def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        # One request for them all (the consumer's watermarks ask once per partition: a
        # round trip each, most of a standby's takeover), read_committed as it reads.
        asked = list(partitions)
        return self._asking(
            "list_offsets",
            "reading the commands' end offsets",
            lambda: self._list_ends(self.topics.commands, asked, IsolationLevel.READ_COMMITTED),
        )

    def lag(self, positions: Mapping[int, int]) -> dict[int, int]:
        out = {}
        for tp in self._consumer.position(self._tps(positions)):
            high = self._consumer.get_watermark_offsets(tp, cached=True)[1]
            position = tp.offset if tp.offset >= 0 else positions[tp.partition]
            if high >= 0:  # fetched (OFFSET_INVALID is negative)
                out[tp.partition] = max(0, high - position)
        return out

    def read_journal(
        self,
        start: Mapping[int, int],
        stopping: Callable[[], bool],
        decided: Collection[int] = (),
    ) -> Iterator[LogRecord]:
        """The journal partitions from ``start`` to their end (read_committed).

        The end is the high watermark once the commands' committed offsets have settled
        (`committed`), not the first end of data met: a transaction's commit markers land
        on each partition independently, so the predecessor's offsets can be visible while
        its last facts still wait for their marker (the last stable offset stops before
        them). Reading on until the position passes that watermark waits for every
        transaction that wrote there before this instance took the partition to be
        decided (at worst, by the coordinator's abort at its transaction timeout).

        A partition in ``decided`` whose watermark is one past ``start`` is not read: the
        transaction that wrote the record before ``start`` is decided, so its marker is
        somewhere past that record; with one offset left, it is that offset, and nothing
        else can be there (the projection this instance's last life left current: `start`
        settled its producers' transactions).
        """
        return self._read_settled(self.topics.journal, start, stopping, decided=decided)

    def read_state(
        self, partitions: Collection[int], stopping: Callable[[], bool]
    ) -> Iterator[LogRecord]:
        """The snapshot topic's partitions from their start, to their end as
        `read_journal` finds it (a former owner's snapshot commits with its offsets)."""
        if self.state_topic is None:
            return iter(())
        return self._read_settled(self.state_topic, dict.fromkeys(partitions, 0), stopping, True)

    def _read_settled(
        self,
        journal: str,
        start: Mapping[int, int],
        stopping: Callable[[], bool],
        from_beginning: bool = False,
        decided: Collection[int] = (),
    ) -> Iterator[LogRecord]:
        ends = self._asking(
            "list_offsets",
            f"reading the end offsets of {journal}",
            lambda: self._high_watermarks(journal, list(start)),
        )
        open_partitions = {
            p for p, o in start.items() if o < ends[p] and not (p in decided and ends[p] == o + 1)
        }
        if not open_partitions:  # nothing to fetch: no consumer round trip
            return
        # Where each partition's read goes on from: the restorer's position moves only
        # by what it yields (never by an offset reset: see `_refetch`).
        next_at = {p: OFFSET_BEGINNING if from_beginning else start[p] for p in start}
        refetches = 0

        def assign() -> None:
            self._restorer.assign([TopicPartition(journal, p, next_at[p]) for p in open_partitions])

        assign()
        try:
            while open_partitions and not stopping():
                for msg in consume_ready(self._restorer, 0.5, 2000):
                    err, p = msg.error(), msg.partition() or 0
                    if err is None:
                        yield as_record(msg)
                        next_at[p] = (msg.offset() or 0) + 1
                        if next_at[p] >= ends[p]:
                            open_partitions.discard(p)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        if (msg.offset() or 0) >= ends[p]:  # past markers and aborted data
                            open_partitions.discard(p)
                    elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                        if p not in open_partitions:  # read to its end already
                            continue
                        refetches += 1
                        self._refetch(journal, p, next_at[p], refetches, err)
                        assign()
                        break  # what was consumed with it came from the old assignment
                    elif transient(err):  # a leader moving: the consumer fetches again
                        log.warning("reading %s: %s", journal, err)
                    else:
                        raise KafkaFatal(f"reading {journal}: {err}")
        finally:
            self._restorer.unassign()

    def _refetch(self, topic: str, p: int, offset: int, times: int, err: KafkaError) -> None:
        """A fetch of ``topic`` partition ``p`` at ``offset`` was refused as out of range.
        A leader that moves (a broker killed in a restore) can refuse one for a moment:
        the read asks again from the same offset. Records deleted before it (retention
        on the journal, which must keep all) are facts lost: KafkaFatal says so."""
        try:
            low, _ = self._restorer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
        except KafkaException:
            low = OFFSET_BEGINNING  # no answer now: ask the partition again
        if offset >= 0 and low > offset:
            raise KafkaFatal(
                f"reading {topic}: partition {p} now begins at offset {low}, past offset "
                f"{offset} this restore needs: its records were deleted (the journal must "
                "keep every record: retention.ms=-1)"
            )
        if times > 100:
            raise KafkaFatal(f"reading {topic}: partition {p} refused at offset {offset}: {err}")
        log.warning(
            "reading %s: partition %d: %s; fetching again from offset %d",
            topic,
            p,
            err.str(),
            offset,
        )
        time.sleep(0.2)

    def _high_watermarks(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """Each partition's high watermark, past every record written, committed or not (a
        read_committed consumer's watermarks stop at the last stable offset)."""
        return self._list_ends(topic, partitions, IsolationLevel.READ_UNCOMMITTED)

    def _list_ends(
        self, topic: str, partitions: list[int], level: IsolationLevel
    ) -> dict[int, int]:
        """Each partition's end offset as a consumer at ``level`` sees it, in one request."""
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        asked = {TopicPartition(topic, p): latest for p in partitions}

        def ask() -> dict[int, int]:
            futures = self._admin().list_offsets(asked, isolation_level=level, request_timeout=30)
            return {tp.partition: int(f.result().offset) for tp, f in futures.items()}

        try:
            return known_ends(topic, ask())
        except KafkaException as exc:
            # A client kept across a broker's restart asks with stale metadata and is
            # refused (FENCED_LEADER_EPOCH, as the chaos test found): a new one asks next,
            # at once unless the refusal is one to wait out (`_asking` asks again).
            self._admin_client = None
            if transient(exc.args[0]):
                raise
            return known_ends(topic, ask())

    def _admin(self) -> AdminClient:
        """The admin client of the restore's questions, kept: a new client's first
        ListOffsets looks its leaders up on a slow path (3 s in a quarter of the cases
        measured on a local broker); a metadata request first avoids it."""
        if self._admin_client is None:
            admin = AdminClient(dict(self._config))
            for topic in (self.topics.commands, self.topics.journal):
                admin.list_topics(topic, timeout=10)
            self._admin_client = admin
        return self._admin_client

    # -- the transactional writer (what its errors mean: `topics.txn`) -----------------
    @property
    def _producer(self) -> Producer:
        return self._producers[0][1]

    def begin(self, journal_partitions: Collection[int] = ()) -> None:
        self._journal_ends.clear()
        self._sent, self._parts, self._headers, self._txn_seq = {}, journal_partitions, None, 0
        self._producers.reverse()  # take turns (see __init__)
        self._must("begin_transaction", self._producer.begin_transaction)

    def produce(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        if topic == self.topics.journal:
            kwargs["headers"] = self._evidence()
        elif headers:
            kwargs["headers"] = list(headers)
        try:
            self._produce(topic, kwargs)
        except KafkaException as exc:  # rare: off the fast path
            err = exc.args[0]
            action = classify("produce", err)
            if action is Action.RETRY:
                self._transact("produce", lambda: self._produce(topic, kwargs))
            else:
                self._act("produce", action, err)

    def _evidence(self) -> list[tuple[str, bytes]]:
        """The headers of the open transaction's journal records; the first one gives
        the transaction its sequence number."""
        if self._headers is None:
            self._seq += 1
            self._txn_seq = self._seq
            self._headers = evidence(self._writer, self._seq, self._parts, self._aborted)
        return self._headers

    def _produce(self, topic: str, kwargs: dict[str, Any]) -> None:
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:  # the local queue is full: let librdkafka send some
                self._producer.poll(0.05)

    def send_offsets(self, offsets: Mapping[int, int]) -> None:
        """Commit these next command offsets with the transaction (KIP-447 fencing)."""
        self._sent = dict(offsets)
        tps = [TopicPartition(self.topics.commands, p, o) for p, o in offsets.items()]
        metadata = self._consumer.consumer_group_metadata()
        self._transact(
            "send_offsets_to_transaction",
            lambda: self._producer.send_offsets_to_transaction(tps, metadata, self.call_timeout),
        )

    def commit(self) -> dict[int, int]:
        """Commit; the journal's end offset per partition written."""
        self._transact(
            "commit_transaction", lambda: self._producer.commit_transaction(self.call_timeout)
        )
        self._acked.update(self._sent)
        if self._txn_seq:  # its journal records named the aborted ones
            self._aborted = []
        return dict(self._journal_ends)

    def _abort_call(self) -> None:
        self._producer.abort_transaction(self.call_timeout)

    def _not_committed(self) -> None:
        if self._txn_seq:
            self._aborted.append(self._txn_seq)

    def _recreate(self) -> None:
        """A new producer with the current one's transactional id. The old one is dropped
        without a call that would abort or flush (its outcome is unknown); the new one's
        init_transactions waits until the open transaction has ended and fences it."""
        config, old = self._producers[0]
        with self.watchdog.watch("dropping the producer", 45):
            old.purge(in_queue=True, in_flight=True, blocking=False)
            del old
            self._producers[0] = (config, Producer(config))  # the last reference goes
        self._must("init_transactions", lambda: self._producer.init_transactions(30), 75)

    def _rewind(self) -> None:
        """Seek every assigned command partition to the group's committed offset."""
        assigned = [tp.partition for tp in self._consumer.assignment()]
        if not assigned:
            return
        for p, offset in self.committed(assigned).items():
            try:
                self.seek(p, offset)
            except KafkaException as exc:  # not fetching yet: it starts there anyway
                log.debug("rewinding partition %d: %s", p, exc.args[0])

    def _landed(self) -> bool:
        """Whether the transaction just ended by a recreation committed: a command offset
        it moved is the group's now, or else the last journal record it wrote is visible
        (read_committed). A transaction that did neither is taken as not committed."""
        moved = {p: o for p, o in self._sent.items() if self._acked.get(p) != o}
        if moved:
            now = self.committed(moved)
            landed = any(now[p] == o for p, o in moved.items())
        elif self._journal_ends:
            p, end = max(self._journal_ends.items())
            landed = False
            for record in self.read_journal({p: end - 1}, _never):  # its first record only
                landed = record.offset == end - 1
                break
        else:
            landed = False
        if landed:
            self._acked.update(self._sent)
        return landed

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        # A failed delivery needs nothing here: commit_transaction then fails as abortable.
        if err is None and msg.topic() == self.topics.journal:
            p, end = msg.partition() or 0, (msg.offset() or 0) + 1
            if end > self._journal_ends.get(p, 0):
                self._journal_ends[p] = end

    def close(self) -> None:
        """Leave (a dynamic member) and release every client. Never raises: it runs on the
        way out, often because of the error that is the real news (a fenced producer)."""
        for what, close in (
            ("consumer", self._consumer.close),
            ("restorer", self._restorer.close),
            *(("producer", lambda p=p: p.flush(1)) for _, p in self._producers),
        ):
            try:
                close()  # the consumer's on_revoke releases the projections
            except KafkaException as exc:
                log.debug("closing the %s: %s", what, exc.args[0])


class CommandSender:
    """The client's producer of commands (idempotent, Kafka's partitioner)."""

    def __init__(self, config: Config, send_timeout: float) -> None:
        self.bootstrap, self._config = str(config["bootstrap.servers"]), config
        self._producer = Producer(
            {
                **config,
                "enable.idempotence": True,
                "linger.ms": 0,
                "partitioner": "murmur2_random",
                "message.timeout.ms": int(send_timeout * 1000),
            }
        )
        self._undelivered: list[str] = []

    def partitions(self, topic: str, timeout: float) -> int | None:
        """``topic``'s partition count, None if it does not exist. KafkaUnavailable if no
        broker answers within ``timeout``."""
        try:
            md = self._producer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            self._producer.poll(0)  # serve librdkafka's log lines
            raise KafkaUnavailable(
                self.bootstrap,
                f"no broker answered within {timeout:g}s",
                last_error() or str(exc.args[0]),
            ) from None
        check_authorized(self._config, f"topic {topic}", md and md.error)
        if md is None or md.error is not None or not md.partitions:
            return None
        return len(md.partitions)

    def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes,
        what: str,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._undelivered.append(f"{what}: {err.str()}")

        kwargs: dict[str, Any] = {"partition": partition, "on_delivery": delivered}
        if headers:
            kwargs["headers"] = headers
        try:
            self._producer.produce(topic, value, key, **kwargs)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise PayloadTooLarge(
                    f"{what} is {len(value):,} bytes, more than Kafka takes (message.max.bytes)"
                ) from None
            raise CommandNotDelivered(f"{what}: {err.str()}") from None
        except BufferError:
            self._producer.poll(1)
            self._producer.produce(topic, value, key, **kwargs)
        self._producer.poll(0)

    def flush(self, timeout: float) -> None:
        """Wait until Kafka took every command; raise CommandNotDelivered for any it refused."""
        if self._producer.flush(timeout) > 0:
            raise CommandNotDelivered(
                f"Kafka at {self.bootstrap} did not acknowledge the "
                f"commands within {timeout:g}s (still retrying)"
            )
        if self._undelivered:
            lost, self._undelivered = self._undelivered, []
            raise CommandNotDelivered(f"Kafka did not take {len(lost)} command(s): {lost[:5]}")

    def close(self, timeout: float) -> None:
        try:
            self.flush(timeout)
        finally:
            self._producer.purge()  # nothing may be sent after close


class Listener:
    """A reader of given topic partitions from fixed offsets (the client's answers)."""

    def __init__(self, config: Config, group_id: str) -> None:
        self._bootstrap = str(config["bootstrap.servers"])
        self._consumer = Consumer(
            {
                **config,
                "group.id": group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 5,
            }
        )

    def end_offset(self, topic: str, partition: int) -> int:
        """The partition's end now: reading from there misses nothing produced later.
        (Right after the topic was created its leader may not be known for a moment.)

        Raises:
            KafkaUnavailable: no broker answers.
        """
        tp = TopicPartition(topic, partition)
        for _ in range(20):
            try:
                return int(self._consumer.get_watermark_offsets(tp, 10)[1])
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
                    raise KafkaUnavailable(
                        self._bootstrap, f"reading the end of {topic}", last_error() or err.str()
                    ) from None
                if not err.retriable() and err.code() not in _LEADER_MOVES:
                    raise KafkaFatal(f"reading the end of {topic}: {err}") from None
                time.sleep(0.1)
        return OFFSET_END

    def add(self, topic: str, partition: int, offset: int) -> None:
        self._consumer.incremental_assign([TopicPartition(topic, partition, offset)])

    def poll(self, timeout: float) -> list[LogRecord]:
        return [as_record(m) for m in consume_ready(self._consumer, timeout) if m.error() is None]

    def close(self) -> None:
        self._consumer.close()


def read_to_end(
    config: Config,
    topic: str,
    *,
    idle_timeout: float = 30.0,
    batch: int = 10_000,
    partitions: Iterable[int] | None = None,
) -> Iterator[list[LogRecord]]:
    """Every committed record of ``topic`` (of those of its ``partitions`` that exist,
    default all) from its start to its end, in batches.

    Raises:
        KafkaUnavailable: no broker answers.
        KafkaNotAuthorized: the ACLs hide the topic from this client.
        LookupError: the topic does not exist.
        TimeoutError: no record and no end of partition for ``idle_timeout`` seconds.
    """
    consumer = Consumer(
        {
            **config,
            "group.id": f"runstream.reader.{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # A fetch refused as out of range (a leader moving) starts the partition
            # again from its start, never at its end: "latest" would cut the read short.
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
        }
    )
    try:
        try:
            md = consumer.list_topics(topic, timeout=30).topics.get(topic)
        except KafkaException as exc:
            raise KafkaUnavailable(
                str(config["bootstrap.servers"]), "listing topics", last_error() or str(exc.args[0])
            ) from None
        check_authorized(config, f"topic {topic}", md and md.error)
        if md is None or md.error is not None or not md.partitions:
            raise LookupError(f"topic {topic!r} does not exist")
        parts = sorted(
            md.partitions if partitions is None else set(partitions) & set(md.partitions)
        )
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        at_end: set[int] = set()
        read_to: dict[int, int] = {}  # each partition's next offset: a reset reads again
        idle_since = time.monotonic()
        while len(at_end) < len(parts):
            msgs = consume_ready(consumer, 0.5, batch)
            if not msgs:
                if time.monotonic() - idle_since > idle_timeout:
                    raise TimeoutError(f"no record nor end of {topic} for {idle_timeout:g}s")
                continue
            idle_since = time.monotonic()
            out = []
            for msg in msgs:
                err, p, offset = msg.error(), msg.partition() or 0, msg.offset() or 0
                if err is None:
                    if offset >= read_to.get(p, 0):
                        out.append(as_record(msg))
                        read_to[p] = offset + 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
                else:
                    raise KafkaFatal(f"reading {topic}: {err}")
            if out:
                yield out
    finally:
        consumer.close()
