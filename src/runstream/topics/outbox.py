"""Where each effect of a decided batch goes: its topic, partition, key and bytes.

Facts, lifecycle events and self-addressed commands go to the partition of their run
(journal and commands are co-partitioned, and lifecycle follows them); replies and dead
letters to the partition Kafka's partitioner picks for their key. `commit` produces them
and the consumed offsets in one transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

from runstream.engine import blobs
from runstream.engine.interceptors import record_headers
from runstream.engine.partitioner import partition_for
from runstream.engine.work import Batch
from runstream.schemas.codec import Codec
from runstream.topics.base import EngineLog, TransactionAborted
from runstream.topics.lifecycle_wire import Wire
from runstream.topics.spec import Topics

log = logging.getLogger("runstream.worker")


class Committed(NamedTuple):
    encoded: dict[str, list[bytes]]  # each run's facts as produced (the projection's rows)
    ends: dict[int, int]  # the journal's end per partition written


class Out(NamedTuple):
    topic: str
    partition: int | None  # None: the producer's partitioner (murmur2) decides
    key: bytes | None
    value: bytes | None  # None: a tombstone (a purged run's snapshot keys)
    headers: tuple[tuple[str, bytes], ...] = ()  # a task's: its interceptor headers


def outbox(
    b: Batch, topics: Topics, codec: Codec, partitions: int, lifecycle: Wire | None = None
) -> tuple[list[Out], dict[str, list[bytes]]]:
    """The records of ``b``, and each run's facts as encoded (the projection stores them).
    The decision guard encoded most of them already (`engine.decide`): each is encoded once.
    ``lifecycle`` rewrites lifecycle events in the namespace's format (`lifecycle_wire`)."""
    fx = b.effects
    fx.encode(codec.encode)  # what no decision produced: the replies to waiters, ...
    wire = fx.encoded
    out: list[Out] = []
    encoded: dict[str, list[bytes]] = {}
    for fact, data in zip(fx.facts, wire.facts, strict=True):
        encoded.setdefault(fact.run_id, []).append(data)
        out.append(Out(topics.journal, b.partition_of(fact.run_id), fact.run_id.encode(), data))
    for task, data in zip(fx.tasks, wire.tasks, strict=True):  # spread over the group's workers
        headers = tuple(record_headers(task.headers))  # traceparent, for any consumer
        out.append(Out(topics.tasks(task.group), None, task.run_id.encode(), data, headers))
    for ev, data in zip(fx.lifecycle, wire.lifecycle, strict=True):
        data = data if lifecycle is None else lifecycle(ev, data)
        out.append(Out(topics.lifecycle, b.partition_of(ev.run_id), ev.run_id.encode(), data))
    for cmd, data in zip(fx.commands, wire.commands, strict=True):
        key = cmd.run_id.encode()
        out.append(Out(topics.commands, partition_for(key, partitions), key, data))
    for (reply_to, _), data in zip(fx.replies, wire.replies, strict=True):
        out.append(Out(topics.replies, None, reply_to.encode(), data))
    for letter, data in zip(fx.dead_letters, wire.dead_letters, strict=True):
        key = letter.key if letter.key is not None else (letter.run_id or "").encode()
        out.append(Out(topics.dlq, None, key, data))
    for fw in fx.forwards:
        out.append(Out(topics.commands, fw.partition, fw.key, fw.value))
    for blob in fx.blobs:  # in the transaction of the facts that reference them
        p = blobs.partition_of(blob.ref, partitions)  # the blobs topic has as many
        for i, chunk in enumerate(blob.chunks):
            out.append(Out(topics.blobs, p, blob.ref.key(i), chunk))
    return out, encoded


def commit(
    engine_log: EngineLog,
    b: Batch,
    topics: Topics,
    codec: Codec,
    position: Callable[[int], int],
    lifecycle: Wire | None = None,
    extra: Sequence[Out] = (),
) -> Committed | None:
    """Produce everything ``b`` decided and commit it with the consumed offsets, in one
    transaction; None when it did not commit (aborted, or its outcome was unknown and it
    turned out not to have committed): the batch is then redone.
    ``position(p)`` is the next command offset of an owned partition ``b`` did not consume.
    ``extra`` records (a snapshot's, to owned partitions) go in the same transaction."""
    records, encoded = outbox(b, topics, codec, engine_log.partitions, lifecycle)
    records += extra
    journal = {b.partition_of(f.run_id) for f in b.effects.facts}
    try:
        engine_log.begin(journal)
        for record in records:
            engine_log.produce(*record)
        # Offsets of every partition this transaction writes to, consumed from or not:
        # the group generation they carry fences a zombie that lost p (KIP-447).
        snapshot = {o.partition for o in extra if o.partition is not None}
        written = journal | b.consumed.keys() | snapshot
        engine_log.send_offsets(
            {p: b.consumed[p][1] + 1 if p in b.consumed else position(p) for p in written}
        )
        ends = engine_log.commit()
    except TransactionAborted as exc:  # ended by the log, which rewound the consumer
        log.warning("transaction aborted (%s); redoing the batch", exc)
        return None
    return Committed(encoded, ends)
