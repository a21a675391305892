"""The App of `test_queries.py`'s engine processes (``tests.kafka.query_app:app``): runs
that set events and answer live queries. The namespace comes from RUNSTREAM_TEST_NS;
step bodies append a line to RUNSTREAM_TEST_STEP_LOG, so a test counts them exactly."""

from __future__ import annotations

import os
from pathlib import Path

import runstream
from runstream import TerminalStepError


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _lines() -> list[str]:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    return Path(path).read_text().splitlines() if path and Path(path).exists() else []


def make_app(ns: str, bootstrap: str | None = None) -> runstream.App:
    app = runstream.App(ns, bootstrap)

    @app.step
    def pack(run: str, item: str) -> str:
        _log(f"pack {run} {item}")
        return item

    @app.workflow
    async def tracker(ctx: runstream.Context, items: list[str]) -> dict:
        packed: list[str] = []

        @ctx.query_handler("packed")
        def _packed() -> list[str]:
            return packed

        @ctx.query_handler("has")
        def _has(item: str) -> bool:
            return item in packed

        ctx.set_event("stage", "packing")
        for item in items:
            packed.append(await ctx.step(pack, ctx.run_id, item))
        ctx.set_event("stage", "packed")
        await ctx.wait_for_signal("ship")
        ctx.set_event("stage", "shipped")
        return {"packed": packed}

    @app.step
    def fails_once(run: str) -> str:
        _log(f"fails_once {run}")
        if sum(line == f"fails_once {run}" for line in _lines()) == 1:
            raise TerminalStepError("the first attempt fails")
        return "ok"

    @app.workflow
    async def flaky(ctx: runstream.Context) -> str:
        ctx.set_event("before", 1)
        await ctx.step(fails_once, ctx.run_id)
        ctx.set_event("after", 2)
        return "done"

    @app.workflow
    async def rounds(ctx: runstream.Context, n: int) -> int:
        ctx.set_event("round", n)
        if n == 0:
            ctx.set_event("first", True)  # only the first incarnation sets it
        if n < 2:
            ctx.continue_as_new(n + 1)
        await ctx.wait_for_signal("end")
        ctx.set_event("last", n)
        return n

    @app.workflow
    async def silent(ctx: runstream.Context) -> str:
        await ctx.wait_for_signal("end")
        return "nothing set"

    return app


app = make_app(os.environ.get("RUNSTREAM_TEST_NS", "queries"))
