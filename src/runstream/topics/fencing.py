"""Abort a dead instance's open transaction at a takeover, instead of waiting it out.

An instance killed inside a transaction leaves it open: until the coordinator aborts it
(``transaction.timeout.ms`` after it began, at the broker's next check, every 10 s by
default), its journal records hold each partition's last stable offset, and a new owner
reading that journal to its end waits. Its transactional ids are known (every journal
record names its writer, `topics.txn.evidence`), so the new owner fences them: a
producer with the same transactional id calling ``init_transactions`` makes the
coordinator abort the open transaction at once (Kafka's zombie fencing).

Only an instance that is no longer in the engine's consumer group is fenced: a live one
finishes its own transaction (a cooperative handover waits for it). An instance
restarted under the same id between the look at the group and the fence is fenced
too: it ends ("fenced") and its supervisor starts it again; nothing committed is lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from runstream.errors import RunstreamError
from runstream.topics.admin import Config
from runstream.topics.groups import assignments
from runstream.topics.txn import WRITER

__all__ = ["abandoned", "fence_abandoned", "instance_of", "transactional_ids"]

log = logging.getLogger(__name__)

_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]


def transactional_ids(ns: str, instance_id: str) -> list[str]:
    """The transactional ids of an engine instance's two producers (`KafkaLog`)."""
    return [f"{ns}.engine.{instance_id}{suffix}" for suffix in ("", ".b")]


def instance_of(writer: str) -> str:
    """The instance id in a journal record's writer header (``<instance>.<life>``)."""
    return writer.rsplit(".", 1)[0]


def abandoned(writers: Collection[str], members: Collection[str], ns: str, own: str) -> set[str]:
    """The instances among ``writers`` (writer headers) that may be fenced: not this one,
    and not a live member of the group (``members``: their client ids)."""
    return {
        instance
        for instance in map(instance_of, writers)
        if instance != own and f"{ns}.engine.{instance}" not in members
    }


def fence_abandoned(
    admin: Callable[[], AdminClient],
    config: Config,
    ns: str,
    journal: str,
    partitions: Collection[int],
    own: str,
    timeout: float = 5.0,
) -> set[str]:
    """Fence the instances whose open transactions hold ``partitions`` of the journal and
    that are no longer in the group; the instances fenced (``admin()`` asks the journal's
    ends). Never raises: a failure leaves the transaction to its timeout, as before
    (logged)."""
    try:
        writers = _open_transaction_writers(admin(), config, journal, partitions, timeout)
        if not writers:
            return set()
        members = assignments(config, f"{ns}.engine", journal, timeout)  # by client id
        dead = abandoned(writers.values(), members, ns, own)
        for instance in sorted(dead):
            for tid in transactional_ids(ns, instance):
                Producer({**config, "transactional.id": tid}).init_transactions(timeout)
        if dead:
            held = sorted(p for p, w in writers.items() if instance_of(w) in dead)
            log.info("fenced %s: their open transactions held journal %s", sorted(dead), held)
        return dead
    except (KafkaException, RunstreamError) as exc:
        log.warning("fencing abandoned transactions: %s; waiting them out", exc)
        return set()


def _open_transaction_writers(
    admin: AdminClient, config: Config, journal: str, partitions: Collection[int], timeout: float
) -> dict[int, str]:
    """The writer of the oldest open transaction of each partition that has one: the
    record at its last stable offset (read_uncommitted)."""
    asked = {TopicPartition(journal, p): _LATEST for p in partitions}
    ends = {}
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        futures = admin.list_offsets(asked, isolation_level=level, request_timeout=timeout)
        ends[level] = {tp.partition: int(f.result().offset) for tp, f in futures.items()}
    stable, high = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
    held = {p: stable[p] for p in partitions if stable[p] < high[p]}
    if not held:
        return {}
    peek = Consumer(
        {
            **config,
            "group.id": f"{journal}.fence",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            "auto.offset.reset": "error",
        }
    )
    writers: dict[int, str] = {}
    pending, deadline = dict(held), time.monotonic() + timeout
    try:
        peek.assign([TopicPartition(journal, p, o) for p, o in held.items()])
        while pending and (left := deadline - time.monotonic()) > 0:
            msg = peek.poll(min(0.5, left))
            if msg is None or (p := msg.partition() or 0) not in pending:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                del pending[p]  # at its end with no record: decided meanwhile
            else:  # its first record from there: the oldest open transaction's
                del pending[p]
                header = dict(msg.headers() or ()).get(WRITER)
                writers[p] = header.decode() if isinstance(header, bytes) else ""
    finally:
        peek.close()
    return {p: w for p, w in writers.items() if w}
