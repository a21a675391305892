"""The watchdog's deadlines (exit_on_hang off: it only says what it would do)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from runstream.topics import watchdog
from runstream.topics.watchdog import Watchdog


@pytest.fixture
def short_grace() -> float:
    return 0.3


def test_a_call_blocked_past_the_stop_grace_is_abandoned(short_grace, caplog):
    dog = Watchdog(exit_on_hang=False)
    with caplog.at_level(logging.CRITICAL), dog.watch("commit_transaction", 45, short_grace):
        dog.stop_requested()
        time.sleep(short_grace + 0.4)
    assert "abandoned commit_transaction" in caplog.text


def test_a_call_with_a_longer_grace_outlives_a_shorter_one(short_grace, caplog):
    """A transaction's commit at a stop records the steps that ended in the drain: it
    gets longer than a read (CI's chaos run saw one abandoned on a loaded machine)."""
    dog = Watchdog(exit_on_hang=False)
    with caplog.at_level(logging.CRITICAL):
        with dog.watch("commit_transaction", 45, short_grace * 4):
            dog.stop_requested()
            time.sleep(short_grace + 0.4)
        assert "abandoned" not in caplog.text
        with dog.watch("committed", 45, short_grace):
            time.sleep(short_grace + 0.4)
    assert "abandoned committed" in caplog.text


class _Dog(Watchdog):
    """Says the grace each call was watched with."""

    def __init__(self) -> None:
        super().__init__(exit_on_hang=False)
        self.graces: list[float] = []

    def watch(self, what, limit, grace=watchdog.STOP_GRACE):  # type: ignore[override]
        self.graces.append(grace)
        return super().watch(what, limit, grace)


def test_the_outcome_of_a_transaction_gets_the_drain_grace():
    assert watchdog.DRAIN_GRACE > watchdog.STOP_GRACE
    from runstream.topics import txn

    class Producer(txn.Transactions):
        def __init__(self) -> None:
            self.watchdog = _Dog()

    producer = Producer()
    producer._transact("commit_transaction", lambda: None)
    producer._must("begin_transaction", lambda: None)
    assert producer.watchdog.graces == [watchdog.DRAIN_GRACE, watchdog.STOP_GRACE]


def test_a_restore_read_gets_the_drain_grace():
    """A stop during a restore lets its read finish, then hands the partitions already
    owned over (an abandoned read ended the instance with 76 and no handover)."""
    from runstream.topics.kafka import KafkaLog

    engine_log = object.__new__(KafkaLog)  # no Kafka needed: only the watch is asked
    engine_log.watchdog = dog = _Dog()
    assert engine_log._asking("committed", "reading offsets", lambda: 7) == 7
    assert dog.graces == [watchdog.DRAIN_GRACE]


def test_a_call_begun_after_the_stop_gets_its_own_grace(short_grace, caplog):
    """Recording the steps still running at a stop takes transactions after the stop
    request: each may take the grace, counted from its own start."""
    dog = Watchdog(exit_on_hang=False)
    dog.stop_requested()
    time.sleep(short_grace + 0.2)
    with caplog.at_level(logging.CRITICAL):
        for _ in range(3):
            with dog.watch("commit_transaction", 45, short_grace):
                time.sleep(short_grace / 2)
    assert "abandoned" not in caplog.text


def test_a_fatal_kafka_error_ends_the_process_with_its_own_status():
    code = "from runstream.topics.watchdog import Watchdog; Watchdog().fatal('fenced')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == watchdog.EXIT_FATAL
    assert "fenced" in done.stderr


def test_with_exit_on_hang_off_a_fatal_error_is_only_said(caplog):
    with caplog.at_level(logging.CRITICAL):
        Watchdog(exit_on_hang=False).fatal("fenced")
    assert "fenced (not exiting" in caplog.text
