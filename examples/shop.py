"""An order workflow: steps with retries, a remote step, a durable sleep, a signal,
compensations.

Run an engine for it with `runstream worker examples.shop:app`, and a task worker for
its remote step with `runstream tasks serve examples.shop:app --group payments`;
`examples/demo.py` does everything (broker, engine, task worker, runs) in one go.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

import runstream

app = runstream.App(os.environ.get("RUNSTREAM_DEMO_NS", "shop"))


class Order(BaseModel):
    id: str
    item: str
    amount: float


_timed_out_once: set[str] = set()  # the orders whose first reservation timed out


@app.step(retries=3, backoff=0.2)
def reserve_stock(order: Order) -> str:
    # A flaky inventory service: the first call for each order times out; the engine
    # retries it after its backoff and the second call succeeds.
    if order.id not in _timed_out_once:
        _timed_out_once.add(order.id)
        raise ConnectionError("inventory service timed out")
    return f"rsv-{order.id}"


@app.step
def release_stock(order: Order) -> None:
    pass


# A remote step: served by the task workers of group "payments", not by the engine.
@app.step(group="payments", retries=2, non_retryable=(ValueError,), timeout="30s")
def charge_card(order: Order) -> str:
    if order.amount > 1000:
        raise ValueError(f"card declined: {order.amount} is over the limit")
    return f"pay-{order.id}"


@app.step
def refund_card(order: Order) -> None:
    pass


@app.step
def ship(order: Order, approved_by: str) -> str:
    return f"track-{order.id}-{approved_by}"


@app.workflow(version="1")
async def checkout(ctx: runstream.Context, order: Order) -> dict:
    reservation = await ctx.step(reserve_stock, order, compensate=release_stock)
    payment = await ctx.step(charge_card, order, compensate=refund_card)
    await ctx.sleep("2s")  # a cooling-off period; survives crashes and restarts
    approval = await ctx.wait_for_signal("approve", timeout="1h")
    tracking = await ctx.step(ship, order, approval["by"])
    return {"reservation": reservation, "payment": payment, "tracking": tracking}
