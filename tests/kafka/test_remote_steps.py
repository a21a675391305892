"""Remote steps end to end on the real broker: an engine instance and a task worker,
each on a thread of the test, and workflows that mix local and remote steps."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from pydantic import BaseModel

import runstream
from runstream.engine.steps import StepContext
from runstream.settings import Settings
from runstream.taskworker import TaskWorker
from runstream.topics.spec import Topics

from .kit import ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka

GROUP = "payments"


class Order(BaseModel):
    id: str
    amount: int


class Receipt(BaseModel):
    order: str
    paid: int
    by: str


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def test_a_workflow_with_a_local_and_a_remote_step_completes_with_the_remote_output(
    kafka_bootstrap, ns, tmp_path
):
    app = runstream.App(ns, kafka_bootstrap)
    ran: Counter[str] = Counter()  # step bodies, wherever they ran
    lock = threading.Lock()

    @app.step
    def price(order_id: str) -> Order:
        with lock:
            ran["price"] += 1
        return Order(id=order_id, amount=len(order_id) * 10)

    @app.step(group=GROUP, name="charge", timeout="30s", heartbeat="10s")
    def charge(order: Order, step: StepContext) -> Receipt:
        assert isinstance(order, Order)  # rebuilt from JSON by the worker
        step.heartbeat({"charging": order.id})
        with lock:
            ran["charge"] += 1
        return Receipt(order=order.id, paid=order.amount, by="card")

    @app.workflow
    async def checkout(ctx: runstream.Context, order_id: str) -> dict:
        order = await ctx.step(price, order_id)
        receipt = await ctx.step(charge, order)
        assert isinstance(receipt, Receipt)  # the remote output, rebuilt on replay too
        return {"receipt": receipt.model_dump(), "local": order.amount}

    engine = ThreadWorker(app, tmp_path / "state")
    worker = TaskWorker(app, GROUP, concurrency=4, settings=Settings(session_timeout_ms=6000))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engine's topics")
        with client:
            run_ids = [client.start(checkout, f"o-{i}", run_id=f"o-{i}") for i in range(10)]
            for i, run_id in enumerate(run_ids):
                amount = len(f"o-{i}") * 10
                assert client.result(run_id, timeout=90) == {
                    "receipt": {"order": f"o-{i}", "paid": amount, "by": "card"},
                    "local": amount,
                }
    finally:
        worker.stop()
        thread.join(60)
        engine.stop()
    assert not thread.is_alive()
    # each body ran once, and the task worker ran every remote one
    assert ran == {"price": 10, "charge": 10}
    assert worker.stats["results"] == 10 and worker.stats["heartbeats"] == 10

    journal = read_topic(kafka_bootstrap, Topics(ns).journal)
    started = [r for n, r, _ in journal if n == "StepStarted" and r["name"] == "charge"]
    completed = Counter((r["run_id"], r["seq"]) for n, r, _ in journal if n == "StepCompleted")
    assert len(started) == 10 and all(r["attempt_id"] for r in started)
    assert len(completed) == 20 and set(completed.values()) == {1}
