"""The local Kafka launcher: up/status/down, the jar cache, errors, kill and restart.

Each test keeps its state (state.json, broker dirs) in a temp RUNSTREAM_CACHE_DIR but reuses
the real jar cache through RUNSTREAM_JAR_CACHE_DIR, so nothing is downloaded twice.
"""

from __future__ import annotations

import shutil
import socket

import psutil
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from runstream.dev import localkafka
from runstream.errors import ConfigError, KafkaSetupError
from runstream.topics.admin import client_config

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs Java 17+"),
]


@pytest.fixture
def jars(tmp_path, monkeypatch):
    """The real (cached) libs dir; state goes to tmp_path. Stops any broker left at the end."""
    jar_root = localkafka.jar_cache_dir()
    monkeypatch.setenv("RUNSTREAM_JAR_CACHE_DIR", str(jar_root))
    monkeypatch.setenv("RUNSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    libs = localkafka.ensure_jars(progress=lambda _: None)
    yield libs
    localkafka.down()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def brokers(bootstrap: str) -> list[int]:
    return sorted(AdminClient(client_config(bootstrap)).list_topics(timeout=10).brokers)


def test_up_status_down_and_cached_jars(jars, monkeypatch):
    marker = jars / localkafka.MARKER
    mtime = marker.stat().st_mtime_ns
    assert localkafka.status() == {"running": False}

    state = localkafka.up(progress=lambda _: None)
    pids = state["pids"]
    st = localkafka.status()
    assert st["running"] and st["alive"] == [True]
    assert localkafka.current_bootstrap() == state["bootstrap"]
    assert brokers(state["bootstrap"]) == [1]
    with pytest.raises(ConfigError, match="already runs"):
        localkafka.up()

    assert localkafka.down() == pids
    assert all(gone(pid) for pid in pids)
    assert localkafka.status() == {"running": False}
    assert localkafka.current_bootstrap() is None
    assert not localkafka.state_path().exists()

    # Second start: the jars come from the cache; Maven would fail if it were needed.
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda n, *a, **k: None if n == "mvn" else real_which(n))
    said: list[str] = []
    state = localkafka.up(progress=said.append)
    assert said[0].startswith("jars: cached")
    assert marker.stat().st_mtime_ns == mtime
    assert brokers(state["bootstrap"]) == [1]
    localkafka.down()
    assert all(gone(pid) for pid in state["pids"])


def test_ensure_jars_without_maven_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNSTREAM_JAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    with pytest.raises(ConfigError, match="mvn"):
        localkafka.ensure_jars(progress=lambda _: None)


def test_taken_port_is_a_config_error(jars):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="in use"):
            localkafka.up(port=s.getsockname()[1], progress=lambda _: None)
    assert not localkafka.state_path().exists()


def test_bad_config_fails_the_format_with_its_output(jars, tmp_path):
    kafka = localkafka.LocalKafka(tmp_path / "k", libs=jars, overrides={"num.io.threads": "x"})
    with pytest.raises(KafkaSetupError, match=r"formatting node 0 failed(.|\n)*num\.io\.threads"):
        kafka.start()


def test_jvm_exit_during_start_up_reports_the_log(jars, tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        # the broker is handed a client port someone else listens on: it exits while binding
        real = localkafka._free_ports
        monkeypatch.setattr(localkafka, "_free_ports", lambda n: [taken, *real(n - 1)])
        kafka = localkafka.LocalKafka(tmp_path / "k", libs=jars)
        with pytest.raises(KafkaSetupError, match=r"exited with code(.|\n)*already in use"):
            kafka.start()
    assert all(gone(pid) for pid in kafka.pids)


@pytest.mark.slow
def test_kill_and_restart_keeps_data(jars, tmp_path):
    kafka = localkafka.LocalKafka(tmp_path / "k", libs=jars, die_with_parent=True)
    try:
        bootstrap = kafka.start()
        admin = AdminClient(client_config(bootstrap))
        admin.create_topics([NewTopic("kept", 2)])["kept"].result(timeout=30)
        old = kafka.pids[0]
        kafka.kill_node(0)
        assert gone(old)
        kafka.restart_node(0)
        assert kafka.pids[0] != old
        topics = AdminClient(client_config(bootstrap)).list_topics(timeout=10).topics
        assert len(topics["kept"].partitions) == 2
    finally:
        kafka.stop()
    assert all(gone(pid) for pid in kafka.pids)


@pytest.mark.slow
def test_three_nodes_form_one_cluster(jars):
    state = localkafka.up(nodes=3, progress=lambda _: None)
    assert len(state["pids"]) == 3 and len(state["bootstrap"].split(",")) == 3
    # each node, asked alone, knows the same cluster of three brokers
    seen = set()
    for address in state["bootstrap"].split(","):
        md = AdminClient(client_config(address)).list_topics(timeout=10)
        assert sorted(md.brokers) == [1, 2, 3]
        seen.add(md.cluster_id)
    assert len(seen) == 1
    assert localkafka.down() == state["pids"]
    assert all(gone(pid) for pid in state["pids"])
