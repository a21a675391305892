"""The consumer group session: the heartbeat interval tied to the session timeout, and a
session timeout the broker refuses (no broker: a stand-in consumer)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError
from pydantic import ValidationError

from runstream.errors import ConfigError
from runstream.settings import Settings
from runstream.topics.kafka import consume_records


def test_the_heartbeat_defaults_to_a_third_of_a_short_session_timeout_and_3s_at_most():
    assert Settings(session_timeout_ms=3000).group_session() == {
        "session.timeout.ms": 3000,
        "heartbeat.interval.ms": 1000,
    }
    # a long session keeps librdkafka's 3 s: the heartbeat is also how a rebalance is learnt
    assert Settings(session_timeout_ms=45_000).group_session()["heartbeat.interval.ms"] == 3000
    assert Settings().group_session()["heartbeat.interval.ms"] == 3000
    given = Settings(session_timeout_ms=3000, heartbeat_interval_ms=500).group_session()
    assert given["heartbeat.interval.ms"] == 500


def test_a_heartbeat_given_as_a_librdkafka_setting_still_counts(monkeypatch):
    monkeypatch.setenv("RUNSTREAM_KAFKA_HEARTBEAT_INTERVAL_MS", "700")
    assert Settings(session_timeout_ms=3000).group_session()["heartbeat.interval.ms"] == 700
    monkeypatch.setenv("RUNSTREAM_KAFKA_HEARTBEAT_INTERVAL_MS", "1500")
    with pytest.raises(ValidationError, match=r"heartbeat_interval_ms \(1500\) must be below"):
        Settings(session_timeout_ms=1500)


@pytest.mark.parametrize("beat", [3000, 4000])
def test_a_heartbeat_not_below_the_session_timeout_is_refused_with_a_clear_error(beat):
    with pytest.raises(ValidationError, match=r"heartbeat_interval_ms \(\d+\) must be below"):
        Settings(session_timeout_ms=3000, heartbeat_interval_ms=beat)
    settings = Settings(session_timeout_ms=6000, heartbeat_interval_ms=2000)
    with pytest.raises(ValidationError, match="must be below session_timeout_ms"):
        settings.session_timeout_ms = 2000  # checked on assignment too


def test_a_session_timeout_under_a_second_is_refused():
    with pytest.raises(ValidationError, match="session_timeout_ms"):
        Settings(session_timeout_ms=999)


class _Refused:
    """A consumer whose every poll returns the broker's JoinGroup refusal."""

    def poll(self, timeout: float) -> Any:
        return _ErrorMessage(KafkaError(KafkaError.INVALID_SESSION_TIMEOUT))

    def consume(self, n: int, timeout: float) -> list[Any]:
        return []


class _ErrorMessage:
    def __init__(self, err: KafkaError) -> None:
        self._err = err

    def error(self) -> KafkaError:
        return self._err


def test_a_session_timeout_the_broker_refuses_is_a_config_error_not_a_warning_for_ever():
    with pytest.raises(ConfigError, match=r"group\.min\.session\.timeout\.ms"):
        consume_records(_Refused(), 0.1, 10, "consumer")  # type: ignore[arg-type]
