"""An App with remote steps, for tests that run task workers in their own processes
(``runstream tasks serve tests.kafka.remote_app:app --group work``). The namespace comes
from RUNSTREAM_TEST_NS; each body appends ``begin|end <run> <seq> <attempt> <pid>`` to
RUNSTREAM_TEST_STEP_LOG."""

from __future__ import annotations

import os
import time

import runstream

app = runstream.App(os.environ.get("RUNSTREAM_TEST_NS", "remote-test"))


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    if path:
        with open(path, "a") as f:  # one short write per line: appends do not interleave
            f.write(f"{line} {os.getpid()}\n")


@app.step(group="work", timeout="60s")
def crunch(n: int, step: runstream.StepContext) -> int:
    where = f"{step.run_id} {step.seq} {step.attempt_id}"
    _log(f"begin {where}")
    time.sleep(0.05)
    _log(f"end {where}")
    return n * 2


@app.step(group="work", timeout="60s", heartbeat="2s", retries=2, backoff=0.1)
def patient(seconds: float, beat: bool, step: runstream.StepContext) -> str:
    """Works ``seconds``; with ``beat`` it says so every half second, else it goes silent
    (on its first attempt only: the retry answers at once)."""
    if step.attempt > 1:
        return f"attempt {step.attempt}"
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if beat:
            step.heartbeat({"left": round(until - time.monotonic(), 1)})
        time.sleep(0.5)
    return f"attempt {step.attempt}"


@app.workflow
async def double_twice(ctx: runstream.Context, n: int) -> int:
    return await ctx.step(crunch, await ctx.step(crunch, n))


@app.workflow
async def wait_on(ctx: runstream.Context, job: dict) -> str:
    return await ctx.step(patient, job["seconds"], job["beat"])


@app.step(group="work", timeout="12s", heartbeat="4s", retries=0)
def unserved(n: int) -> int:
    """Left to no task worker by its test: only the engine's liveness check ends it."""
    return n


@app.workflow
async def left_alone(ctx: runstream.Context, n: int) -> int:
    return await ctx.step(unserved, n)
