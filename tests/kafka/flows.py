"""Workflows the engine tests run, in-process or in worker subprocesses.

A subprocess imports this module as ``tests.kafka.flows:app``; the namespace comes
from RUNSTREAM_TEST_NS. Step bodies append a line to RUNSTREAM_TEST_STEP_LOG (if set)
so tests can count executions across processes and crashes exactly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

from pydantic import BaseModel

import runstream
from runstream import TerminalStepError
from runstream.errors import EventTimeout


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    if path:
        with open(path, "a") as f:  # O_APPEND: one short write per line, atomic enough
            f.write(line + "\n")


class Order(BaseModel):
    id: int
    amount: float


def make_app(ns: str, bootstrap: str | None = None, **kw) -> runstream.App:
    app = runstream.App(ns, bootstrap, **kw)

    @app.step
    def add_one(x: int) -> int:
        _log(f"add_one {x}")
        return x + 1

    @app.workflow
    async def three_steps(ctx: runstream.Context, x: int) -> int:
        for _ in range(3):
            x = await ctx.step(add_one, x)
        return x

    @app.step
    def tick(run: str, n: int) -> str:
        """Names its execution (process, nonce) in the step log and as its output, so a
        test can tell the execution the journal recorded from any other."""
        execution = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        _log(f"{run} {n} {execution}")
        return execution

    @app.workflow
    async def sleepy(ctx: runstream.Context, seconds: float) -> str:
        await ctx.step(tick, ctx.run_id, 1)
        await ctx.sleep(seconds)
        await ctx.step(tick, ctx.run_id, 2)
        await ctx.step(tick, ctx.run_id, 3)
        return "rested"

    @app.workflow
    async def approval(ctx: runstream.Context, timeout: float | None = None) -> dict:
        try:
            got = await ctx.wait_for_signal("approve", timeout=timeout)
        except runstream.SignalTimeout:
            return {"approved": False}
        return {"approved": True, "by": got}

    @app.step
    def mail(run: str, promise_id: str) -> str:
        _log(f"mail {run} {promise_id}")  # a real one would send the id to a person
        return promise_id

    @app.workflow
    async def awaits_promise(ctx: runstream.Context, gate: bool | None = None) -> dict:
        p = ctx.promise()
        await ctx.step(mail, ctx.run_id, p.id)
        if gate:  # a completion that comes before the await is kept for it
            await ctx.wait_for_signal("go")
        try:
            return {"value": await p}
        except runstream.PromiseRejected as exc:
            return {"rejected": exc.message}

    @app.step
    def reserve(order: Order) -> str:
        _log(f"reserve {order.id}")
        return f"r-{order.id}"

    @app.step
    def release(order: Order) -> None:
        _log(f"release {order.id}")

    @app.step
    def charge(order: Order) -> float:
        _log(f"charge {order.id}")
        if order.amount < 0:
            raise TerminalStepError("negative amount")
        return order.amount

    @app.step
    def refund(order: Order) -> None:
        _log(f"refund {order.id}")

    @app.workflow
    async def checkout(ctx: runstream.Context, order: Order) -> dict:
        reservation = await ctx.step(reserve, order, compensate=release)
        paid = await ctx.step(charge, order, compensate=refund)
        approved = await ctx.wait_for_signal("approve")
        return {"reservation": reservation, "paid": paid, "approved_by": approved}

    @app.workflow
    async def countdown(ctx: runstream.Context, n: int) -> str:
        if n > 0:
            ctx.continue_as_new(n - 1)
        return f"done at {ctx.run_id}"

    @app.step
    def crash() -> None:
        _log("crash")
        os.kill(os.getpid(), signal.SIGKILL)  # a poison step that takes its process down

    @app.workflow
    async def poison(ctx: runstream.Context) -> None:
        await ctx.step(crash)

    @app.step
    def work(run: str, seconds: float) -> str:
        time.sleep(seconds)
        _log(f"work {run}")
        return run

    @app.workflow
    async def steady(ctx: runstream.Context, seconds: float) -> str:
        return await ctx.step(work, ctx.run_id, seconds)

    @app.step
    def shift(run: str, n: int, seconds: float) -> int:
        """Logs as its body begins, so a body cut short still counts."""
        _log(f"{run} {n} {os.getpid()}")
        time.sleep(seconds)
        return n

    @app.workflow
    async def shifts(ctx: runstream.Context, seconds: float) -> int:
        """Three steps of ``seconds`` each (seq 1, 2 and 3)."""
        return sum([await ctx.step(shift, ctx.run_id, n, seconds) for n in (1, 2, 3)])

    @app.workflow
    async def nap_then_approval(ctx: runstream.Context, seconds: float) -> dict:
        await ctx.sleep(seconds)
        return {"approved_by": await ctx.wait_for_signal("approve")}

    @app.workflow
    async def spin(ctx: runstream.Context) -> None:
        while True:  # workflow code that never yields: the time budget stops it
            pass

    @app.workflow
    async def block(ctx: runstream.Context) -> None:
        time.sleep(3600)  # a call no exception can interrupt: the instance restarts

    @app.step
    def big(n: int) -> str:
        return "x" * n

    @app.workflow
    async def big_output(ctx: runstream.Context, n: int) -> str:
        try:
            return await ctx.step(big, n)
        except runstream.StepError as exc:
            return f"step failed: {exc.error}"

    @app.workflow
    async def kid(ctx: runstream.Context, n: int) -> str:
        return await ctx.step(tick, ctx.run_id, n)

    @app.workflow
    async def parent(ctx: runstream.Context, n: int) -> list[str]:
        """``n`` child runs, one after the other: the executions of their ticks."""
        return [await ctx.child(kid, i) for i in range(n)]

    @app.workflow
    async def listener(ctx: runstream.Context, key: str) -> list[int]:
        """The next ten events "tick" of correlation ``key``: their numbers."""
        return [(await ctx.wait_for_event("tick", key=key))["n"] for _ in range(10)]

    @app.workflow
    async def quotes_input(ctx: runstream.Context, text: str) -> None:
        raise ValueError(f"cannot take {text}")

    @app.workflow
    async def waits_named(ctx: runstream.Context, name: str) -> None:
        await ctx.wait_for_signal(name)

    @app.workflow
    async def poller(ctx: runstream.Context, job: dict) -> list[int]:
        """``job["events"]`` events "tick" of ``job["key"]``, each awaited in slices of
        ``job["slice"]`` seconds, as a polling loop does: their numbers."""
        got: list[int] = []
        while len(got) < job["events"]:
            with contextlib.suppress(EventTimeout):
                event = await ctx.wait_for_event("tick", key=job["key"], timeout=job["slice"])
                got.append(event["n"])
        return got

    @app.workflow(on_event="order.placed", key=lambda ev: ev["order"])
    async def placed(ctx: runstream.Context, ev: dict) -> str:
        return await ctx.step(tick, ctx.run_id, 1)

    return app


app = make_app(
    os.environ.get("RUNSTREAM_TEST_NS", "flows"),
    max_recovery_attempts=int(os.environ.get("RUNSTREAM_TEST_MAX_RECOVERY", "3")),
)
