"""An App fed by two topics of a team's own, for source forwarder tests (in-process,
or ``runstream sources serve tests.kafka.source_app:app`` and ``runstream worker
tests.kafka.source_app:app`` in processes). The namespace comes from RUNSTREAM_TEST_NS;
the team's topics are ``<ns>-orders`` and ``<ns>-shipments``, JSON values with an
``order`` field."""

from __future__ import annotations

import os

import runstream


def make_app(ns: str, bootstrap: str | None = None) -> runstream.App:
    app = runstream.App(ns, bootstrap)
    app.source(f"{ns}-orders", name="order.placed", key=lambda order: order["order"])
    # A shipment may come before its run waits for it: kept 10 minutes for that wait.
    app.source(f"{ns}-shipments", name="order.shipped", key=lambda s: s["order"], ttl="10m")

    @app.workflow(on_event="order.placed", key=lambda order: order["order"])
    async def fulfil(ctx: runstream.Context, order: dict) -> dict:
        shipped = await ctx.wait_for_event("order.shipped", key=order["order"], timeout="10m")
        return {"order": order["order"], "carrier": shipped["carrier"]}

    @app.workflow
    async def paid(ctx: runstream.Context, order: str) -> dict:
        return await ctx.wait_for_event("payment.settled", key=order, timeout="10m")

    return app


app = make_app(os.environ.get("RUNSTREAM_TEST_NS", "source-test"))
