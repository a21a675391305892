"""A workflow's shared read of an entity's key (`EntityRef.read`) against the broker:
exactly once across a SIGKILL of the workflow's owner between the ask and the answer,
never behind an exclusive call; and a call cycle through a child workflow refused (its
app: `entity_app.py`)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

import runstream
from runstream.audit import check_run

from .entity_app import make_app
from .kit import (
    PARTITIONS,
    ThreadWorker,
    client_or_none,
    journal_facts,
    owns,
    spawn_worker,
    terminate,
    wait_for,
)

APP = "tests.kafka.entity_app:app"


def test_a_read_whose_owner_is_killed_between_ask_and_answer_is_recorded_once(
    kafka_bootstrap, ns, tmp_path
):
    """The shared handler SIGKILLs the engine the first time it runs: the ask (the read's
    promise and its query to the key's lock) is committed, its answer is not. The
    worker's supervisor starts a new engine process, which answers it: the run records
    one answer, the balance as it was, and the code after the read runs once."""
    log, state, marker = tmp_path / "steps.log", tmp_path / "state", tmp_path / "killed"
    state.mkdir()
    env = {"RUNSTREAM_TEST_KILL_ONCE": str(marker)}
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=APP, **env)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        assert client.entity("ledger", "ann").call("deposit", {"call": "d", "amount": 5}) == 5
        run_id = client.start("auditor", "ann")
        assert client.result(run_id, timeout=90) == 5
        assert marker.exists()  # the read killed its engine once
        assert "engine process exited with -9" in (tmp_path / "w1.log").read_text()
        client.close()
    finally:
        if worker.poll() is None:
            terminate(worker)
    lines = Counter(" ".join(line.split()[:4]) for line in log.read_text().splitlines())
    reads = [line for line in log.read_text().splitlines() if line.startswith("read ann ")]
    assert len({line.split()[-1] for line in reads}) == len(reads) == 2  # one per process
    assert lines["post end ann audit"] == 1
    facts = journal_facts(kafka_bootstrap, ns, run_id)
    names = Counter(type(f).__name__ for f in facts)
    assert names["PromiseCreated"] == 1 and names["PromiseCompleted"] == 1, names
    assert check_run(facts) == []


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path, monkeypatch):
    log, gate = tmp_path / "steps.log", tmp_path / "gate"
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(log))
    monkeypatch.setenv("RUNSTREAM_TEST_GATE", str(gate))
    monkeypatch.delenv("RUNSTREAM_TEST_KILL_ONCE", raising=False)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the worker's topics")
    yield SimpleNamespace(client=client, log=log, gate=gate)
    client.close()
    worker.stop()


def test_headers_travel_with_a_clients_read_and_a_workflows_read(engine):
    client = engine.client
    assert client.entity("ledger", "ann").read("tenant", headers={"tenant": "zed"}) == "zed"
    run_id = client.start("asks_tenant", "ann", headers={"tenant": "acme"})
    assert client.result(run_id, timeout=30) == "acme"


def test_a_workflows_read_never_waits_behind_a_call_holding_the_key(engine):
    client, gate = engine.client, engine.gate
    ann = client.entity("ledger", "ann")
    gate.touch()
    assert ann.call("deposit", {"call": "d0", "amount": 5}) == 5
    gate.unlink()  # the next deposit holds the key in its step until the gate is back
    held = ann.start("deposit", {"call": "d1", "amount": 7}, call_id="d1")
    wait_for(lambda: ann.show(timeout=10)["in_progress"] == [held], what="d1 to hold ann")
    assert client.result(client.start("peeker", "ann"), timeout=30) == 5
    assert client.result(client.start("peeker", "nobody"), timeout=30) == 0
    gate.touch()
    assert client.result(held, timeout=30)["result"] == 12


def test_a_cycle_through_a_child_workflow_is_refused_and_frees_the_key(engine):
    engine.gate.touch()
    ann = engine.client.entity("ledger", "ann")
    with pytest.raises(
        runstream.RunFailed, match=r"call cycle: ledger\['ann'\] -> ledger\['ann'\]"
    ):
        ann.call("via_payer", {"key": "ann", "call": "c", "amount": 1}, timeout=30)
    assert ann.call("via_payer", {"key": "bob", "call": "c", "amount": 3}, timeout=30) == 3
    assert ann.call("deposit", {"call": "d", "amount": 2}, timeout=30) == 2
