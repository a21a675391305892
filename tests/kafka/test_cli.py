"""The `runstream` command against the real broker."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

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
        assert out.exit_code == 1 and "RunNotFound: no run 'nope'" in out.output
        out = runner.invoke(cli, ["start", "three_steps", "{bad", *common])
        assert out.exit_code == 2 and "not JSON" in out.output
    finally:
        worker.stop()
