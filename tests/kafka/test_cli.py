"""The `runstream` command against the real broker."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from runstream.cli import exits
from runstream.cli.main import cli
from runstream.topics.admin import ensure_topics

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker

pytestmark = pytest.mark.kafka


def test_start_signal_get_result_cancel(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    runner = CliRunner()
    common = ["-n", ns, "--bootstrap", kafka_bootstrap]
    try:
        out = runner.invoke(cli, ["start", "three_steps", "5", "--run-id", "c1", "--wait", *common])
        assert out.exit_code == 0, out.output
        assert out.output.splitlines() == ["c1", "8"]

        assert runner.invoke(cli, ["start", "approval", "--run-id", "c2", *common]).exit_code == 0
        assert runner.invoke(cli, ["signal", "c2", "approve", '"ann"', *common]).exit_code == 0
        out = runner.invoke(cli, ["result", "c2", *common])
        assert json.loads(out.output) == {"approved": True, "by": "ann"}

        out = runner.invoke(cli, ["get", "c1", *common])
        info = json.loads(out.output)
        assert (info["status"], info["output"], info["steps"]) == ("completed", 8, 3)

        runner.invoke(cli, ["start", "approval", "--run-id", "c3", *common])
        assert runner.invoke(cli, ["cancel", "c3", "--reason", "test", *common]).exit_code == 0
        out = runner.invoke(cli, ["result", "c3", *common])
        assert out.exit_code == 1 and "RunCancelled" in out.output

        out = runner.invoke(cli, ["get", "nope", *common])
        assert out.exit_code == exits.NOT_FOUND and "RunNotFound: no run 'nope'" in out.output
        out = runner.invoke(cli, ["start", "three_steps", "{bad", *common])
        assert out.exit_code == 2 and "not JSON" in out.output
    finally:
        worker.stop()


def test_wait_timeout_json_publish_signal_with_start_and_cancel(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    runner = CliRunner()
    common = ["-n", ns, "--bootstrap", kafka_bootstrap]

    def run(*args: str) -> Any:
        return runner.invoke(cli, [*args, *common])

    try:
        # --wait DURATION waits for the result; --json makes it one document
        out = run("start", "three_steps", "5", "--run-id", "j1", "--wait", "60s", "--json")
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout) == {"run_id": "j1", "status": "completed", "output": 8}

        # signal-with-start: starts the run and delivers the signal, once
        args = ["signal-with-start", "approval", "--run-id", "s1", "--signal", "approve"]
        out = run(*args, "--payload", '"bob"', "--signal-id", "once", "--wait", "--json")
        assert out.exit_code == 0, out.output
        doc = json.loads(out.stdout)
        assert (doc["run_id"], doc["signal_id"]) == ("s1", "once")
        assert doc["output"] == {"approved": True, "by": "bob"}

        # publish: each event reaches the run waiting for it by key, a resend (the same
        # --event-id) once
        assert run("start", "listener", '"k1"', "--run-id", "l1").exit_code == 0
        ids = []
        for n in (0, 0, *range(1, 10)):
            args = ["publish", "tick", json.dumps({"n": n}), "--key", "k1", "--ttl", "5m"]
            out = run(*args, "--event-id", f"e{n}", "--json")
            assert out.exit_code == 0, out.output
            ids.append(json.loads(out.stdout)["event_id"])
        assert ids == ["e0", "e0", *(f"e{n}" for n in range(1, 10))]
        out = run("result", "l1", "--wait", "60", "--json")
        assert json.loads(out.stdout)["output"] == list(range(10)), out.output

        # --timeout is the run's own time limit, --wait how long the command waits
        assert run("start", "approval", "--run-id", "t1", "--timeout", "1s").exit_code == 0
        assert run("start", "approval", "--run-id", "w1").exit_code == 0
        out = run("result", "w1", "--wait", "0.5")
        assert out.exit_code == exits.TIMED_OUT, out.output  # w1 still waits for its signal
        assert out.stderr.count("\n") == 1
        out = run("result", "t1", "--wait", "60")
        assert out.exit_code == exits.NO and out.stderr.startswith("RunTimedOut: "), out.output

        # one cancel: by run id (the --where form is the bulk job of test_runs_ops)
        out = run("cancel", "w1", "--reason", "test", "--json")
        assert out.exit_code == 0 and json.loads(out.stdout) == {"runs": ["w1"]}, out.output
        out = run("result", "w1", "--wait", "60")
        assert out.exit_code == exits.NO and "RunCancelled" in out.stderr

        # get --tree --json: the run with its children nested
        out = run("get", "j1", "--tree", "--json")
        assert out.exit_code == 0 and json.loads(out.stdout)["children"] == [], out.output
    finally:
        worker.stop()
