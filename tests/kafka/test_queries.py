"""Queries on the real broker: ``get_event`` answered from the runs read model with no
engine running, after the owner is SIGKILLed and restarted (each value set once), for a
retried run and across continue-as-new; live queries answered by the owner, and "owner
unavailable" within the timeout when none runs; the CLI's ``runs event`` and ``runs
query``."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import runstream
from runstream.audit import check_run
from runstream.cli import exits
from runstream.cli.main import cli

from .kit import (
    PARTITIONS,
    ThreadWorker,
    client_or_none,
    journal_facts,
    kill,
    owns,
    spawn_worker,
    terminate,
    wait_for,
)
from .query_app import make_app

pytestmark = pytest.mark.kafka

APP = "tests.kafka.query_app:app"


@pytest.fixture
def engine(kafka_bootstrap, ns, tmp_path, monkeypatch):
    """One engine instance on a thread (``.stop()`` it to go on without one)."""
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(tmp_path / "steps.log"))
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the worker's topics")
    eng = SimpleNamespace(client=client, worker=worker, cache=tmp_path / "cache")
    wait_for(lambda: _readable(client, eng.cache), what="the lifecycle topic's leaders")
    yield eng
    client.close()
    if eng.worker is not None:
        eng.worker.stop()


def _readable(client: runstream.Client, cache: Path) -> bool:
    """The runs read model can read the new namespace's lifecycle topic (just created,
    a partition may have no leader yet: NOT_LEADER_FOR_PARTITION)."""
    try:
        client.list_runs(cache_dir=cache)
    except runstream.KafkaUnavailable:
        return False
    return True


def _reaches(client: runstream.Client, run_id: str, key: str, value: object, cache: Path):
    """``key``'s answer once its value is ``value`` (the run may not be in the model yet)."""
    found = client.get_event(run_id, key, wait=60, cache_dir=cache)
    deadline = time.monotonic() + 60
    while found is None or found.value != value:
        assert time.monotonic() < deadline, f"{run_id} {key} is {found}, never {value!r}"
        time.sleep(0.2)
        found = client.get_event(run_id, key, cache_dir=cache)
    return found


def _sets(facts: list) -> list[tuple[str, object]]:
    return [(f.key, json.loads(f.value)) for f in facts if type(f).__name__ == "RunEventSet"]


def test_get_event_answers_from_the_read_model_with_no_engine_running(engine, kafka_bootstrap, ns):
    client, cache = engine.client, engine.cache
    client.start("tracker", ["a", "b"], run_id="t1")
    packed = _reaches(client, "t1", "stage", "packed", cache)
    assert packed.run_id == "t1" and packed.key == "stage"
    assert packed.as_of > packed.offset >= 0 and 0 <= packed.partition < PARTITIONS
    assert client.query("t1", "packed") == ["a", "b"]
    engine.worker.stop()
    engine.worker = None

    again = client.get_event("t1", "stage", cache_dir=cache)  # no engine: the model answers
    assert again == packed
    assert client.get_event("t1", "never", cache_dir=cache) is None
    with pytest.raises(runstream.RunNotFound):
        client.get_event("nobody", "stage", cache_dir=cache)
    with pytest.raises(TimeoutError):
        client.get_event("t1", "never", wait=1, cache_dir=cache)
    with pytest.raises(runstream.OwnerUnavailable, match="no engine instance answered"):
        client.query("t1", "packed", timeout=2)


def test_a_live_query_is_answered_by_the_owner_and_changes_no_journal(engine, kafka_bootstrap, ns):
    client = engine.client
    client.start("tracker", ["x"], run_id="t2")
    wait_for(lambda: client.query("t2", "packed") == ["x"], what="the step")
    before = journal_facts(kafka_bootstrap, ns, "t2")
    assert client.query("t2", "has", "x") is True
    assert client.query("t2", "has", "y") is False
    with pytest.raises(runstream.QueryFailed, match="no query handler 'nope'"):
        client.query("t2", "nope")
    with pytest.raises(runstream.RunNotFound):
        client.query("nobody", "packed")
    assert journal_facts(kafka_bootstrap, ns, "t2") == before
    client.signal("t2", "ship")
    assert client.result("t2", timeout=30) == {"packed": ["x"]}
    assert client.query("t2", "packed") == ["x"]  # an ended run still answers


def test_get_event_waits_and_a_run_that_ends_without_the_key_says_so(engine, kafka_bootstrap, ns):
    client, cache = engine.client, engine.cache
    client.start("tracker", [], run_id="t3")
    client.signal("t3", "ship")
    assert _reaches(client, "t3", "stage", "shipped", cache).run_id == "t3"
    client.start("silent", run_id="s1")
    client.signal("s1", "end")
    with pytest.raises(runstream.EventNotSet, match="run 's1' ended completed without setting 'x'"):
        client.get_event("s1", "x", wait=60, cache_dir=cache)


def test_a_retried_run_keeps_its_events_and_sets_each_once(engine, kafka_bootstrap, ns):
    client, cache = engine.client, engine.cache
    client.start("flaky", run_id="f1")
    with pytest.raises(runstream.RunFailed):
        client.result("f1", timeout=30)
    assert client.get_event("f1", "before", cache_dir=cache).value == 1
    assert client.get_event("f1", "after", cache_dir=cache) is None
    client.retry("f1")
    assert client.result("f1", timeout=30) == "done"
    assert client.get_event("f1", "after", wait=30, cache_dir=cache).value == 2
    facts = journal_facts(kafka_bootstrap, ns, "f1")
    assert _sets(facts) == [("before", 1), ("after", 2)]
    assert check_run(facts) == []


def test_across_continue_as_new_get_event_follows_the_runs_that_carry_it_on(
    engine, kafka_bootstrap, ns
):
    """Each incarnation journals its own events; ``get_event`` on the first id answers
    with the newest value along the chain, and a key only an earlier run set stays."""
    client, cache = engine.client, engine.cache
    client.start("rounds", 0, run_id="c1")
    newest = _reaches(client, "c1", "round", 2, cache)
    assert newest.run_id == "c1~2"
    first = client.get_event("c1", "first", cache_dir=cache)
    assert (first.run_id, first.value) == ("c1", True)
    assert client.get_event("c1~2", "first", cache_dir=cache) is None  # its own only
    client.signal("c1~2", "end")
    last = client.get_event("c1", "last", wait=60, cache_dir=cache)
    assert (last.run_id, last.value) == ("c1~2", 2)
    assert _sets(journal_facts(kafka_bootstrap, ns, "c1")) == [("round", 0), ("first", True)]
    assert _sets(journal_facts(kafka_bootstrap, ns, "c1~1")) == [("round", 1)]


def test_an_owner_killed_after_set_event_restarts_with_each_value_set_once(
    kafka_bootstrap, ns, tmp_path
):
    """SIGKILL once the run's first event and steps are committed; the same instance
    restarts; the run goes on: every event is in the journal once, each step ran once,
    and get_event answers before, during (no engine) and after."""
    log, state, cache = tmp_path / "steps.log", tmp_path / "state", tmp_path / "cache"
    state.mkdir()
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=APP)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        client.start("tracker", ["a", "b", "c"], run_id="k1")
        packed = _reaches(client, "k1", "stage", "packed", cache)
        kill(worker)
        assert client.get_event("k1", "stage", cache_dir=cache) == packed  # no engine
        with pytest.raises(runstream.OwnerUnavailable):
            client.query("k1", "packed", timeout=2)
        worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, app=APP)
        assert wait_for(lambda: _answer(client, "k1"), timeout=90, what="the new owner")
        client.signal("k1", "ship")
        assert client.result("k1", timeout=90) == {"packed": ["a", "b", "c"]}
        shipped = client.get_event("k1", "stage", cache_dir=cache)
        assert shipped.value == "shipped" and shipped.offset > packed.offset
        client.close()
    finally:
        if worker.poll() is None:
            terminate(worker)
    lines = Path(log).read_text().splitlines()
    assert Counter(lines) == {"pack k1 a": 1, "pack k1 b": 1, "pack k1 c": 1}
    facts = journal_facts(kafka_bootstrap, ns, "k1")
    assert _sets(facts) == [("stage", "packing"), ("stage", "packed"), ("stage", "shipped")]
    assert check_run(facts) == []


def _answer(client: runstream.Client, run_id: str) -> object:
    try:
        return client.query(run_id, "packed", timeout=5)
    except runstream.OwnerUnavailable:
        return None


def test_the_cli_reads_an_event_and_asks_a_query(engine, kafka_bootstrap, ns, tmp_path):
    client = engine.client
    client.start("tracker", ["z"], run_id="cli1")
    wait_for(lambda: client.query("cli1", "packed") == ["z"], what="the step")
    runner = CliRunner()
    common = ["-n", ns, "--bootstrap", kafka_bootstrap]
    cache = ["--cache-dir", str(tmp_path / "clicache")]
    args = ["runs", "event", "cli1", "stage", "--wait", "30", "--json"]
    out = runner.invoke(cli, [*args, *common, *cache])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["key"] == "stage" and got["run_id"] == "cli1" and got["as_of"] > got["offset"]
    out = runner.invoke(cli, ["runs", "show", "cli1", "--json", *common, *cache])
    timeline = json.loads(out.output)["timeline"]
    assert [e["key"] for e in timeline if e["type"] == "run.event_set"] == ["stage", "stage"]
    out = runner.invoke(cli, ["runs", "event", "cli1", "nope", *common, *cache])
    assert out.exit_code == 1 and "has not set 'nope'" in out.output
    out = runner.invoke(cli, ["runs", "query", "cli1", "has", '"z"', *common])
    assert out.exit_code == 0 and out.output.strip() == "true", out.output
    out = runner.invoke(cli, ["runs", "query", "cli1", "nope", *common])
    assert out.exit_code == exits.ERROR and "no query handler 'nope'" in out.output


def test_a_cancelled_run_keeps_its_events_and_a_wait_for_an_unset_key_ends(
    engine, kafka_bootstrap, ns
):
    client, cache = engine.client, engine.cache
    client.start("tracker", ["a"], run_id="x1")
    packed = _reaches(client, "x1", "stage", "packed", cache)
    client.cancel("x1", reason="changed my mind")
    with pytest.raises(runstream.EventNotSet, match="run 'x1' ended cancelled without setting"):
        client.get_event("x1", "never", wait=60, cache_dir=cache)
    assert client.get_event("x1", "stage", cache_dir=cache).value == packed.value
    assert client.query("x1", "packed") == ["a"]  # a cancelled run still answers


def test_queries_are_answered_across_a_handover_between_two_instances(
    engine, kafka_bootstrap, ns, tmp_path
):
    """A second instance joins (partitions move to it), then the first stops: every
    run's query is answered throughout, by whichever instance owns its partition, and
    the events stay readable."""
    client, cache = engine.client, engine.cache
    run_ids = [f"h{i}" for i in range(8)]  # over the 4 partitions
    for run_id in run_ids:
        client.start("tracker", [run_id], run_id=run_id)
    for run_id in run_ids:
        _reaches(client, run_id, "stage", "packed", cache)
    second = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state2", instance="w2")
    try:
        wait_for(lambda: owns(tmp_path / "state2", ns, "w2"), timeout=60, what="w2 to own some")
        for run_id in run_ids:
            assert wait_for(lambda r=run_id: _answer(client, r), timeout=60, what=run_id) == [
                run_id
            ]
        engine.worker.stop()
        engine.worker = None
        for run_id in run_ids:
            assert wait_for(lambda r=run_id: _answer(client, r), timeout=60, what=run_id) == [
                run_id
            ]
            client.signal(run_id, "ship")
        for run_id in run_ids:
            assert client.result(run_id, timeout=60) == {"packed": [run_id]}
            assert _reaches(client, run_id, "stage", "shipped", cache).run_id == run_id
    finally:
        second.stop()
