"""`WorkflowTester` with validated updates: the example file passes, a handler that
sleeps completes on the fake clock, a run that ends fails the update in flight, and a
duplicate update id gets the same answer."""

from __future__ import annotations

import pytest

import runstream
from examples.testing import test_cart_flow as example
from runstream.testing import RunNotFinished, WorkflowTester

app = runstream.App("tester-updates")
calls: list[int] = []


@app.step
def note(n: int) -> int:
    calls.append(n)
    return n


@app.workflow
async def counter(ctx: runstream.Context, start: int) -> int:
    total = start

    async def bump(n: int) -> int:
        nonlocal total
        await ctx.sleep(n)
        total += await ctx.step(note, n)
        return total

    ctx.update_handler("bump", bump, validator=lambda n: None if n > 0 else 1 / 0)
    await ctx.wait_for_signal("stop")
    return total


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


@pytest.mark.parametrize("name", sorted(n for n in vars(example) if n.startswith("test_")))
def test_the_example_test_file_passes(name):
    getattr(example, name)()


def test_a_handler_that_sleeps_completes_as_the_clock_moves():
    t = WorkflowTester(app)
    t.start("counter", 10, run_id="c")
    u = t.start_update("c", "bump", 60, update_id="b1")
    assert u.stage == "accepted"
    with pytest.raises(RunNotFinished):
        u.result()
    t.advance("1m")
    assert u.result() == 70 and u.stage == "completed"
    assert t.update("c", "bump", 60, update_id="b1") == 70 and calls == [60]  # a duplicate
    t.signal("c", "stop")
    assert t.run("c").result() == 70


def test_a_validator_error_rejects_and_an_end_fails_the_update_in_flight():
    t = WorkflowTester(app)
    t.start("counter", 0, run_id="c")
    with pytest.raises(runstream.UpdateFailed) as exc:
        t.update("c", "bump", -1)
    assert exc.value.code == "rejected" and "ZeroDivisionError" in exc.value.message
    u = t.start_update("c", "bump", 5)
    t.cancel("c")
    with pytest.raises(runstream.UpdateFailed) as exc:
        u.result()
    assert exc.value.code == "run-ended" and not exc.value.rejected


deco = runstream.App("tester-deco")


@deco.workflow
async def named(ctx: runstream.Context) -> list[str]:
    names: list[str] = []

    @ctx.update_handler("add", validator=lambda name: None if name else 1 / 0)
    def add(name: str) -> int:  # a plain function: it completes as it is accepted
        names.append(name)
        return len(names)

    await ctx.wait_for_signal("done")
    return names


def test_a_handler_registered_as_a_decorator_may_be_a_plain_function():
    t = WorkflowTester(deco)
    run = t.start("named", run_id="n")
    assert [t.update("n", "add", who) for who in ("ann", "bob")] == [1, 2]
    with pytest.raises(runstream.UpdateFailed):
        t.update("n", "add", "")
    t.signal("n", "done")
    assert run.result() == ["ann", "bob"]
