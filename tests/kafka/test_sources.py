"""Source forwarders against the real broker: records of a team's own topics (JSON with an
``order`` field, produced by a plain Producer) start runs and reach their waits, exactly
once per record, also across a SIGKILL of the forwarder and of the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import runstream
from runstream.audit.reader import audit
from runstream.cli.sources_cmd import status
from runstream.sources import SourceForwarder
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.base import TransactionAborted
from runstream.topics.sourcelog import SourceLog, open_source_log
from runstream.topics.spec import Topics
from runstream.topics.watchdog import Watchdog

from .kit import (
    PARTITIONS,
    ROOT,
    ThreadWorker,
    kill,
    read_topic,
    results,
    spawn_worker,
    terminate,
    wait_for,
)
from .source_app import make_app

pytestmark = pytest.mark.kafka


class TeamProducer:
    """A team's own producer: plain confluent-kafka, its default partitioner, JSON values.
    Remembers where each record landed (its event id is ``topic:partition:offset``)."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(client_config(bootstrap))
        self.landed: list[str] = []

    def send(self, topic: str, key: str, value: bytes) -> None:
        def delivered(err, msg) -> None:
            assert err is None, err
            self.landed.append(f"{msg.topic()}:{msg.partition()}:{msg.offset()}")

        self.producer.produce(topic, value, key.encode(), on_delivery=delivered)
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0


def _topics(bootstrap: str, ns: str) -> None:
    """The namespace's topics, and the team's (3 partitions: not the namespace's count)."""
    ensure_topics(bootstrap, ns, PARTITIONS)
    admin = AdminClient(client_config(bootstrap))
    new = [NewTopic(f"{ns}-{t}", 3, 1) for t in ("orders", "shipments")]
    for future in admin.create_topics(new).values():
        future.result()


class ThreadForwarder:
    def __init__(self, app: runstream.App, instance: str = "f1", **kw: object) -> None:
        settings = runstream.Settings(instance_id=instance, exit_on_hang=False, **kw)
        self.forwarder = SourceForwarder(app, settings)
        self.thread = threading.Thread(target=self.forwarder.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.forwarder.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the forwarder did not stop within 30 s"


def _status(bootstrap: str, ns: str) -> dict:
    result = CliRunner().invoke(status, ["-n", ns, "--bootstrap", bootstrap, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _outputs(client: runstream.Client, run_ids: list[str], timeout: float) -> dict:
    """run id -> its output (or what its result raised), each run waited for until it
    exists: a run started by an event exists once its event reached the engine."""
    deadline = time.monotonic() + timeout

    def started(run_id: str) -> bool:
        try:
            client.get_run(run_id, timeout=10)
            return True
        except runstream.RunNotFound:
            return False

    for run_id in run_ids:
        wait_for(lambda r=run_id: started(r), deadline - time.monotonic(), what=run_id)
    return results(client, run_ids, deadline - time.monotonic())


def _order(i: int) -> bytes:
    return json.dumps({"order": f"o-{i}", "amount": i}).encode()


def _shipment(i: int) -> bytes:
    return json.dumps({"order": f"o-{i}", "carrier": f"c-{i % 3}"}).encode()


def test_team_records_start_runs_reach_waits_and_a_bad_one_is_dead_lettered(
    kafka_bootstrap, ns, tmp_path
):
    _topics(kafka_bootstrap, ns)
    app = make_app(ns, kafka_bootstrap)
    engine = ThreadWorker(app, tmp_path / "state")
    forwarder = ThreadForwarder(app)
    team = TeamProducer(kafka_bootstrap)
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("paid", "o-1", run_id="pay-1")
            for i in range(20):
                if i == 5:  # not JSON, on the partition of o-5, just before its order
                    team.send(f"{ns}-orders", "o-5", b"{not json")
                team.send(f"{ns}-orders", f"o-{i}", _order(i))
            for i in range(20):
                team.send(f"{ns}-shipments", f"o-{i}", _shipment(i))
            # Any service publishes to <ns>.events with a plain producer, as JSON
            settled = {"name": "payment.settled", "key": "o-1", "payload": {"amount": 1}}
            settled["ttl"] = "10m"  # in case it comes before the run waits
            team.send(f"{ns}.events", "o-1", json.dumps(settled).encode())
            team.flush()
            outputs = _outputs(client, [f"fulfil:o-{i}" for i in range(20)] + ["pay-1"], 120)
        assert outputs == {
            **{f"fulfil:o-{i}": {"order": f"o-{i}", "carrier": f"c-{i % 3}"} for i in range(20)},
            "pay-1": {"amount": 1},
        }
        # every record read and committed: lag 0 on every source topic and <ns>.events
        wait_for(lambda: _status(kafka_bootstrap, ns)["lag"] == 0, what="lag 0")
        doc = _status(kafka_bootstrap, ns)
        assert {t["topic"] for t in doc["topics"]} == {
            f"{ns}-orders",
            f"{ns}-shipments",
            f"{ns}.events",
        }
        assert doc["group"] == f"{ns}.sources" and len(doc["forwarders"]) == 1
        orders = next(t for t in doc["topics"] if t["topic"] == f"{ns}-orders")
        assert sum(p["end"] for p in orders["partitions"]) == 21  # 20 orders, 1 bad record
        table = CliRunner().invoke(status, ["-n", ns, "--bootstrap", kafka_bootstrap])
        assert table.exit_code == 0 and f"{ns}-orders" in table.output, table.output
    finally:
        forwarder.stop()
        engine.stop()
    letters = read_topic(kafka_bootstrap, f"{ns}.dlq")
    assert [(r["source_topic"], r["code"], r["value"]) for _, r, _ in letters] == [
        (f"{ns}-orders", "undecodable", b"{not json")
    ]
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=30)
    published = Counter(r["event_id"] for n, r, _ in journal if n == "EventPublished")
    assert len(published) == 41 and set(published.values()) == {1}
    assert forwarder.forwarder.stats["forwarded"] == 41
    assert forwarder.forwarder.stats["dead_letters"] == 1


def test_two_forwarders_share_the_sources_through_rebalances_each_record_once(
    kafka_bootstrap, ns, tmp_path
):
    """A second forwarder joins while records flow, then the first leaves while they
    still flow: the partitions move twice (cooperative rebalances), and each record is
    still one command."""
    _topics(kafka_bootstrap, ns)
    app = make_app(ns, kafka_bootstrap)
    engine = ThreadWorker(app, tmp_path / "state")
    first = ThreadForwarder(app, "f1", leave_on_stop=True, batch_size=5)
    second = None
    team = TeamProducer(kafka_bootstrap)
    n = 150

    def produce(start: int, stop: int) -> None:
        for i in range(start, stop):
            team.send(f"{ns}-orders", f"o-{i}", _order(i))
            team.send(f"{ns}-shipments", f"o-{i}", _shipment(i))
            time.sleep(0.02)
        team.flush()

    def forwarders() -> int:
        return len(_status(kafka_bootstrap, ns)["forwarders"])

    try:
        produce(0, n // 3)  # the first alone
        second = ThreadForwarder(app, "f2", batch_size=5)
        producing = threading.Thread(target=produce, args=(n // 3, 2 * n // 3))
        producing.start()  # while the second joins
        wait_for(lambda: forwarders() == 2, 60, what="the second forwarder to join")
        producing.join(60)
        producing = threading.Thread(target=produce, args=(2 * n // 3, n))
        producing.start()
        first.stop()  # leaves the group while records flow: its partitions move at once
        producing.join(60)
        with runstream.Client(ns, kafka_bootstrap) as client:
            outputs = _outputs(client, [f"fulfil:o-{i}" for i in range(n)], 120)
        assert all(isinstance(o, dict) for o in outputs.values()), outputs
        wait_for(lambda: _status(kafka_bootstrap, ns)["lag"] == 0, 60, what="lag 0")
    finally:
        for forwarder in (first, second):
            if forwarder is not None and forwarder.thread.is_alive():
                forwarder.stop()
        engine.stop()
    assert first.forwarder.stats["forwarded"] > 0 and second.forwarder.stats["forwarded"] > 0
    commands = read_topic(kafka_bootstrap, f"{ns}.commands", timeout=60)
    sent = Counter(r["event_id"] for name, r, _ in commands if name == "PublishEvent")
    assert len(team.landed) == 2 * n and sent == Counter(team.landed)


def _spawn_forwarder(bootstrap: str, ns: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """``runstream sources serve`` in its own (supervised) process."""
    env = {
        **os.environ,
        "RUNSTREAM_TEST_NS": ns,
        "RUNSTREAM_BOOTSTRAP_SERVERS": bootstrap,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
    }
    argv = [sys.executable, "-m", "runstream", "sources", "serve", "tests.kafka.source_app:app"]
    with open(tmp_path / "forwarder.log", "ab") as log:
        return subprocess.Popen(
            [*argv, "--instance", "f1", "--batch-size", "5"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _committed(bootstrap: str, ns: str) -> int:
    """Source records the forwarders committed so far."""
    doc = _status(bootstrap, ns)
    return sum(p["committed"] or 0 for t in doc["topics"] for p in t["partitions"])


N = 200


def test_each_record_is_one_event_and_each_run_starts_once_across_sigkills(
    kafka_bootstrap, ns, tmp_path
):
    """200 orders and their 200 shipments keep coming while the forwarder process is
    SIGKILLed mid-stream (it forwards 5 records per transaction) and started again, and
    then the engine process too."""
    _topics(kafka_bootstrap, ns)
    state = tmp_path / "state"
    state.mkdir()
    engine = spawn_worker(kafka_bootstrap, ns, state, "w1", app="tests.kafka.source_app:app")
    forwarder = _spawn_forwarder(kafka_bootstrap, ns, tmp_path)
    team = TeamProducer(kafka_bootstrap)

    def produce(start: int, stop: int) -> None:
        for i in range(start, stop):
            team.send(f"{ns}-orders", f"o-{i}", _order(i))
            team.send(f"{ns}-shipments", f"o-{i}", _shipment(i))
            time.sleep(0.01)
        team.flush()

    def committed() -> int:
        return _committed(kafka_bootstrap, ns)

    producing = threading.Thread(target=produce, args=(1, N))
    try:
        produce(0, 1)  # the forwarder has joined once this is forwarded
        wait_for(lambda: committed() >= 2, 60, what="the forwarder to join")
        producing.start()
        wait_for(lambda: committed() >= N // 2, 60, interval=0.02, what="some forwarded")
        kill(forwarder)  # mid-stream: records keep coming while no forwarder runs
        forwarder = _spawn_forwarder(kafka_bootstrap, ns, tmp_path)
        wait_for(lambda: committed() >= N, 60, interval=0.02, what="more forwarded")
        kill(engine)
        engine = spawn_worker(kafka_bootstrap, ns, state, "w1", app="tests.kafka.source_app:app")
        producing.join(60)
        with runstream.Client(ns, kafka_bootstrap) as client:
            outputs = _outputs(client, [f"fulfil:o-{i}" for i in range(N)], 240)
        assert outputs == {
            f"fulfil:o-{i}": {"order": f"o-{i}", "carrier": f"c-{i % 3}"} for i in range(N)
        }
        wait_for(lambda: _status(kafka_bootstrap, ns)["lag"] == 0, 60, what="lag 0")
        assert terminate(forwarder) == 0  # SIGTERM: stopped on request
    finally:
        for proc in (forwarder, engine):
            if proc.poll() is None:
                kill(proc)
    # Straight from the forwarder's transactions: one command per record, none lost
    commands = read_topic(kafka_bootstrap, f"{ns}.commands", timeout=60)
    sent = Counter(r["event_id"] for n, r, _ in commands if n == "PublishEvent")
    assert len(team.landed) == 2 * N and set(sent) == set(team.landed)
    assert set(sent.values()) == {1}, [e for e, c in sent.items() if c > 1][:5]
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=60)
    published = Counter(r["event_id"] for n, r, _ in journal if n == "EventPublished")
    assert published == Counter(team.landed)  # each record one event, once
    started = Counter(r["run_id"] for n, r, _ in journal if n == "RunStarted")
    assert started == Counter(f"fulfil:o-{i}" for i in range(N))  # each run started once
    received = Counter(r["run_id"] for n, r, _ in journal if n == "EventReceived")
    assert received == started  # and reached its wait once
    assert read_topic(kafka_bootstrap, f"{ns}.dlq") == []
    report = audit(kafka_bootstrap, ns, expect_finished=True)
    assert report.violations == [], report.violations


# -- the forwarder's transactions under the engine's error policy (`topics.txn`) -------


def _source_log(bootstrap: str, ns: str) -> tuple[SourceLog, str]:
    """A started forwarder log on a one-partition source topic holding three records."""
    ensure_topics(bootstrap, ns, 1)
    topic = f"{ns}-orders"
    admin = AdminClient(client_config(bootstrap))
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result()
    team = TeamProducer(bootstrap)
    for i in range(3):
        team.send(topic, f"o-{i}", _order(i))
    team.flush()
    settings = runstream.Settings(bootstrap_servers=bootstrap)
    sl = open_source_log(settings, Topics(ns), [topic], "i1", Watchdog(False), lambda: False)
    assert sl is not None and sl.start(lambda: False)
    return sl, topic


def _poll(sl: SourceLog) -> list[int]:
    offsets: list[int] = []
    wait_for(lambda: offsets.extend(r.offset for r in sl.poll(0.2, 10)) or len(offsets) >= 3)
    return offsets


def _commands(bootstrap: str, ns: str) -> list[bytes]:
    return [msg.value() for _, _, msg in read_topic(bootstrap, f"{ns}.commands")]


def test_a_forwarder_transaction_whose_outcome_is_unknown_is_fenced_and_redone(kafka_bootstrap, ns):
    sl, topic = _source_log(kafka_bootstrap, ns)
    try:
        assert _poll(sl) == [0, 1, 2]
        sl.begin()
        sl.produce(f"{ns}.commands", 0, b"k", b"first try")
        sl.call_timeout = 0  # the offsets' request times out: its outcome is unknown
        with pytest.raises(TransactionAborted):
            sl.commit({(topic, 0): 3})
        assert sl.recreations == 1 and sl.aborts == 0  # never an abort after an unknown
        assert _commands(kafka_bootstrap, ns) == []  # fenced by the new producer's init
        assert _poll(sl) == [0, 1, 2]  # rewound to the group's offsets
        sl.call_timeout = 30
        sl.begin()  # the recreated producer works
        sl.produce(f"{ns}.commands", 0, b"k", b"second try")
        sl.commit({(topic, 0): 3})
        assert _commands(kafka_bootstrap, ns) == [b"second try"]
        assert sl.committed([TopicPartition(topic, 0)]) == {(topic, 0): 3}
    finally:
        sl.close()


def test_after_a_recreation_a_forwarder_commit_that_landed_is_known_as_such(kafka_bootstrap, ns):
    sl, topic = _source_log(kafka_bootstrap, ns)
    try:
        assert _poll(sl) == [0, 1, 2]
        sl.begin()
        sl.produce(f"{ns}.commands", 0, b"k", b"landed")
        sl.commit({(topic, 0): 2})
        sl._recreate()  # as after a commit whose answer was lost
        assert sl._landed()
        sl.begin()
        sl.produce(f"{ns}.commands", 0, b"k", b"not committed")
        sl._sent = {(topic, 0): 3}  # as commit() records them before sending
        sl._recreate()
        assert not sl._landed()
        assert _commands(kafka_bootstrap, ns) == [b"landed"]
    finally:
        sl.close()
