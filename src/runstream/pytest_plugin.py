"""pytest plugin for workflow authors, registered by entry point (``pytest11``).

Fixtures:

``runstream_kafka``
    The bootstrap address of a real Kafka broker, one per test session, for integration
    tests (unit tests of workflows need none: see `runstream.testing`). Where the broker
    comes from, first that works:

    1. ``KAFKA_BOOTSTRAP_SERVERS``, if set (a broker you run yourself);
    2. a local KRaft broker from cached Maven jars (`runstream.dev.localkafka`; needs
       Java, and Maven the first time);
    3. testcontainers' Kafka, if the ``docker`` extra is installed and a Docker engine
       answers.

    None possible: the tests that use it fail when ``CI=true``, else they are skipped.
    The broker it started stops at the end of the session (or with the pytest process).
"""

from __future__ import annotations

import atexit
import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

NO_KAFKA = "no Kafka: set KAFKA_BOOTSTRAP_SERVERS, or install java + mvn, or run Docker"


@pytest.fixture(scope="session")
def runstream_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
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
    if os.environ.get("CI") == "true":
        pytest.fail(NO_KAFKA)
    pytest.skip(NO_KAFKA)


def _local_kafka(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A started `LocalKafka`, or None without Java or Maven."""
    from runstream.dev import localkafka  # here: loading the plugin stays cheap
    from runstream.errors import ConfigError

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


def _docker_kafka() -> Any:
    """A started testcontainers KafkaContainer, or None without Docker."""
    try:
        importlib.import_module("docker").from_env().ping()
        kafka_module = importlib.import_module("testcontainers.community.kafka")
    except Exception:  # no docker package, no engine, or no testcontainers
        return None
    container = (
        kafka_module.KafkaContainer("confluentinc/cp-kafka:7.6.0")
        .with_kraft()
        # without these, init_transactions hangs on a single broker
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    )
    container.start()
    atexit.register(container.stop)
    return container
