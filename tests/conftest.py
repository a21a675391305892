"""Shared fixtures: one real Kafka per test session, and a fresh topic namespace per test.

Where the broker comes from, first that works:
1. KAFKA_BOOTSTRAP_SERVERS, if set (a broker you run yourself);
2. runstream.dev.localkafka: a local KRaft JVM from cached Maven jars (needs java, and mvn once);
3. testcontainers' KafkaContainer, if a Docker engine answers.
None possible: the tests fail when CI=true, else they are skipped.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from runstream.dev import localkafka
from runstream.errors import ConfigError
from runstream.topics.admin import client_config


def _local_kafka(tmp_path_factory: pytest.TempPathFactory) -> localkafka.LocalKafka | None:
    try:
        libs = localkafka.ensure_jars()
    except ConfigError:  # no java or no mvn: try Docker next
        return None
    # die_with_parent + atexit: no JVM outlives a crashed or interrupted pytest
    kafka = localkafka.LocalKafka(
        tmp_path_factory.mktemp("kafka"), nodes=1, libs=libs, die_with_parent=True
    )
    atexit.register(kafka.stop)
    kafka.start()
    return kafka


def _docker_kafka():  # -> testcontainers KafkaContainer | None
    try:
        import docker

        docker.from_env().ping()
        from testcontainers.community.kafka import KafkaContainer
    except Exception:  # no docker package, no engine, or no testcontainers
        return None
    container = (
        KafkaContainer("confluentinc/cp-kafka:7.6.0")
        .with_kraft()
        # without these, init_transactions hangs on a single broker
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    )
    container.start()
    atexit.register(container.stop)
    return container


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a real Kafka, shared by the whole session."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    kafka = _local_kafka(tmp_path_factory)
    if kafka is not None:
        try:
            yield kafka.bootstrap
        finally:
            kafka.stop()
        return
    container = _docker_kafka()
    if container is not None:
        try:
            yield container.get_bootstrap_server()
        finally:
            container.stop()
        return
    reason = "no Kafka: set KAFKA_BOOTSTRAP_SERVERS, or install java + mvn, or run Docker"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient(client_config(kafka_bootstrap))


@pytest.fixture
def ns() -> str:
    """A fresh topic namespace, so tests sharing the broker never see each other's topics."""
    return f"t{uuid.uuid4().hex[:10]}"
