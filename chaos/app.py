"""The chaos workload: an engine process imports it as ``chaos.app:app`` (the namespace in
RUNSTREAM_CHAOS_NS), a task worker serves its group ``remote``.

Every step body appends ``<step> <run> <execution> start|end <time>`` to the file in
RUNSTREAM_CHAOS_STEP_LOG and returns its execution id ``<pid>-<nonce>`` beside its value,
so the checks can tell which of a body's executions the journal recorded.
"""

from __future__ import annotations

import os
import time
import uuid

import runstream

app = runstream.App(os.environ.get("RUNSTREAM_CHAOS_NS", "chaos"))
app.limit("gate", concurrency=2)
GATE = 2  # at most this many `gated` bodies at once, across every instance


def _body(step: str, run_id: str, value: int, seconds: float = 0.0) -> dict:
    execution = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _log(f"{step} {run_id} {execution} start {time.time():.6f}")
    if seconds:
        time.sleep(seconds)
    _log(f"{step} {run_id} {execution} end {time.time():.6f}")
    return {"v": value, "x": execution}


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_CHAOS_STEP_LOG")
    if path:
        with open(path, "a") as f:  # O_APPEND: one short write per line
            f.write(line + "\n")


@app.step(retries=10, backoff=0.2)
def add_one(run_id: str, x: int) -> dict:
    return _body("add_one", run_id, x + 1)


@app.step(group="remote", timeout=8, retries=20, backoff=0.2)
def double(run_id: str, x: int) -> dict:
    return _body("double", run_id, 2 * x, 0.05)


@app.step(queue="gate", retries=10, backoff=0.2)
def gated(run_id: str, x: int) -> dict:
    return _body("gated", run_id, x + 1, 0.1)


@app.step(retries=10, backoff=0.2)
def times_ten(run_id: str, x: int) -> dict:
    return _body("times_ten", run_id, 10 * x)


@app.workflow
async def kid(ctx: runstream.Context, x: int) -> int:
    return (await ctx.step(times_ten, ctx.run_id, x))["v"]


@app.workflow
async def order(ctx: runstream.Context, i: int) -> dict:
    a = (await ctx.step(add_one, ctx.run_id, i))["v"]
    b = (await ctx.step(double, ctx.run_id, a))["v"]
    await ctx.sleep(1)
    c = (await ctx.step(gated, ctx.run_id, b))["v"]
    k = await ctx.child(kid, c)
    go = await ctx.wait_for_signal("go")
    paid = await ctx.wait_for_event("paid", key=ctx.run_id)
    return {"i": i, "a": a, "b": b, "c": c, "kid": k, "go": go, "paid": paid}


def expected(i: int) -> dict:
    """The output of ``order(i)``."""
    a = i + 1
    b = 2 * a
    c = b + 1
    return {"i": i, "a": a, "b": b, "c": c, "kid": 10 * c, "go": i, "paid": {"i": i}}
