"""The pytest plugin's ``runstream_kafka`` fixture gives a broker a real engine runs on."""

from __future__ import annotations

import pytest

import runstream
from runstream.testing import WorkflowTester

from .kit import ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka


def make_app(ns: str, bootstrap: str) -> runstream.App:
    app = runstream.App(ns, bootstrap)

    @app.step
    def double(x: int) -> int:
        return 2 * x

    @app.workflow
    async def double_twice(ctx: runstream.Context, x: int) -> int:
        x = await ctx.step(double, x)
        await ctx.sleep(0.2)
        return await ctx.step(double, x)

    return app


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:  # the worker has not created the topics yet
        return None


def test_runstream_kafka_runs_an_engine_whose_journal_the_testing_kit_matches(
    runstream_kafka, ns, tmp_path
):
    app = make_app(ns, runstream_kafka)
    worker = ThreadWorker(app, tmp_path / "state")
    try:
        client = wait_for(lambda: _client(ns, runstream_kafka), what="the worker's topics")
        try:
            client.start("double_twice", 3, run_id="r1")
            assert client.result("r1", timeout=60) == 12
        finally:
            client.close()
    finally:
        worker.stop()
    records = read_topic(runstream_kafka, f"{ns}.journal")
    journal = [name for name, rec, _ in records if rec["run_id"] == "r1"]

    tester = WorkflowTester(make_app(ns, runstream_kafka))
    run = tester.start("double_twice", 3, run_id="r1")
    assert run.status == "running"  # its sleep waits for the test to let time pass
    tester.run_until_idle()
    assert run.result() == 12
    assert [type(f).__name__ for f in run.history] == journal
