"""Children at the edges, against the broker: a child refused on its own partition
answers its parent (issue 19, defect 4); a cancel follows continue-as-new, from a parent
or from `runs cancel --where` (defect 5)."""

from __future__ import annotations

import json

import pytest

import runstream
from runstream.audit.reader import audit
from runstream.errors import ChildFailed
from runstream.topics.admin import ensure_topics

from .kit import PARTITIONS, ThreadWorker, read_topic, wait_for

pytestmark = [pytest.mark.kafka]


def test_a_child_whose_concurrency_key_fails_makes_its_parent_catch_child_failed(
    kafka_bootstrap, ns, tmp_path
):
    app = runstream.App(ns, kafka_bootstrap)

    @app.workflow(concurrency_key=lambda order: order["customer"])
    async def charge(ctx: runstream.Context, order: dict) -> str:
        return "charged"

    @app.workflow
    async def checkout(ctx: runstream.Context, order: dict) -> str:
        try:
            return await ctx.child(charge, order)
        except ChildFailed as exc:
            return f"caught {exc.status}: {exc.error}"

    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(app, tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start(checkout, {"no_customer": 1}, run_id="co")
            out = client.result("co", timeout=60)
    finally:
        worker.stop()
    assert out.startswith("caught rejected: invalid-input: ") and "concurrency_key" in out
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=30)
    assert [n for n, r, _ in journal if r["run_id"] == "co/1"] == ["RunRejected"]
    assert audit(kafka_bootstrap, ns, expect_finished=True).violations == []


def test_cancelling_a_parent_cancels_its_child_that_continued_as_new(kafka_bootstrap, ns, tmp_path):
    app = runstream.App(ns, kafka_bootstrap)

    @app.workflow
    async def looper(ctx: runstream.Context, n: int) -> str:
        if n > 0:
            ctx.continue_as_new(n - 1)
        return await ctx.wait_for_signal("go")

    @app.workflow
    async def holder(ctx: runstream.Context, n: int) -> str:
        return await ctx.child(looper, n)

    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(app, tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start(holder, 2, run_id="h")
            wait_for(lambda: _status(client, "h/1~2") == "running", what="the child's 2nd run")
            client.cancel("h")
            with pytest.raises(runstream.RunCancelled):
                client.result("h", timeout=60)
            with pytest.raises(runstream.RunCancelled):
                client.result("h/1", timeout=60)  # follows the chain to h/1~2
    finally:
        worker.stop()
    assert audit(kafka_bootstrap, ns, expect_finished=True).violations == []


def test_runs_cancel_where_follows_a_selected_run_that_continued_as_new(
    kafka_bootstrap, ns, tmp_path
):
    from click.testing import CliRunner

    from runstream.cli.main import cli
    from runstream.cli.runs_cmd import model_path
    from runstream.cli.runs_ops import CancelJob

    app = runstream.App(ns, kafka_bootstrap)

    @app.workflow
    async def hop(ctx: runstream.Context, n: int) -> str:
        if n > 0:
            await ctx.wait_for_signal("hop")
            ctx.continue_as_new(n - 1)
        return await ctx.wait_for_signal("go")

    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(app, tmp_path / "state")
    cache = tmp_path / "cache"
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(cache)]
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start(hop, 1, run_id="hop-1")
            wait_for(lambda: _status(client, "hop-1") == "running", what="hop-1")
            # A job that selected hop-1 while it ran, then was stopped before sending...
            where = {"workflow": "hop"}
            jobs = model_path(cache, kafka_bootstrap, ns).with_name(f"{ns}.jobs")
            CancelJob(where, ["hop-1"], reason="test").create(CancelJob.path(jobs, where))
            # ...and meanwhile hop-1 continued as new.
            client.signal("hop-1", "hop", None)
            wait_for(lambda: _status(client, "hop-1~1") == "running", what="hop-1~1")
            out = CliRunner().invoke(
                cli, ["runs", "cancel", "--where", "workflow=hop", *common, "--json"]
            )
            assert out.exit_code == 0, out.output
            assert json.loads(out.stdout)["statuses"] == {"cancelled": 1}
            assert _status(client, "hop-1~1") == "cancelled"
    finally:
        worker.stop()


def _status(client: runstream.Client, run_id: str) -> str | None:
    try:
        return client.get_run(run_id).status
    except runstream.RunNotFound:
        return None
