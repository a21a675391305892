"""Validated updates on the real broker: a round trip, a rejection (no fact), a
duplicate update id from two clients, update-with-start, the CLI, a cancel with an update
in flight, an update admitted while no engine runs, and an engine SIGKILLed between an
update's admission and its completion (the caller gets its one result; the handler's
step completed once)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import runstream
from runstream.audit import check_run
from runstream.cli.main import cli

from .kit import (
    PARTITIONS,
    ThreadWorker,
    client_or_none,
    fact_names,
    journal_facts,
    kill,
    owns,
    spawn_worker,
    terminate,
    wait_for,
)
from .update_app import make_app

pytestmark = pytest.mark.kafka


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path, monkeypatch):
    log = tmp_path / "steps.log"
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(log))
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the worker's topics")
    yield SimpleNamespace(client=client, log=log)
    client.close()
    worker.stop()


def _paid(log: Path) -> Counter[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(" ".join(line.split()[:3]) for line in lines)


def _waiting(client: runstream.Client, bootstrap: str, ns: str, run_id: str) -> None:
    wait_for(
        lambda: "SignalAwaited" in fact_names(bootstrap, ns, run_id), timeout=60, what="a wait"
    )


def test_an_update_returns_its_result_and_a_rejected_one_records_nothing(
    engine, kafka_bootstrap, ns
):
    c = engine.client
    c.start("account", 100, run_id="a")
    assert c.update("a", "withdraw", 30) == {"balance": 70, "receipt": "receipt-30"}
    with pytest.raises(runstream.UpdateFailed) as exc:
        c.update("a", "withdraw", 500)
    assert exc.value.rejected and exc.value.code == "rejected"
    assert "insufficient funds: 70" in exc.value.message
    with pytest.raises(runstream.UpdateFailed) as exc:
        c.update("a", "deposit", 1)
    assert exc.value.code == "no-handler"
    c.signal("a", "close")
    assert c.result("a") == 70
    names = fact_names(kafka_bootstrap, ns, "a")
    assert names.count("UpdateAccepted") == 1 and names.count("UpdateCompleted") == 1
    assert check_run(journal_facts(kafka_bootstrap, ns, "a")) == []


def test_a_duplicate_update_id_gets_the_same_answer_from_any_client(engine, kafka_bootstrap, ns):
    c = engine.client
    c.start("account", 100, run_id="d")
    first = c.update("d", "withdraw", 10, update_id="once")
    with runstream.Client(ns, kafka_bootstrap) as other:
        assert other.update("d", "withdraw", 10, update_id="once") == first
    assert c.update("d", "withdraw", 10, update_id="once") == first
    assert _paid(engine.log)["pay end 10"] == 1
    assert fact_names(kafka_bootstrap, ns, "d").count("UpdateAccepted") == 1


def test_start_update_stages_and_update_with_start(engine, kafka_bootstrap, ns):
    c = engine.client
    h = c.update_with_start("account", 50, run_id="s", update="withdraw", arg=5)
    assert h.stage == "accepted"
    assert h.result() == {"balance": 45, "receipt": "receipt-5"} and h.stage == "completed"
    again = c.update_with_start("account", 50, run_id="s", update="withdraw", arg=5,
                                update_id=h.update_id, wait_for="completed")  # fmt: skip
    assert again.result() == h.result()
    assert fact_names(kafka_bootstrap, ns, "s").count("RunStarted") == 1
    admitted = c.start_update("s", "withdraw", 1, wait_for="admitted")
    assert admitted.stage == "admitted" and admitted.result()["balance"] == 44


def test_the_cli_sends_an_update_and_prints_its_result(engine, kafka_bootstrap, ns):
    engine.client.start("account", 10, run_id="cli")
    args = ["runs", "update", "cli", "withdraw", "3", "--id", "c1", "-n", ns]
    out = CliRunner().invoke(cli, [*args, "--bootstrap", kafka_bootstrap])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"balance": 7, "receipt": "receipt-3"}
    args = ["runs", "update", "cli", "withdraw", "300", "-n", ns, "--bootstrap", kafka_bootstrap]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 1 and "insufficient funds" in out.output


def test_a_cancel_with_an_update_in_flight_fails_it_with_a_clear_error(
    kafka_bootstrap, ns, tmp_path, monkeypatch
):
    monkeypatch.setenv("RUNSTREAM_TEST_GATE", str(tmp_path / "gate"))  # pay waits
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(tmp_path / "steps.log"))
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        c = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        c.start("account", 100, run_id="x")
        h = c.start_update("x", "withdraw", 30, update_id="inflight")
        c.cancel("x")
        with pytest.raises(runstream.UpdateFailed) as exc:
            h.result(timeout=60)
        assert exc.value.code == "run-ended" and "cancelled" in exc.value.message
        assert not exc.value.rejected
        with pytest.raises(runstream.UpdateFailed) as exc:  # a late duplicate: the same
            c.update("x", "withdraw", 30, update_id="inflight")
        assert exc.value.code == "run-ended"
        (tmp_path / "gate").touch()
        c.close()
    finally:
        worker.stop()


def test_an_update_admitted_while_no_engine_runs_is_decided_when_one_comes(
    kafka_bootstrap, ns, tmp_path, monkeypatch
):
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(tmp_path / "steps.log"))
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    c = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
    c.start("account", 100, run_id="later")
    _waiting(c, kafka_bootstrap, ns, "later")
    worker.stop()
    h = c.start_update("later", "withdraw", 1, wait_for="admitted")  # on the log: durable
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        assert h.result(timeout=90) == {"balance": 99, "receipt": "receipt-1"}
    finally:
        c.close()
        worker.stop()


def test_an_engine_killed_between_an_updates_admission_and_completion_answers_once(
    kafka_bootstrap, ns, tmp_path
):
    """SIGKILL while the handler's step runs (the update accepted, not completed); a new
    process of the same instance recovers the step; the caller's wait gets the result,
    the step's body completed once, and the journal has one acceptance and one outcome.
    Then SIGKILL again, and an update admitted while no owner lives is decided once the
    next one comes."""
    log, state, gate = tmp_path / "steps.log", tmp_path / "state", tmp_path / "gate"
    state.mkdir()
    env = {"RUNSTREAM_TEST_GATE": str(gate)}
    app = "tests.kafka.update_app:app"
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=app, **env)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        client.start("account", 100, run_id="crash")
        h = client.start_update("crash", "withdraw", 30, update_id="u", wait_for="accepted")
        wait_for(lambda: _paid(log)["pay begin 30"] == 1, timeout=60, what="the handler's step")
        kill(worker)
        gate.touch()
        worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=app, **env)
        assert h.result(timeout=90) == {"balance": 70, "receipt": "receipt-30"}
        assert client.update("crash", "withdraw", 30, update_id="u")["balance"] == 70
        kill(worker)  # an update admitted while its owner is dead: decided by the next
        late = client.start_update("crash", "withdraw", 5, update_id="v", wait_for="admitted")
        worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=app, **env)
        assert late.result(timeout=90) == {"balance": 65, "receipt": "receipt-5"}
        client.signal("crash", "close")
        assert client.result("crash", timeout=60) == 65
        client.close()
    finally:
        if worker.poll() is None:
            terminate(worker)
    assert _paid(log)["pay end 30"] == 1  # the killed attempt never ended; the rerun did
    assert _paid(log)["pay end 5"] == 1
    facts = journal_facts(kafka_bootstrap, ns, "crash")
    names = [type(f).__name__ for f in facts]
    assert names.count("UpdateAccepted") == 2 and names.count("UpdateCompleted") == 2
    assert "RunRecovered" in names
    assert check_run(facts) == []
