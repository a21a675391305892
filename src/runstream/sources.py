"""Source forwarders: records of Kafka topics become named events, exactly once.

Teams publish domain events to topics of their own (``orders``, keyed by order id, in
their own format). ``app.source("orders", key=..., decode=...)`` declares such a topic;
a `SourceForwarder` (``runstream sources serve MODULE:APP``) reads every source topic of
the App, and ``<ns>.events``, where any service may publish an event as JSON, and turns
each record into the `PublishEvent` command `Client.publish` would send, to the
partition of its correlation entity. The engine takes it from there: ``on_event``
triggers and ``wait_for_event`` waits work as for a published event.

**Exactly once per record.** Per batch the forwarder opens a Kafka transaction,
produces each record's command (or its dead letter), sends the source offsets after the
batch with the consumer group's metadata, and commits (`topics.sourcelog`). A crash
before the commit leaves nothing visible and the batch is read again; after it, the
offsets say the batch is done. The event id is ``<topic>:<partition>:<offset>``, so even
a record forwarded twice would be one event to its entity, which keeps the ids it saw,
and a trigger without ``key`` starts the same run id for it.

A record that cannot be decoded or keyed, or whose event would be too large, goes to
``<ns>.dlq`` with the reason (`route`); the records after it go on.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runstream.engine import payload
from runstream.engine.decide import dead_letter
from runstream.engine.limits import Limits
from runstream.engine.partitioner import partition_for
from runstream.engine.work import LogRecord
from runstream.engine.workflow import SourceDef, seconds
from runstream.errors import DecodeError, SchemaError
from runstream.schemas.codec import Codec
from runstream.schemas.records import DeadLetter, Event, PublishEvent, Reason, correlation_id
from runstream.settings import Settings
from runstream.supervisor import stop_on_signals
from runstream.topics.base import TransactionAborted
from runstream.topics.sourcelog import SourceLog, open_source_log
from runstream.topics.spec import Topics
from runstream.topics.watchdog import Watchdog

if TYPE_CHECKING:
    from runstream.app import App

log = logging.getLogger("runstream.sources")

#: How long the loop waits for the first record of a batch (s): a stop takes that long.
POLL = 0.5


@dataclass(frozen=True, slots=True)
class Routed:
    """What one source record becomes: its event's command, or its dead letter, and
    where it goes."""

    record: PublishEvent | DeadLetter
    topic: str
    partition: int | None  # None: Kafka's partitioner, by the key
    key: bytes | None
    value: bytes


class _Refused(Exception):
    """Why a record cannot become an event: its dead letter's code and reason."""

    def __init__(self, code: Reason, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


def route(
    rec: LogRecord,
    source: SourceDef | None,
    *,
    topics: Topics,
    partitions: int,
    limits: Limits,
    codec: Codec,
    now_ms: int,
) -> Routed:
    """The command (to ``<ns>.commands``, at its entity's partition among
    ``partitions``) or the dead letter (to ``<ns>.dlq``) of ``rec``, a record of the
    topic of ``source``, or of ``<ns>.events`` when ``source`` is None. Pure: the same
    record always gives the same command."""
    where = f"{rec.topic} [{rec.partition}] at offset {rec.offset}"
    try:
        if source is None:
            name, key, data, event_id, ttl_ms = _envelope(rec, codec)
        else:
            name, key, data, event_id, ttl_ms = _decoded(rec, source)
        try:
            corr = correlation_id(name, key)
        except UnicodeEncodeError:
            why = f"its event's name or key {key!r} holds a lone surrogate (not UTF-8)"
            raise _Refused(Reason.UNENCODABLE, why) from None
        cmd = PublishEvent(
            corr,
            name,
            event_id=event_id or f"{rec.topic}:{rec.partition}:{rec.offset}",
            payload=data,
            key=key,
            ttl_ms=ttl_ms,
            sent_at_ms=max(rec.timestamp_ms, 0),  # -1: the record has none
        )
        try:
            value = codec.encode(cmd)
        except SchemaError as exc:
            raise _Refused(Reason.UNENCODABLE, str(exc)) from None
        too_large = limits.too_large(f"its event {name!r}", len(value))
        if too_large:
            raise _Refused(Reason.OVERSIZE, too_large)
    except _Refused as refused:
        letter = dead_letter(rec, refused.code, limits.clip(f"{where}: {refused}"), limits, now_ms)
        # keyed by the original key, unless it is too large to copy (`dead_letter`)
        return Routed(letter, topics.dlq, None, letter.key, codec.encode(letter))
    key_bytes = cmd.run_id.encode()
    return Routed(cmd, topics.commands, partition_for(key_bytes, partitions), key_bytes, value)


def _decoded(rec: LogRecord, source: SourceDef) -> tuple[str, str, bytes, None, int]:
    """A team's record: its value decoded by the source, keyed by its function."""
    try:
        value = source.decode(rec.value)  # type: ignore[arg-type]  # a tombstone fails here
    except Exception as exc:
        raise _Refused(Reason.UNDECODABLE, f"cannot decode it: {exc!r}") from None
    if source.key is None:
        try:
            key = "" if rec.key is None else rec.key.decode()
        except UnicodeDecodeError:
            raise _Refused(Reason.UNDECODABLE, "its Kafka key is not UTF-8 text") from None
    else:
        try:
            found = source.key(value)
        except Exception as exc:  # user code: its failure must not block the partition
            raise _Refused(Reason.INVALID_INPUT, f"its key function failed: {exc!r}") from None
        if found is None:
            raise _Refused(Reason.INVALID_INPUT, "its key function returned None")
        key = str(found)
    return source.name, key, _json(value), None, int(source.ttl * 1000)


def _envelope(rec: LogRecord, codec: Codec) -> tuple[str, str, bytes, str | None, int]:
    """A record of ``<ns>.events``: a JSON object ``{"name", "key", "payload",
    "event_id", "ttl"}``, or a `PublishEvent` (or a keyless `Event`) in Avro
    single-object encoding."""
    raw = rec.value or b""
    if raw[:2] == b"\xc3\x01":
        try:
            cmd = codec.decode(raw)
        except DecodeError as exc:
            raise _Refused(Reason.UNDECODABLE, str(exc)) from None
        if not isinstance(cmd, PublishEvent | Event):
            raise _Refused(Reason.NOT_A_COMMAND, f"a {cmd.AVRO}, not a PublishEvent or an Event")
        try:
            json.loads(cmd.payload)
        except ValueError:
            raise _Refused(Reason.UNDECODABLE, "its payload is not UTF-8 JSON") from None
        if isinstance(cmd, Event):  # the older schema declared for this topic: no key
            return cmd.name, "", cmd.payload, cmd.event_id or None, 0
        return cmd.name, cmd.key, cmd.payload, cmd.event_id or None, cmd.ttl_ms
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise _Refused(Reason.UNDECODABLE, f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _Refused(Reason.UNDECODABLE, "not a JSON object")
    name, key, event_id = doc.get("name"), doc.get("key", ""), doc.get("event_id")
    if not isinstance(name, str) or not name:
        raise _Refused(Reason.UNDECODABLE, '"name" must be a non-empty string')
    if not isinstance(key, str | int) or isinstance(key, bool):
        raise _Refused(Reason.UNDECODABLE, '"key" must be a string (or an integer)')
    if event_id is not None and (not isinstance(event_id, str) or not event_id):
        raise _Refused(Reason.UNDECODABLE, '"event_id" must be a non-empty string')
    try:
        ttl = seconds(doc.get("ttl", 0))
    except (TypeError, ValueError) as exc:
        raise _Refused(Reason.UNDECODABLE, f'"ttl": {exc}') from None
    if ttl < 0:
        raise _Refused(Reason.UNDECODABLE, '"ttl" must not be negative')
    return name, str(key), _json(doc.get("payload")), event_id, int(ttl * 1000)


def _json(value: Any) -> bytes:
    try:
        return payload.dumps(value)
    except Exception as exc:  # not JSON, or text UTF-8 cannot carry
        raise _Refused(Reason.UNDECODABLE, f"its value is not JSON: {exc}") from None


class SourceForwarder:
    """Forwards the records of ``app``'s source topics and of ``<ns>.events`` as named
    events, exactly once each, until stopped.

    ``run()`` blocks until SIGTERM/SIGINT (in the main thread) or ``stop()``; the batch
    under way is committed first. Run as many as you like: they share the partitions
    of the source topics through the consumer group ``<ns>.sources``. Give each a
    stable ``instance_id`` (settings): it names its transactional id.
    """

    def __init__(self, app: App, settings: Settings | None = None) -> None:
        self.app = app
        self.settings = s = (settings or Settings()).with_bootstrap(app.bootstrap)
        self.topics = Topics(app.namespace)
        self.instance_id = s.instance_id or f"{socket.gethostname()}-{os.getpid()}"
        self.sources: dict[str, SourceDef | None] = {self.topics.events: None}
        self.sources.update(app.registry.sources)
        self.codec = Codec.default()
        self.stats: Counter[str] = Counter()  # forwarded, dead_letters, batches, redone
        self._stopping = threading.Event()
        self._watchdog = Watchdog(s.exit_on_hang)

    def stop(self) -> None:
        """Ask the forwarder to stop (thread-safe) once its batch is committed."""
        self._stopping.set()
        self._watchdog.stop_requested()

    def run(self) -> None:
        """Connect (waiting out an outage or a missing topic), then forward until stopped."""
        if threading.current_thread() is threading.main_thread():
            stop_on_signals(self.stop)
        sl = open_source_log(
            self.settings,
            self.topics,
            list(self.sources),
            self.instance_id,
            self._watchdog,
            self._stopping.is_set,
        )
        if sl is None:
            return
        try:
            if not sl.start(self._stopping.is_set):
                return
            log.info(
                "source forwarder %s of %s: %s",
                self.instance_id,
                self.app.namespace,
                ", ".join(self.sources),
            )
            while not self._stopping.is_set():
                self._batch(sl)
        finally:
            sl.close()
            log.info("source forwarder %s stopped: %s", self.instance_id, dict(self.stats))

    def _batch(self, sl: SourceLog) -> None:
        """Forward what one poll brings, in one transaction; redone if it aborts."""
        records = sl.poll(POLL, self.settings.batch_size)
        if not records:
            return
        now = time.time_ns() // 1_000_000
        routed = [
            route(
                rec,
                self.sources.get(rec.topic),
                topics=self.topics,
                partitions=sl.partitions,
                limits=sl.limits,
                codec=self.codec,
                now_ms=now,
            )
            for rec in records
        ]
        offsets = {(rec.topic, rec.partition): rec.offset + 1 for rec in records}
        try:
            sl.begin()
            for r in routed:
                sl.produce(r.topic, r.partition, r.key, r.value)
            sl.commit(offsets)
        except TransactionAborted as exc:  # the consumer is rewound: the batch comes again
            log.warning("forwarding %d records: %s; again", len(records), exc)
            self.stats["redone"] += 1
            return
        letters = [r.record for r in routed if isinstance(r.record, DeadLetter)]
        for letter in letters:
            log.warning("dead-lettered (%s): %s", letter.code, letter.reason)
        self.stats.update(
            forwarded=len(routed) - len(letters), dead_letters=len(letters), batches=1
        )
