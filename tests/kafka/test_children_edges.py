"""Children at the edges, against the broker: a child refused on its own partition
answers its parent (issue 19, defect 4); a cancel follows continue-as-new (defect 5)."""

from __future__ import annotations

import pytest

import runstream
from runstream.audit.reader import audit
from runstream.errors import ChildFailed
from runstream.topics.admin import ensure_topics

from .kit import PARTITIONS, ThreadWorker, read_topic

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
