"""The local broker's start-up warm-up, without a broker: a group coordinator still
loading its partition (a busy machine) is waited for, not a failed start."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from runstream.dev.localkafka import commit_when_loaded


class Consumer:
    """Refuses its first ``refusals`` commits with ``code``."""

    def __init__(self, refusals: int, code: int) -> None:
        self.refusals, self.code, self.commits = refusals, code, 0

    def commit(self, **_: Any) -> None:
        self.commits += 1
        if self.commits <= self.refusals:
            raise KafkaException(KafkaError(self.code))


def test_warm_up_commit_waits_while_the_coordinator_loads() -> None:
    consumer = Consumer(2, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)

    commit_when_loaded(consumer, [], timeout=5, pause=0)

    assert consumer.commits == 3


def test_warm_up_commit_raises_any_other_refusal() -> None:
    consumer = Consumer(1, KafkaError.GROUP_AUTHORIZATION_FAILED)

    with pytest.raises(KafkaException):
        commit_when_loaded(consumer, [], timeout=5, pause=0)


def test_warm_up_commit_gives_up_at_its_timeout() -> None:
    consumer = Consumer(10**6, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)

    with pytest.raises(KafkaException):
        commit_when_loaded(consumer, [], timeout=0, pause=0)
    assert consumer.commits == 1
