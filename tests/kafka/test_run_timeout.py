"""Run timeouts (a durable timer) and signal-with-start, against the real broker."""

from __future__ import annotations

import time

import pytest

import runstream
from runstream.topics.admin import ensure_topics

from .kit import PARTITIONS, ThreadWorker, wait_for
from .test_runs_ops import journal_of

pytestmark = pytest.mark.kafka


def make_app(ns: str, bootstrap: str) -> runstream.App:
    app = runstream.App(ns, bootstrap=bootstrap)

    @app.workflow
    async def nap(ctx: runstream.Context) -> str:
        await ctx.sleep("1h")
        return "rested"

    @app.workflow(timeout="1h")
    async def approval(ctx: runstream.Context, order: str) -> dict:
        return {"order": order, "by": (await ctx.wait_for_signal("approve"))["by"]}

    return app


def test_a_run_timeout_survives_an_engine_restart_and_fails_the_run(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    app = make_app(ns, kafka_bootstrap)
    worker = ThreadWorker(app, tmp_path / "state")
    with runstream.Client(ns, kafka_bootstrap) as client:
        client.start("nap", run_id="n-1", timeout=3)
        assert client.get_run("n-1").status == "running"
        worker.stop()  # the deadline passes while no engine runs
        time.sleep(3.5)
        worker = ThreadWorker(app, tmp_path / "state2", instance="w2")
        try:
            with pytest.raises(runstream.RunTimedOut, match="did not end within its timeout") as e:
                client.result("n-1", timeout=60)
            assert e.value.code == client.get_run("n-1").code == runstream.Failure.TIMED_OUT
        finally:
            worker.stop()


def test_signal_with_start_delivers_once_whether_or_not_the_run_exists(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            for _ in range(2):  # a retried call: same signal id
                client.signal_with_start(
                    "approval", "o-1", run_id="a-1", signal="approve", value={"by": "ann"},
                    signal_id="approve-a-1",
                )  # fmt: skip
            assert client.result("a-1", timeout=60) == {"order": "o-1", "by": "ann"}
            client.start("approval", "o-2", run_id="a-2")
            client.signal_with_start(
                "approval", "ignored", run_id="a-2", signal="approve", value={"by": "bo"}
            )
            assert client.result("a-2", timeout=60) == {"order": "o-2", "by": "bo"}
    finally:
        worker.stop()
    journal = journal_of(kafka_bootstrap, ns)
    for run_id in ("a-1", "a-2"):
        names = [type(f).__name__ for f in journal[run_id]]
        assert names.count("RunStarted") == 1 and names.count("SignalReceived") == 1, names


def test_a_run_that_timed_out_retried_has_its_timeout_again_and_goes_on(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("approval", "o-1", run_id="a-1", timeout=6)
            with pytest.raises(runstream.RunTimedOut):
                client.result("a-1", timeout=60)
            client.retry("a-1")

            def retried() -> bool:
                return "RunRetried" in [
                    type(f).__name__ for f in journal_of(kafka_bootstrap, ns)["a-1"]
                ]

            wait_for(retried, what="the retry")  # before the fix, it had failed again by then
            client.signal("a-1", "approve", {"by": "ann"})  # within its fresh 6 s
            assert client.result("a-1", timeout=60) == {"order": "o-1", "by": "ann"}
    finally:
        worker.stop()
    names = [type(f).__name__ for f in journal_of(kafka_bootstrap, ns)["a-1"]]
    assert names.count("RunFailed") == 1 and names[-1] == "RunCompleted"
