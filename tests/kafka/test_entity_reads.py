"""A workflow's shared read of an entity's key (`EntityRef.read`) against the broker:
exactly once across a SIGKILL of the workflow's owner between the ask and the answer
(its app: `entity_app.py`)."""

from __future__ import annotations

from collections import Counter

from runstream.audit import check_run

from .kit import (
    PARTITIONS,
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
