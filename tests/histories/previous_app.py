"""The workflows of `previous_release.jsonl`: a journal recorded by the release before the
core was split by record family (commit 2ab05eb). Keep this code as it is: the recorded
histories must still fit it."""

from __future__ import annotations

import runstream

app = runstream.App("hist")
app.limit("one-at-a-time", concurrency=1)


@app.step
def add(x: int) -> int:
    return x + 1


@app.step(queue="one-at-a-time")
def slow_add(x: int) -> int:
    return x + 1


@app.step(group="remote", heartbeat=30, timeout=600)
def remote_add(x: int) -> int:
    return x + 1


def undo(x: int) -> None:
    return None


@app.workflow
async def saga(ctx: runstream.Context, x: int) -> dict:
    a = await ctx.step(add, x, compensate=undo)
    await ctx.sleep("10s")
    go = await ctx.wait_for_signal("go", timeout="1h")
    b = await ctx.step(add, a)
    return {"a": a, "b": b, "go": go}


@app.workflow
async def waiter(ctx: runstream.Context, key: str) -> object:
    return await ctx.wait_for_event("paid", key=key, timeout="1h")


@app.workflow
async def kid(ctx: runstream.Context, x: int) -> int:
    await ctx.sleep("5s")
    return await ctx.step(add, x)


@app.workflow
async def parent(ctx: runstream.Context, x: int) -> int:
    return await ctx.child(kid, x) + 100


@app.workflow
async def limited(ctx: runstream.Context, x: int) -> int:
    return await ctx.step(slow_add, x)


@app.workflow
async def remote(ctx: runstream.Context, x: int) -> int:
    return await ctx.step(remote_add, x)


@app.workflow
async def counter(ctx: runstream.Context, n: int) -> int:
    if n < 2:
        await ctx.sleep("1s")
        ctx.continue_as_new(n + 1)
    return n
