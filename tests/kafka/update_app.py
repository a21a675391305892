"""An App with update handlers, for the update tests (in-process, or in a worker
subprocess as ``tests.kafka.update_app:app``; the namespace from RUNSTREAM_TEST_NS).
The ``pay`` step appends ``pay begin|end <amount> <pid>`` to RUNSTREAM_TEST_STEP_LOG and,
while the file RUNSTREAM_TEST_GATE names is missing, waits for it (up to a minute)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import runstream


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    if path:
        with open(path, "a") as f:  # one short write per line: appends do not interleave
            f.write(f"{line} {os.getpid()}\n")


def make_app(ns: str, bootstrap: str | None = None, **kw: Any) -> runstream.App:
    app = runstream.App(ns, bootstrap, **kw)

    @app.step
    def pay(amount: int) -> str:
        _log(f"pay begin {amount}")
        gate = os.environ.get("RUNSTREAM_TEST_GATE")
        until = time.monotonic() + 60
        while gate and not Path(gate).exists() and time.monotonic() < until:
            time.sleep(0.05)
        _log(f"pay end {amount}")
        return f"receipt-{amount}"

    @app.workflow
    async def account(ctx: runstream.Context, start: int) -> int:
        balance = start

        def enough(amount: int) -> None:
            if amount > balance:
                raise ValueError(f"insufficient funds: {balance}")

        async def withdraw(amount: int) -> dict:
            nonlocal balance
            balance -= amount
            receipt = await ctx.step(pay, amount)
            return {"balance": balance, "receipt": receipt}

        ctx.update_handler("withdraw", withdraw, validator=enough)
        await ctx.wait_for_signal("close")
        return balance

    return app


app = make_app(os.environ.get("RUNSTREAM_TEST_NS", "updates-test"))
