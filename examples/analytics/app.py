"""A small App whose runs give the analytics example something to count: orders that
complete, a step that fails once and is retried, and orders whose payment is refused
(the step fails for good, and so does the run).

    RUNSTREAM_LIFECYCLE_FORMAT=json runstream worker examples.analytics.app:app
"""

from __future__ import annotations

import os

import runstream


def make_app(namespace: str, bootstrap: str | None = None) -> runstream.App:
    app = runstream.App(namespace, bootstrap)
    failed_once: set[int] = set()  # the orders whose first reservation failed (this process)

    @app.step(name="reserve", retries=2, backoff=0.05)
    def reserve(order: int) -> str:
        if order % 3 == 0 and order not in failed_once:
            failed_once.add(order)
            raise ConnectionError("stock service unavailable")  # retried: the next try works
        return f"r-{order}"

    @app.step(name="charge", retries=0)
    def charge(order: int) -> str:
        if order % 4 == 0:
            raise runstream.TerminalStepError(f"card declined for order {order}")
        return f"c-{order}"

    @app.step(name="ship")
    def ship(order: int) -> str:
        return f"s-{order}"

    @app.workflow
    async def checkout(ctx: runstream.Context, order: int) -> str:
        await ctx.step(reserve, order)
        await ctx.step(charge, order)
        return await ctx.step(ship, order)

    @app.workflow
    async def refund(ctx: runstream.Context, order: int) -> str:
        return await ctx.step(ship, -order)

    return app


app = make_app(os.environ.get("RUNSTREAM_ANALYTICS_NS", "analytics"))
