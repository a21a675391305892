"""A shopping cart that takes validated updates (see test_cart_flow.py beside it).

``add`` is an update: its validator refuses a bad quantity before anything is recorded,
its handler reserves the item (a durable step) and returns the cart's size. The cart
is checked out by the ``checkout`` signal, or closes by itself after a day.
"""

from __future__ import annotations

import runstream

app = runstream.App("carts")


@app.step
def reserve(sku: str, qty: int) -> str:
    return f"rsv-{sku}-{qty}"  # a real one would call the stock service


@app.workflow
async def cart(ctx: runstream.Context, customer: str) -> dict:
    items: list[dict] = []

    def valid(item: dict) -> None:
        if item["qty"] < 1:
            raise ValueError(f"quantity must be at least 1, not {item['qty']}")

    async def add(item: dict) -> dict:
        items.append(item)  # before the first await: the workflow sees it at once
        reservation = await ctx.step(reserve, item["sku"], item["qty"])
        return {"items": len(items), "reservation": reservation}

    ctx.update_handler("add", add, validator=valid)
    try:
        await ctx.wait_for_signal("checkout", timeout="1d")
    except runstream.SignalTimeout:
        return {"customer": customer, "status": "abandoned", "items": items}
    return {"customer": customer, "status": "ordered", "items": items}
