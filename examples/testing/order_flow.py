"""An order workflow to test with `runstream.testing` (see test_order_flow.py beside it).

Stock is reserved and the card charged (each undone if the order fails), a person
approves within two days, the parcel ships, and after the 30-day return window the
order is closed. A refund waits for a manager's answer: a durable promise whose id is
mailed to them.
"""

from __future__ import annotations

from pydantic import BaseModel

import runstream

app = runstream.App("orders")


class Order(BaseModel):
    id: str
    amount: float


@app.step
def reserve_stock(order: Order) -> str:
    return f"rsv-{order.id}"


@app.step
def release_stock(order: Order) -> None:
    pass


@app.step(retries=3, backoff=2.0)  # waits 2 s, 4 s, 8 s between attempts
def charge_card(order: Order) -> str:
    return f"pay-{order.id}"  # a real one would call the payment provider


@app.step
def refund_card(order: Order) -> None:
    pass


@app.step
def ship(order: Order, approved_by: str) -> str:
    return f"track-{order.id}"


@app.step
def close_order(order: Order) -> None:
    pass


@app.workflow
async def order_flow(ctx: runstream.Context, order: Order) -> dict:
    await ctx.step(reserve_stock, order, compensate=release_stock)
    payment = await ctx.step(charge_card, order, compensate=refund_card)
    approval = await ctx.wait_for_signal("approve", timeout="2d")
    tracking = await ctx.step(ship, order, approval["by"])
    await ctx.sleep("30d")  # the return window
    await ctx.step(close_order, order)
    return {"payment": payment, "tracking": tracking, "approved_by": approval["by"]}


@app.step
def ask_manager(order: Order, promise_id: str) -> None:
    pass  # a real one would mail a link that resolves (or rejects) the promise


@app.workflow
async def refund(ctx: runstream.Context, order: Order) -> str:
    answer = ctx.promise(timeout="7d")  # its id is recorded before the mail goes out
    await ctx.step(ask_manager, order, answer.id)
    try:
        note = await answer
    except runstream.PromiseRejected as exc:
        return f"refused: {exc.message}"
    except runstream.PromiseTimeout:
        return "refused: no answer within a week"
    await ctx.step(refund_card, order)
    return f"refunded: {note}"
