"""Schedules against the real broker: an engine down across fire times catches up once."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

import runstream
from runstream.cli.main import cli
from runstream.topics.admin import ensure_topics

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka

EVERY = 3  # seconds between fire times


def fires(bootstrap: str, ns: str) -> list[dict]:
    journal = read_topic(bootstrap, f"{ns}.journal", timeout=30)
    return [r for name, r, _ in journal if name == "ScheduleFired"]


def schedules_json(common: list[str]) -> str:
    out = CliRunner().invoke(cli, ["schedules", "list", *common, "--json"])
    assert out.exit_code == 0, out.output
    return out.output


def test_a_schedule_down_across_two_fire_times_catches_up_once_then_runs_on_time(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    app = make_app(ns, kafka_bootstrap)
    worker = ThreadWorker(app, tmp_path / "state")
    with runstream.Client(ns, kafka_bootstrap) as client:
        client.schedule("beat", "three_steps", 1, cron=f"* * * * * */{EVERY}")
        wait_for(lambda: len(fires(kafka_bootstrap, ns)) >= 1, timeout=30, what="a first fire")
        worker.stop()
        stopped_ms = int(time.time() * 1000)
        time.sleep(2 * EVERY + 1)  # two fire times or more pass with no engine
        worker = ThreadWorker(app, tmp_path / "state2", instance="w2")
        try:
            wait_for(
                lambda: sum(f["fire_ms"] > stopped_ms for f in fires(kafka_bootstrap, ns)) >= 2,
                timeout=60,
                what="two fires after the restart",
            )
            out = CliRunner().invoke(
                cli, ["schedules", "list", "-n", ns, "--bootstrap", kafka_bootstrap, "--json"]
            )
            assert out.exit_code == 0 and '"name": "beat"' in out.output, out.output
            done = fires(kafka_bootstrap, ns)
            for f in done:
                assert client.result(f["run"], timeout=60) == 4

            # Paused from the CLI, it fires no more; deleted, it is gone from the list.
            common = ["-n", ns, "--bootstrap", kafka_bootstrap]
            assert CliRunner().invoke(cli, ["schedules", "pause", "beat", *common]).exit_code == 0
            wait_for(lambda: '"status": "paused"' in schedules_json(common), what="paused")
            paused = len(fires(kafka_bootstrap, ns))
            time.sleep(2 * EVERY)
            assert len(fires(kafka_bootstrap, ns)) == paused
            assert CliRunner().invoke(cli, ["schedules", "delete", "beat", *common]).exit_code == 0
            wait_for(lambda: schedules_json(common).strip() == "[]", what="deleted")
        finally:
            worker.stop()
    fire_times = sorted(f["fire_ms"] for f in done)
    assert len(set(fire_times)) == len(fire_times)  # no fire time twice
    before = [t for t in fire_times if t <= stopped_ms]
    after = [t for t in fire_times if t > stopped_ms]
    # The fire times after the last fire before the stop, up to the first fire after it:
    # two or more came while no engine ran, and one run caught them up, for the latest ...
    due_while_down = (after[0] - before[-1]) // (EVERY * 1000)
    assert due_while_down >= 2, (before, after)
    # ... and the next came on its own time.
    assert after[1] - after[0] == EVERY * 1000
