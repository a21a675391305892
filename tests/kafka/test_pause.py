"""Pause and unpause against the real broker: a step in flight finishes and nothing
else starts; the pause survives a SIGKILL of the owner and the signal sent while paused
is delivered once after unpause; the CLI by id and by --where, with `runs list --status
paused`; a pause of an unknown run is a dead letter."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import runstream
from runstream.audit import check_run
from runstream.cli.main import cli

from .flows import make_app
from .kit import (
    PARTITIONS,
    ThreadWorker,
    client_or_none,
    fact_names,
    journal_facts,
    kill,
    owns,
    read_topic,
    spawn_worker,
    terminate,
    wait_for,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path, monkeypatch):
    """One engine instance on a thread, with .client."""
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(tmp_path / "steps.log"))
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the worker's topics")
    yield SimpleNamespace(client=client, log=tmp_path / "steps.log")
    client.close()
    worker.stop()


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_a_paused_run_finishes_its_step_in_flight_and_starts_no_other_until_unpaused(
    engine, kafka_bootstrap, ns
):
    client = engine.client
    client.start("shifts", 2.0, run_id="s")  # 2 s a step: the pause comes during step 1
    wait_for(lambda: "StepStarted" in fact_names(kafka_bootstrap, ns, "s"), what="step 1 to start")
    client.pause("s", reason="carrier incident", by="ops")
    facts = wait_for(
        lambda: (
            (f := journal_facts(kafka_bootstrap, ns, "s"))
            and type(f[-1]).__name__ == "StepCompleted"
            and f
        ),
        timeout=60,
        what="step 1 to finish",
    )
    names = [type(f).__name__ for f in facts]
    # The decision that recorded step 1's end would have started step 2: it did not.
    assert names == ["RunStarted", "StepStarted", "RunPaused", "StepCompleted"]
    assert facts[2].by == "ops" and facts[2].reason == "carrier incident"
    assert client.get_run("s").status == "paused"
    client.unpause("s")
    assert client.result("s", timeout=60) == 6
    facts = journal_facts(kafka_bootstrap, ns, "s")
    assert [f.seq for f in facts if type(f).__name__ == "StepStarted"] == [1, 2, 3]
    assert check_run(facts) == []


def test_the_pause_survives_a_sigkill_of_the_owner_and_the_signal_sent_meanwhile_comes_once(
    kafka_bootstrap, ns, tmp_path
):
    log, state = tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        client.start("approval", run_id="a")
        wait_for(lambda: "SignalAwaited" in fact_names(kafka_bootstrap, ns, "a"), what="the wait")
        client.pause("a", reason="hold")
        wait_for(lambda: "RunPaused" in fact_names(kafka_bootstrap, ns, "a"), what="the pause")
        kill(worker)
        client.signal("a", "approve", "ann", signal_id="sig-1")  # no engine runs now
        client.signal("a", "approve", "bob", signal_id="sig-1")  # a resend: counts once
        worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log)
        wait_for(
            lambda: "SignalReceived" in fact_names(kafka_bootstrap, ns, "a"),
            timeout=90,
            what="the signal recorded by the new process",
        )
        assert client.get_run("a", timeout=30).status == "paused"  # the pause survived
        assert "RunCompleted" not in fact_names(kafka_bootstrap, ns, "a")
        client.unpause("a", reason="go")
        assert client.result("a", timeout=60) == {"approved": True, "by": "ann"}
        client.close()
    finally:
        if worker.poll() is None:
            terminate(worker)
    facts = journal_facts(kafka_bootstrap, ns, "a")
    names = [type(f).__name__ for f in facts]
    assert names.count("SignalReceived") == 1 and names.count("RunCompleted") == 1
    assert names.index("RunUnpaused") < names.index("RunCompleted")
    assert check_run(facts) == []


def test_runs_pause_and_unpause_by_id_and_where_with_the_runs_list(
    engine, kafka_bootstrap, ns, tmp_path
):
    client, cache = engine.client, str(tmp_path / "cache")
    for i in range(3):
        client.start("approval", run_id=f"w-{i}")
    client.start("shifts", 0.0, run_id="other")
    assert client.result("other", timeout=60) == 6
    common = ("-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", cache)

    def listed(status: str) -> list[str]:
        out = _invoke("runs", "list", "--status", status, "--json", *common)
        assert out.exit_code == 0, out.output
        return sorted(r["run_id"] for r in json.loads(out.output)["runs"])

    wait_for(lambda: listed("running") == ["w-0", "w-1", "w-2"], what="three runs running")
    dry = _invoke("runs", "pause", "--where", "workflow=approval", "--dry-run", "--json", *common)
    assert dry.exit_code == 0, dry.output
    assert sorted(json.loads(dry.output)["runs"]) == ["w-0", "w-1", "w-2"]
    assert listed("paused") == []  # a dry run sends nothing
    out = _invoke("runs", "pause", "--where", "workflow=approval", "--reason", "audit", *common)
    assert out.exit_code == 0 and "pause sent for 3 runs" in out.output, out.output
    wait_for(lambda: listed("paused") == ["w-0", "w-1", "w-2"], what="three runs paused")
    show = _invoke("runs", "show", "w-1", "--json", *common)
    row = json.loads(show.output)["run"]
    assert row["status"] == "paused" and row["reason"].startswith("paused by ")
    assert row["reason"].endswith(": audit")
    out = _invoke("runs", "unpause", "w-0", *common)
    assert out.exit_code == 0, out.output
    wait_for(lambda: listed("paused") == ["w-1", "w-2"], what="w-0 unpaused")
    report = client.unpause_where(workflow="approval", cache_dir=Path(cache))
    assert sorted(report.runs) == ["w-1", "w-2"]
    wait_for(lambda: listed("paused") == [], what="all unpaused")
    for i in range(3):
        client.signal(f"w-{i}", "approve", i)
        assert client.result(f"w-{i}", timeout=60) == {"approved": True, "by": i}
    client.pause("nobody")
    dlq = wait_for(
        lambda: [rec for _, rec, _ in read_topic(kafka_bootstrap, f"{ns}.dlq")] or None,
        what="the dead letter",
    )
    assert dlq[0]["code"] == "unknown-run" and "pause of unknown run" in dlq[0]["reason"]


def test_a_cancel_of_a_paused_run_cancels_it_and_a_pause_after_its_end_changes_nothing(
    engine, kafka_bootstrap, ns
):
    client = engine.client
    client.start("approval", run_id="c")
    wait_for(lambda: "SignalAwaited" in fact_names(kafka_bootstrap, ns, "c"), what="the wait")
    client.pause("c")
    client.cancel("c", reason="not needed")
    with pytest.raises(runstream.RunCancelled):
        client.result("c", timeout=60)
    client.pause("c")  # after its end: no fact, no dead letter
    client.unpause("c")
    # Its question goes after them on the run's partition: answered, they were decided.
    assert client.get_run("c").status == "cancelled"
    names = fact_names(kafka_bootstrap, ns, "c")
    assert names == ["RunStarted", "SignalAwaited", "RunPaused", "RunCancelled"]
    assert check_run(journal_facts(kafka_bootstrap, ns, "c")) == []
    assert read_topic(kafka_bootstrap, f"{ns}.dlq", timeout=5) == []
