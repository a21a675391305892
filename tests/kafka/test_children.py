"""Child workflows across partitions and processes, with a SIGKILL mid-flight."""

from __future__ import annotations

from collections import Counter

import pytest

import runstream
from runstream.audit.reader import audit
from runstream.engine.partitioner import partition_for

from .kit import PARTITIONS, kill, owns, read_topic, spawn_worker, terminate, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CHILDREN = 100


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def test_a_parent_sigkilled_while_its_100_children_run_completes_with_each_child_once(
    kafka_bootstrap, ns, tmp_path
):
    log, state = tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", log)
    w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", log)
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        client.start("parent", CHILDREN, run_id="p")
        wait_for(
            lambda: log.exists() and len(log.read_text().splitlines()) >= CHILDREN // 3,
            timeout=120,
            what="a third of the children",
        )
        # SIGKILL the parent's instance, mid-flight; its children are on both instances
        parent_partition = partition_for(b"p", PARTITIONS)
        owner = wait_for(
            lambda: next((n for n in ("w1", "w2") if parent_partition in owns(state, ns, n)), None),
            what="the parent's owner",
        )
        victim, survivor = (w1, w2) if owner == "w1" else (w2, w1)
        kill(victim)
        executions = client.result("p", timeout=180)
        assert survivor.poll() is None
    finally:
        for w in (w1, w2):
            if w.poll() is None:
                terminate(w)
    kids = [f"p/{i}" for i in range(1, CHILDREN + 1)]
    assert len(executions) == CHILDREN
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=60)
    by_run = Counter((name, r["run_id"]) for name, r, _ in journal)
    assert by_run["ChildStarted", "p"] == CHILDREN and by_run["ChildEnded", "p"] == CHILDREN
    for kid in kids:  # each child started once and ended once
        assert by_run["RunStarted", kid] == 1 and by_run["RunCompleted", kid] == 1, kid
    commands = read_topic(kafka_bootstrap, f"{ns}.commands", timeout=60)
    starts = Counter(r["run_id"] for name, r, _ in commands if name == "StartRun")
    assert {kid: starts[kid] for kid in kids} == dict.fromkeys(kids, 1)  # one StartRun each
    # Each child's step: the journal recorded one execution, the last one that ran; a
    # second one only where a body was in flight when the instance died.
    ran: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        run, _n, execution = line.split()
        ran.setdefault(run, []).append(execution)
    assert set(ran) == set(kids)
    for kid, execution in zip(kids, executions, strict=True):
        assert ran[kid][-1] == execution, (kid, ran[kid])
    again = sum(len(e) - 1 for e in ran.values())
    assert again <= 2, ran  # children run one at a time: at most the one in flight
    report = audit(kafka_bootstrap, ns, expect_finished=True)
    assert report.violations == [], report.violations


def test_get_run_names_parent_and_children_and_get_tree_draws_them(kafka_bootstrap, ns, tmp_path):
    from click.testing import CliRunner

    from runstream.cli.main import cli
    from runstream.topics.admin import ensure_topics

    from .flows import make_app
    from .kit import PARTITIONS, ThreadWorker

    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("parent", 2, run_id="fam")
            assert len(client.result("fam", timeout=60)) == 2
            assert client.get_run("fam").children == ["fam/1", "fam/2"]
            assert client.get_run("fam/2").parent_run_id == "fam"
        out = CliRunner().invoke(
            cli, ["get", "fam", "--tree", "-n", ns, "--bootstrap", kafka_bootstrap]
        )
        assert out.exit_code == 0, out.output
        lines = out.output.splitlines()
        assert any("fam " in line and "parent" in line for line in lines), out.output
        assert sum("kid" in line and "completed" in line for line in lines) == 2, out.output
    finally:
        worker.stop()
