"""Pause and unpause in `WorkflowTester`: the example of docs/guides/pause.md."""

from __future__ import annotations

import runstream
from runstream.testing import WorkflowTester

app = runstream.App("pausing")
attempts: list[int] = []


@app.step(retries=2, backoff=60.0)
def ship(order: str) -> str:
    attempts.append(len(attempts) + 1)
    if len(attempts) == 1:
        raise RuntimeError("carrier down")
    return f"shipped {order}"


@app.workflow
async def fulfil(ctx: runstream.Context, order: str) -> str:
    ok = await ctx.wait_for_signal("approve")
    await ctx.sleep("1h")
    return await ctx.step(ship, f"{order}/{ok}")


def test_a_paused_run_in_the_tester_waits_and_goes_on_once_unpaused():
    attempts.clear()
    t = WorkflowTester(app)
    run = t.start(fulfil, "o-1", run_id="o-1")
    t.pause("o-1", reason="carrier incident")
    assert run.status == "paused"
    t.signal("o-1", "approve", "yes")  # recorded, seen by the code on unpause
    t.run_until_idle()  # nothing to do: no code runs while paused
    assert run.status == "paused" and attempts == []
    t.unpause("o-1")
    t.advance("1h")  # its sleep; the step fails once and waits 60s for its retry
    assert attempts == [1]
    t.pause("o-1")
    t.run_until_idle()  # the retry falls due while paused: held back, no endless timer
    assert attempts == [1] and run.status == "paused"
    t.unpause("o-1")
    assert run.result() == "shipped o-1/yes" and attempts == [1, 2]
    kinds = [type(f).__name__ for f in run.history]
    assert kinds.count("RunPaused") == kinds.count("RunUnpaused") == 2
