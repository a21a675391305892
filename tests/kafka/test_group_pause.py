"""Pausing a task group and pausing runs by concurrency key, on the real broker.

The group test runs the engine (`tests.kafka.remote_app:app`) and a task worker each in
its own process: while the group is paused the engine sends no task of it (the worker
runs no body), a SIGKILL of the engine and its restart keep the pause (the new process
holds the steps of runs started after the restart too), `runstream tasks status` shows
it, and `runstream tasks unpause` lets every held step go at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import runstream
from runstream.audit import check_run
from runstream.cli.main import cli
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec

from .kit import (
    PARTITIONS,
    ROOT,
    ThreadWorker,
    client_or_none,
    kill,
    owns,
    read_topic,
    spawn_worker,
    terminate,
    wait_for,
)

pytestmark = pytest.mark.kafka


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def _journal(bootstrap: str, ns: str) -> list:
    codec = Codec.default()
    return [codec.decode(msg.value()) for _, _, msg in read_topic(bootstrap, f"{ns}.journal")]


def _names(facts: list, run_id: str) -> list[str]:
    return [type(f).__name__ for f in facts if f.run_id == run_id]


def _bodies(log: Path) -> list[list[str]]:
    return [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []


def _serve(ns: str, bootstrap: str, log: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RUNSTREAM_TEST_NS": ns,
        "RUNSTREAM_TEST_STEP_LOG": str(log),
        "RUNSTREAM_BOOTSTRAP_SERVERS": bootstrap,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
    }
    args = ["tasks", "serve", "tests.kafka.remote_app:app", "--group", "work"]
    with open(out, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "runstream", *args],
            env=env,
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
        )


def test_a_paused_task_group_sends_nothing_keeps_its_pause_across_a_sigkill_then_lets_go(
    kafka_bootstrap, ns, tmp_path
):
    log, state = tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    common = ("-n", ns, "--bootstrap", kafka_bootstrap)
    engine = spawn_worker(kafka_bootstrap, ns, state, "w1", app="tests.kafka.remote_app:app")
    worker = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), timeout=60, what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, timeout=60, what="w1 to own")
        out = _invoke("tasks", "pause", "work", "--reason", "carrier down", "--json", *common)
        assert out.exit_code == 0, out.output
        assert json.loads(out.output) == {"group": "work", "sent": "pause"}
        wait_for(
            lambda: (
                sum(type(f).__name__ == "GroupPaused" for f in _journal(kafka_bootstrap, ns))
                == PARTITIONS
            ),
            what="the pause on every partition",
        )
        worker = _serve(ns, kafka_bootstrap, log, tmp_path / "tasks.log")
        # runs on every partition, each held at its first remote step
        first = [f"r{i}" for i in range(8)]
        assert len({partition_for(r.encode(), PARTITIONS) for r in first}) > 1
        for i, run_id in enumerate(first):
            client.start("double_twice", i, run_id=run_id)
        wait_for(
            lambda: all("StepHeld" in _names(_journal(kafka_bootstrap, ns), r) for r in first),
            timeout=60,
            what="every run's step held",
        )
        kill(engine)  # SIGKILL, while the group is paused
        engine = spawn_worker(kafka_bootstrap, ns, state, "w1", app="tests.kafka.remote_app:app")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, timeout=90, what="the restart")
        late = [f"late{i}" for i in range(4)]
        for i, run_id in enumerate(late):
            client.start("double_twice", 10 + i, run_id=run_id)
        wait_for(
            lambda: all("StepHeld" in _names(_journal(kafka_bootstrap, ns), r) for r in late),
            timeout=90,
            what="the new process to hold the late runs' steps",
        )
        facts = _journal(kafka_bootstrap, ns)
        assert not [f for f in facts if type(f).__name__ == "StepStarted"], "a step was sent"
        assert _bodies(log) == []  # the task worker ran nothing
        status = _invoke("tasks", "status", "--group", "work", "--json", *common)
        assert status.exit_code == 0, status.output
        [row] = json.loads(status.output)
        assert row["paused"]["partitions"] == PARTITIONS and row["held"] == 12
        assert row["paused"]["reason"] == "carrier down" and row["in_flight"] == 0

        out = _invoke("tasks", "unpause", "work", *common)
        assert out.exit_code == 0 and "unpause sent" in out.output, out.output
        for i, run_id in enumerate(first):
            assert client.result(run_id, timeout=90) == i * 4
        for i, run_id in enumerate(late):
            assert client.result(run_id, timeout=90) == (10 + i) * 4
        client.close()
    finally:
        if worker is not None:
            worker.kill()
            worker.wait(10)
        if engine.poll() is None:
            terminate(engine)
    facts = _journal(kafka_bootstrap, ns)
    for run_id in first + late:
        mine = [f for f in facts if f.run_id == run_id]
        assert check_run(mine, expect_finished=True) == [], run_id
        held = next(f for f in mine if type(f).__name__ == "StepHeld")
        started = [f for f in mine if type(f).__name__ == "StepStarted"]
        assert started[0].at_ms >= held.at_ms and started[0].attempt == 1
        # its timeout counts from the unpause, not from when it was held
        assert started[0].deadline_ms == started[0].at_ms + 60_000
    begins = [b for b in _bodies(log) if b[0] == "begin"]
    assert len(begins) == 2 * len(first + late)  # each body once per step


def test_runs_pause_and_unpause_by_concurrency_key(kafka_bootstrap, ns, tmp_path):
    app = runstream.App(ns, kafka_bootstrap)

    @app.workflow(concurrency_key=lambda order: order["customer"], limit=5)
    async def order(ctx: runstream.Context, order: dict) -> str:
        await ctx.wait_for_signal("ship")
        return order["customer"]

    @app.workflow(concurrency_key=lambda order: order["customer"], limit=5)
    async def invoice(ctx: runstream.Context, order: dict) -> str:
        await ctx.wait_for_signal("ship")
        return order["customer"]

    engine = ThreadWorker(app, tmp_path / "state")
    cache = str(tmp_path / "cache")
    common = ("-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", cache)
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="the engine's topics")
        client.start(order, {"customer": "acme"}, run_id="o-acme-1")
        client.start(order, {"customer": "acme"}, run_id="o-acme-2")
        client.start(order, {"customer": "zeta"}, run_id="o-zeta")
        client.start(invoice, {"customer": "acme"}, run_id="i-acme")  # the key of another limit

        def status(run_id: str) -> str:
            return client.get_run(run_id).status

        runs = ["o-acme-1", "o-acme-2", "o-zeta", "i-acme"]
        wait_for(lambda: all(status(r) == "running" for r in runs), what="the runs running")

        def dry_run(where: str) -> list[str]:
            out = _invoke("runs", "pause", "--where", where, "--dry-run", "--json", *common)
            assert out.exit_code == 0, out.output
            return sorted(json.loads(out.output)["runs"])

        acme = ["i-acme", "o-acme-1", "o-acme-2"]  # two limits: order's and invoice's
        wait_for(lambda: dry_run("key=acme") == acme, what="the runs of key acme")
        assert dry_run("workflow=order,key=acme") == ["o-acme-1", "o-acme-2"]
        assert dry_run("key=nobody") == []
        out = _invoke("runs", "pause", "--where", "workflow=order,key=acme", *common)
        assert out.exit_code == 0 and "pause sent for 2 runs" in out.output, out.output
        wait_for(lambda: status("o-acme-1") == status("o-acme-2") == "paused", what="paused")
        assert status("o-zeta") == status("i-acme") == "running"
        bad = _invoke("runs", "cancel", "--where", "key=acme", *common)
        assert bad.exit_code == 2 and "use status=S" in bad.output  # only pause takes key=
        report = client.unpause_where(key="acme", cache_dir=Path(cache))
        assert sorted(report.runs) == ["o-acme-1", "o-acme-2"]
        wait_for(lambda: status("o-acme-1") == status("o-acme-2") == "running", what="unpaused")
        client.signal("o-acme-1", "ship", True)
        assert client.result("o-acme-1", timeout=60) == "acme"
        client.close()
    finally:
        engine.stop()
