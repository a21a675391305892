"""An App with a durable entity, for the entity tests (in-process, or in a worker
subprocess as ``tests.kafka.entity_app:app``; the namespace from RUNSTREAM_TEST_NS).
The ``post`` step appends ``post begin|end <key> <call> <time_ns> <pid>`` to
RUNSTREAM_TEST_STEP_LOG and, while the file RUNSTREAM_TEST_GATE names is missing, waits
for it (up to a minute); then it sleeps RUNSTREAM_TEST_STEP_SECONDS (default 0).
The shared handler ``balance_once`` appends ``read <key>`` and, while the file
RUNSTREAM_TEST_KILL_ONCE names is missing, creates it and SIGKILLs its own process."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import runstream


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    if path:
        with open(path, "a") as f:  # one short write per line: appends do not interleave
            f.write(f"{line} {time.time_ns()} {os.getpid()}\n")


def make_app(ns: str, bootstrap: str | None = None, **kw: Any) -> runstream.App:
    app = runstream.App(ns, bootstrap, **kw)

    @app.step
    def post(key: str, call: str, amount: int) -> int:
        _log(f"post begin {key} {call}")
        gate = os.environ.get("RUNSTREAM_TEST_GATE")
        until = time.monotonic() + 60
        while gate and not Path(gate).exists() and time.monotonic() < until:
            time.sleep(0.05)
        time.sleep(float(os.environ.get("RUNSTREAM_TEST_STEP_SECONDS", "0")))
        _log(f"post end {key} {call}")
        return amount

    @app.entity("ledger")
    class Ledger:
        async def deposit(ctx: runstream.EntityContext, arg: dict) -> int:
            amount = await ctx.step(post, ctx.key, arg["call"], arg["amount"])
            balance = int(ctx.state.get("balance", 0)) + amount
            ctx.state.set("balance", balance)
            ctx.state.set("calls", [*ctx.state.get("calls", []), arg["call"]])
            return balance

        async def overdraw(ctx: runstream.EntityContext, arg: dict) -> None:
            ctx.state.set("balance", -1_000_000)
            raise ValueError(f"no overdraft for {ctx.key}")

        async def via_payer(ctx: runstream.EntityContext, arg: dict) -> int:
            """Deposits to ``arg["key"]`` through a child workflow (a cycle: its own)."""
            return int(await ctx.child("payer", arg))

        @runstream.shared
        def balance(ctx: runstream.SharedContext, _: None) -> int:
            return int(ctx.state.get("balance", 0))

        @runstream.shared
        def tenant(ctx: runstream.SharedContext, _: None) -> str | None:
            return ctx.headers.get("tenant")

        @runstream.shared
        def balance_once(ctx: runstream.SharedContext, _: None) -> int:
            _log(f"read {ctx.key}")
            marker = os.environ.get("RUNSTREAM_TEST_KILL_ONCE")
            if marker and not Path(marker).exists():
                Path(marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return int(ctx.state.get("balance", 0))

    @app.workflow
    async def payer(ctx: runstream.Context, job: dict) -> int:
        return int(await ctx.entity("ledger", job["key"]).call("deposit", job))

    @app.workflow
    async def peeker(ctx: runstream.Context, key: str) -> int:
        return int(await ctx.entity("ledger", key).read("balance"))

    @app.workflow
    async def asks_tenant(ctx: runstream.Context, key: str) -> str | None:
        return await ctx.entity("ledger", key).read("tenant")  # with the run's headers

    @app.workflow
    async def auditor(ctx: runstream.Context, key: str) -> int:
        seen = int(await ctx.entity("ledger", key).read("balance_once"))
        return int(await ctx.step(post, key, "audit", seen))

    return app


app = make_app(os.environ.get("RUNSTREAM_TEST_NS", "entities-test"))
