"""Large payloads through the claim-check topic ``<ns>.blobs`` on the real broker: a 5 MB
input and a 5 MB step output round-trip through a run, no journal record is over the
broker's limit, a remote step returns a 5 MB output, a foreign producer's reference to
nothing is a dead letter, and an engine SIGKILLed around a big step output's commit
records it once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

import runstream
from runstream.cli.main import cli
from runstream.engine import blobs
from runstream.engine.limits import DEFAULT_MAX_RECORD
from runstream.schemas.codec import Codec
from runstream.schemas.records import StartRun
from runstream.settings import Settings
from runstream.taskworker import TaskWorker
from runstream.topics.admin import client_config, ensure_topics, partition_count

from .blob_app import MB5, big_text, digest, make_app
from .kit import (
    PARTITIONS,
    ThreadWorker,
    client_or_none,
    journal_facts,
    kill,
    read_topic,
    spawn_worker,
    terminate,
    wait_for,
)

pytestmark = pytest.mark.kafka


def _record_sizes(bootstrap: str, topic: str) -> list[int]:
    return [len(msg.value() or b"") for _, _, msg in read_topic(bootstrap, topic, timeout=30)]


def test_a_5mb_input_and_a_5mb_step_output_round_trip_and_no_record_is_over_the_limit(
    kafka_bootstrap, ns, tmp_path
):
    app = make_app(ns, kafka_bootstrap)
    engine = ThreadWorker(app, tmp_path / "state")
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        with client:
            text = big_text("input", MB5)
            client.start("round_trip", text, run_id="big")
            out = client.result("big", timeout=120)
            assert out["input"] == digest(text) and out["echo"] == text  # 5 MB back
            assert out["step"] == digest(big_text(digest(text), MB5))
            info = client.get_run("big")
            assert info.status == "completed" and info.input == text
    finally:
        engine.stop()
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(tmp_path / "cache")]
    shown = CliRunner().invoke(cli, ["runs", "show", "big", *common, "--json"])
    assert shown.exit_code == 0, shown.output
    row = json.loads(shown.output)["run"]
    assert row["input"] == text and row["output"]["echo"] == text  # read from the blobs
    facts = journal_facts(kafka_bootstrap, ns, "big")
    started = next(f for f in facts if type(f).__name__ == "RunStarted")
    completed = next(f for f in facts if type(f).__name__ == "StepCompleted")
    assert blobs.parse(started.input) is not None and blobs.parse(completed.output) is not None
    journal = _record_sizes(kafka_bootstrap, f"{ns}.journal")
    chunks = _record_sizes(kafka_bootstrap, f"{ns}.blobs")
    assert max(journal) < 10_000  # references, never the bytes
    assert max(chunks) <= DEFAULT_MAX_RECORD and sum(chunks) >= 3 * MB5  # input, step, output
    for topic in ("commands", "lifecycle", "replies"):
        assert max(_record_sizes(kafka_bootstrap, f"{ns}.{topic}")) < DEFAULT_MAX_RECORD


def test_a_big_signal_and_a_big_update_reach_the_run_and_come_back(kafka_bootstrap, ns, tmp_path):
    engine = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        with client:
            client.start("mailbox", None, run_id="m")
            letter = big_text("letter", 2 * 1024 * 1024)
            assert client.update("m", "stamp", letter, timeout=60) == letter.upper()
            client.signal("m", "letter", letter)
            assert client.result("m", timeout=60) == {"letter": digest(letter)}
    finally:
        engine.stop()
    names = [type(f).__name__ for f in journal_facts(kafka_bootstrap, ns, "m")]
    assert "UpdateCompleted" in names and "SignalReceived" in names
    assert max(_record_sizes(kafka_bootstrap, f"{ns}.journal")) < 10_000


def test_a_remote_step_returns_a_5mb_output(kafka_bootstrap, ns, tmp_path):
    app = runstream.App(ns, kafka_bootstrap)

    @app.step(group="big", timeout="60s")
    def render(seed: str) -> str:
        return big_text(seed, MB5)

    @app.workflow
    async def report(ctx: runstream.Context, seed: str) -> dict:
        page = await ctx.step(render, seed)
        return {"len": len(page), "sha": digest(page)}

    engine = ThreadWorker(app, tmp_path / "state")
    worker = TaskWorker(app, "big", settings=Settings(session_timeout_ms=6000))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        with client:
            client.start("report", "s1", run_id="r1")
            assert client.result("r1", timeout=120) == {
                "len": MB5,
                "sha": digest(big_text("s1", MB5)),
            }
    finally:
        worker.stop()
        thread.join(30)
        engine.stop()
    facts = journal_facts(kafka_bootstrap, ns, "r1")
    [done] = [f for f in facts if type(f).__name__ == "StepCompleted"]
    assert blobs.parse(done.output) is not None
    assert max(_record_sizes(kafka_bootstrap, f"{ns}.commands")) < 10_000  # its StepResult


def test_a_foreign_reference_to_nothing_is_a_dead_letter_and_the_partition_goes_on(
    kafka_bootstrap, ns, tmp_path
):
    app = make_app(ns, kafka_bootstrap)
    engine = ThreadWorker(app, tmp_path / "state")
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        with client:
            ghost, _ = blobs.split(b'"never written"', 1000, at_ms=0)
            producer = Producer({**client_config(kafka_bootstrap), "partitioner": "murmur2"})
            for run_id, data in (("ghost", ghost.encode()), ("odd", blobs.MAGIC + b"{")):
                cmd = Codec.default().encode(StartRun(run_id, "round_trip", input=data))
                producer.produce(f"{ns}.commands", cmd, run_id.encode())
            producer.flush(10)
            for run_id in ("ghost", "odd"):
                with pytest.raises(runstream.RunRejected, match="blob-missing"):
                    client.result(run_id, timeout=60)
            client.start("round_trip", "small", run_id="fine")  # the partitions go on
            assert client.result("fine", timeout=60)["echo"] == "small"
    finally:
        engine.stop()
    letters = [rec for _, rec, _ in read_topic(kafka_bootstrap, f"{ns}.dlq", timeout=30)]
    codes = {rec["run_id"]: rec["code"] for rec in letters}
    assert codes == {"ghost": "blob-missing", "odd": "blob-missing"}


def _spawn(bootstrap: str, ns: str, state: Path, log: Path, instance: str, **env: str):
    return spawn_worker(bootstrap, ns, state, instance, log, app="tests.kafka.blob_app:app", **env)


def _executions(log: Path, run_id: str) -> int:
    return sum(
        1 for line in log.read_text().splitlines() if line.split()[:2] == ["big_once", run_id]
    )


@pytest.mark.slow
def test_an_engine_sigkilled_as_a_big_step_output_commits_records_it_once(
    kafka_bootstrap, ns, tmp_path
):
    """The step's body kills its engine process just after returning 5 MB (its output on
    its way to the transaction, which may or may not have committed): the supervisor's
    next process, with no blob in memory, finishes the run from the journal and the blobs
    topic. Then the same after the commit: the process is SIGKILLed once the StepCompleted
    is in the journal, and a new instance with an empty disk reads the output back."""

    def facts(run_id: str) -> list:
        return journal_facts(kafka_bootstrap, ns, run_id)

    log, marker = tmp_path / "steps.log", tmp_path / "killed"
    state = tmp_path / "state"
    state.mkdir()
    w1 = _spawn(kafka_bootstrap, ns, state, log, "w1", RUNSTREAM_TEST_KILL_ONCE=str(marker))
    w2 = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        client.start("big_then_signal", None, run_id="before")
        wait_for(
            lambda: "StepCompleted" in [type(f).__name__ for f in facts("before")],
            timeout=120,
            what="the step to be recorded after the crash",
        )
        assert marker.exists()  # the body did kill its process
        client.signal("before", "go", 1)
        expected = digest(big_text("before", MB5))
        assert client.result("before", timeout=120) == {"step": expected, "len": MB5, "go": 1}

        client.start("big_then_signal", None, run_id="after")
        wait_for(
            lambda: "StepCompleted" in [type(f).__name__ for f in facts("after")],
            timeout=120,
            what="the step to commit",
        )
        kill(w1)  # committed, not yet told to go on
        w2 = _spawn(kafka_bootstrap, ns, tmp_path / "empty", log, "w2")
        client.signal("after", "go", 2)
        expected = digest(big_text("after", MB5))
        assert client.result("after", timeout=120) == {"step": expected, "len": MB5, "go": 2}
        client.close()
    finally:
        for w in (w1, w2):
            if w is not None and w.poll() is None:
                terminate(w)
    for run_id in ("before", "after"):
        names = [type(f).__name__ for f in facts(run_id)]
        assert names.count("StepCompleted") == 1 and names.count("RunCompleted") == 1
    assert _executions(log, "after") == 1  # committed: never ran again
    assert 1 <= _executions(log, "before") <= 2  # at least once: again if not committed


def test_a_namespace_of_an_older_release_gets_its_blobs_topic_or_runs_without_it(
    kafka_bootstrap, ns, tmp_path
):
    """Its topics exist but not ``<ns>.blobs``: with create_topics off, the engine runs
    with large payloads off (a big output fails its step, no transaction aborts); with it
    on, the engine creates the topic and a 5 MB output goes through."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    admin = AdminClient(client_config(kafka_bootstrap))
    admin.delete_topics([f"{ns}.blobs"])[f"{ns}.blobs"].result(30)
    config = client_config(kafka_bootstrap)
    wait_for(lambda: partition_count(config, f"{ns}.blobs") is None, what="the delete")
    app = make_app(ns, kafka_bootstrap)
    engine = ThreadWorker(app, tmp_path / "off", create_topics=False)
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("big_then_signal", None, run_id="off")
            with pytest.raises(runstream.RunFailed, match="the step's output is 5,242,8"):
                client.result("off", timeout=60)
    finally:
        engine.stop()
    assert engine.worker.stats["aborted"] == 0
    assert partition_count(config, f"{ns}.blobs") is None
    engine = ThreadWorker(app, tmp_path / "on")
    try:
        wait_for(lambda: partition_count(config, f"{ns}.blobs") == PARTITIONS, what="blobs")
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("big_then_signal", None, run_id="on")
            client.signal("on", "go", 1)
            assert client.result("on", timeout=60)["len"] == MB5
    finally:
        engine.stop()
