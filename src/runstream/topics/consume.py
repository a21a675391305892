"""Reading from a confluent_kafka Consumer the way Runstream's loops need."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer


def consume_ready(consumer: Consumer, timeout: float, limit: int = 500) -> list[Any]:
    """Wait up to ``timeout`` for one record, then take what else is already there.
    (``consume(n, timeout)`` alone would wait the whole timeout for n records.)"""
    first = consumer.poll(timeout)
    return [] if first is None else [first, *consumer.consume(limit - 1, 0)]
