"""Where each effect of a decided batch goes: its topic, partition, key and bytes.

Facts, lifecycle events and self-addressed commands go to the partition of their run
(journal and commands are co-partitioned, and lifecycle follows them); replies and dead
letters to the partition Kafka's partitioner picks for their key.
"""

from __future__ import annotations

from typing import NamedTuple

from runstream.engine.partitioner import partition_for
from runstream.engine.work import Batch
from runstream.schemas.codec import Codec
from runstream.topics.spec import Topics


class Out(NamedTuple):
    topic: str
    partition: int | None  # None: the producer's partitioner (murmur2) decides
    key: bytes | None
    value: bytes


def outbox(
    b: Batch, topics: Topics, codec: Codec, partitions: int
) -> tuple[list[Out], dict[str, list[bytes]]]:
    """The records of ``b``, and each run's facts as encoded (the projection stores them)."""
    fx, encode = b.effects, codec.encode
    out: list[Out] = []
    encoded: dict[str, list[bytes]] = {}
    for fact in fx.facts:
        data = encode(fact)
        encoded.setdefault(fact.run_id, []).append(data)
        out.append(Out(topics.journal, b.partition_of(fact.run_id), fact.run_id.encode(), data))
    for ev in fx.lifecycle:
        out.append(Out(topics.lifecycle, b.partition_of(ev.run_id), ev.run_id.encode(), encode(ev)))
    for cmd in fx.commands:
        key = cmd.run_id.encode()
        out.append(Out(topics.commands, partition_for(key, partitions), key, encode(cmd)))
    for reply_to, info in fx.replies:
        out.append(Out(topics.replies, None, reply_to.encode(), encode(info)))
    for letter in fx.dead_letters:
        key = letter.key if letter.key is not None else (letter.run_id or "").encode()
        out.append(Out(topics.dlq, None, key, encode(letter)))
    for fw in fx.forwards:
        out.append(Out(topics.commands, fw.partition, fw.key, fw.value))
    return out, encoded
