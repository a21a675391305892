"""The workflows the benchmarks run, imported by engine processes as ``benchmarks.flows:app``.

The namespace comes from RUNSTREAM_BENCH_NS (a fresh one per repeat), the bootstrap from
RUNSTREAM_BOOTSTRAP_SERVERS. Steps of ``nap`` append a line to RUNSTREAM_BENCH_STEP_LOG (if
set) so W4 can count step executions across a SIGKILL.
"""

from __future__ import annotations

import os

import runstream

app = runstream.App(os.environ.get("RUNSTREAM_BENCH_NS", "bench"))


@app.step
def add_one(x: int) -> int:
    return x + 1


@app.workflow
async def w1(ctx: runstream.Context, x: int) -> int:
    """W1/W2/W5/W6: three sequential local steps, each adds one."""
    x = await ctx.step(add_one, x)
    x = await ctx.step(add_one, x)
    return await ctx.step(add_one, x)


@app.workflow
async def long(ctx: runstream.Context, n: int) -> int:
    """W9: ``n`` sequential local steps, each adds one."""
    x = 0
    for _ in range(n):
        x = await ctx.step(add_one, x)
    return x


@app.workflow
async def wait_signal(ctx: runstream.Context) -> object:
    """W3: wait for signal "go", then complete with its payload."""
    return await ctx.wait_for_signal("go")


@app.workflow
async def wait_promise(ctx: runstream.Context) -> object:
    """W3b: create a durable promise, then complete with its value."""
    return await ctx.promise()


@app.workflow
async def counter(ctx: runstream.Context) -> int:
    """W10: waits for "stop" and takes updates "add" meanwhile: each adds its argument
    and returns the total (a handler without awaits: it completes as it is accepted)."""
    total = 0

    def add(n: int) -> int:
        nonlocal total
        total += n
        return total

    ctx.update_handler("add", add)
    await ctx.wait_for_signal("stop")
    return total


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_BENCH_STEP_LOG")
    if path:
        with open(path, "a") as f:  # O_APPEND: one short line per write
            f.write(line + "\n")


@app.step
def note(run_id: str, n: int) -> int:
    _log(f"{run_id} {n}")
    return n


@app.workflow
async def nap(ctx: runstream.Context, seconds: float) -> str:
    """W4: a step, a durable sleep, a step."""
    await ctx.step(note, ctx.run_id, 1)
    await ctx.sleep(seconds)
    await ctx.step(note, ctx.run_id, 2)
    return "rested"


@app.workflow
async def sleeper(ctx: runstream.Context, seconds: float) -> str:
    """W7: one durable timer, then complete."""
    await ctx.sleep(seconds)
    return "woke"


# -- W8: the W1 workflow with its three steps served by a separate task-worker process
# (`runstream tasks serve benchmarks.flows:remote_app --group bench`). Its own App, so the
# engines of the other workloads declare no task group; the workflow keeps the name "w1",
# so the W1/W2 measurements (and the harness's warm-up runs) apply to it unchanged.

REMOTE_GROUP = "bench"
remote_app = runstream.App(os.environ.get("RUNSTREAM_BENCH_NS", "bench"))


@remote_app.step(group=REMOTE_GROUP, name="add_one")
def add_one_remote(x: int) -> int:
    return x + 1


@remote_app.workflow(name="w1")
async def w1_remote(ctx: runstream.Context, x: int) -> int:
    """W8: three sequential remote steps, each adds one."""
    x = await ctx.step(add_one_remote, x)
    x = await ctx.step(add_one_remote, x)
    return await ctx.step(add_one_remote, x)
