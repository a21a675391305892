"""The pure core: replay, non-determinism, retries, compensation, timers, signals."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import BaseModel

from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.workflow import Registry, StepPolicy, step_def, workflow_def
from runstream.errors import SignalTimeout, StepError, TerminalStepError

from .corehelp import Core

calls: Counter[str] = Counter()


def add_one(x: int) -> int:
    calls["add_one"] += 1
    return x + 1


def registry(*workflows, steps=()) -> Registry:
    reg = Registry()
    for wf in workflows:
        reg.add_workflow(wf if not callable(wf) else workflow_def(wf))
    for sd in steps:
        reg.add_step(sd)
    return reg


async def three_steps(ctx, x: int) -> int:
    x = await ctx.step(add_one, x)
    x = await ctx.step(add_one, x)
    return await ctx.step(add_one, x)


def test_three_steps_complete_with_one_fact_per_step():
    core = Core(registry(three_steps))
    core.start("r1", "three_steps", 1)
    st = core.state("r1")
    assert st.status == "completed" and payload.loads(st.output) == 4
    assert core.names("r1") == ["RunStarted"] + ["StepStarted", "StepCompleted"] * 3 + [
        "RunCompleted"
    ]
    assert [e["type"] for e in core.lifecycle][-1] == "run.completed"


def test_rebuilt_state_equals_live_state():
    core = Core(registry(three_steps))
    core.start("r1", "three_steps", 1)
    assert fold("r1", core.facts("r1")) == core.state("r1")


def test_start_is_idempotent_by_run_id():
    core = Core(registry(three_steps))
    calls.clear()
    core.start("r1", "three_steps", 1)
    core.start("r1", "three_steps", 100)
    assert calls["add_one"] == 3 and len(core.facts("r1", "RunStarted")) == 1


class Order(BaseModel):
    id: int
    amount: float


async def typed(ctx, order: Order) -> float:
    return order.amount * 2


def test_pydantic_input_is_validated_and_rejected():
    from runstream.errors import InvalidInput

    core = Core(registry(typed))
    core.start("ok", "typed", {"id": 1, "amount": 2.5})
    assert payload.loads(core.state("ok").output) == 5.0
    with pytest.raises(InvalidInput):
        core.start("bad", "typed", {"id": "x"})
    assert not core.state("bad").exists


def test_non_determinism_parks_the_run_and_names_both_steps():
    def other(x: int) -> int:
        return x

    async def v1(ctx, x: int) -> int:
        await ctx.sleep(10)
        return await ctx.step(add_one, x)

    async def v1_changed(ctx, x: int) -> int:
        await ctx.step(other, x)  # seq 1 used to be a sleep
        return x

    reg = registry(workflow_def(v1, name="wf"))
    core = Core(reg)
    core.start("r1", "wf", 1)
    reg.workflows["wf"]["1"] = workflow_def(v1_changed, name="wf")  # a bad deploy
    core.advance(11)
    st = core.state("r1")
    assert st.status == "parked"
    assert "run 'r1' at sequence 1" in st.reason and "'sleep'" in st.reason
    assert "<locals>.other'" in st.reason  # the step the code asks for now
    assert core.lifecycle[-1]["type"] == "run.suspended"


def test_retries_with_backoff_then_success():
    attempts = Counter()

    def flaky(x: int) -> int:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise RuntimeError("boom")
        return x

    async def wf(ctx, x: int) -> int:
        return await ctx.step(flaky, x)

    reg = registry(wf, steps=[step_def(flaky, StepPolicy(retries=3, backoff=2))])
    core = Core(reg)
    core.start("r", "wf", 7)
    failed = core.facts("r", "StepFailed")
    assert len(failed) == 1 and failed[0].rec["retry_at_ms"] == core.now + 2000
    core.advance(2)  # first retry at +2 s fails, schedules the next at +4 s
    assert core.state("r").status == "running"
    core.advance(4)
    assert core.state("r").status == "completed" and attempts["n"] == 3
    assert [f.rec["attempt"] for f in core.facts("r", "StepStarted")] == [1, 2, 3]


def test_exhausted_retries_raise_step_error_inside_the_workflow():
    def broken(x: int) -> int:
        raise ValueError("nope")

    async def wf(ctx, x: int) -> str:
        try:
            await ctx.step(broken, x)
        except StepError as e:
            return f"handled {e.step}"
        return "unreachable"

    core = Core(registry(wf, steps=[step_def(broken, StepPolicy(retries=1, backoff=1))]))
    core.start("r", "wf", 1)
    core.advance(1)
    assert payload.loads(core.state("r").output).endswith(".broken")  # the step qualname
    assert len(core.facts("r", "StepFailed")) == 2


def test_terminal_error_fails_without_retry_and_compensates_in_reverse_order():
    log: list[str] = []

    def reserve(x):
        log.append("reserve")

    def charge(x):
        log.append("charge")

    def ship(x):
        raise TerminalStepError("address unknown")

    def release(x):
        log.append("release")

    def refund(x):
        log.append("refund")

    async def saga(ctx, x: int) -> None:
        await ctx.step(reserve, x, compensate=release)
        await ctx.step(charge, x, compensate=refund)
        await ctx.step(ship, x)

    core = Core(registry(saga))
    core.start("s", "saga", 1)
    st = core.state("s")
    assert st.status == "failed" and "address unknown" in st.error
    assert log == ["reserve", "charge", "refund", "release"]
    comp = [f.rec["seq"] for f in core.facts("s", "StepCompleted") if f.rec["seq"] < 0]
    assert comp == [-1, -2]
    assert len(core.facts("s", "StepFailed")) == 1  # no retry of a terminal error


def test_sleep_is_a_durable_timer():
    async def wf(ctx) -> str:
        await ctx.sleep("5s")
        return "woke"

    core = Core(registry(wf))
    core.start("r", "wf")
    st = core.state("r")
    assert st.timers() == [(core.now + 5000, 1)] and st.status == "running"
    core.advance(4.9)
    assert st.status == "running"
    core.advance(0.1)
    assert payload.loads(st.output) == "woke"


async def approval(ctx) -> dict:
    first = await ctx.wait_for_signal("approve")
    second = await ctx.wait_for_signal("approve")
    return {"first": first, "second": second}


def test_signals_sent_early_are_buffered_and_each_consumed_once():
    core = Core(registry(approval))
    core.start("r", "approval")
    core.signal("r", "approve", "a", signal_id="s1")
    core.signal("r", "approve", "a-again", signal_id="s1")  # redelivery: ignored
    assert core.state("r").status == "running"
    core.signal("r", "approve", "b", signal_id="s2")
    assert payload.loads(core.state("r").output) == {"first": "a", "second": "b"}


def test_buffered_signal_before_the_wait():
    async def wf(ctx) -> str:
        await ctx.sleep(10)
        return await ctx.wait_for_signal("go")

    core = Core(registry(wf))
    core.start("r", "wf")
    core.signal("r", "go", "early", signal_id="x")
    assert core.facts("r", "SignalBuffered")
    core.advance(10)
    assert payload.loads(core.state("r").output) == "early"


def test_signal_timeout_raises_in_the_workflow():
    async def wf(ctx) -> str:
        try:
            return await ctx.wait_for_signal("approve", timeout="1m")
        except SignalTimeout:
            return "timed out"

    core = Core(registry(wf))
    core.start("r", "wf")
    core.advance(59)
    assert core.state("r").status == "running"
    core.advance(1)
    assert payload.loads(core.state("r").output) == "timed out"
    core.signal("r", "approve", "late")  # after the end: no effect
    assert core.state("r").status == "completed"


def test_cancel_with_compensation():
    done = []

    def book(x):
        done.append("book")

    def unbook(x):
        done.append("unbook")

    async def wf(ctx) -> None:
        await ctx.step(book, 1, compensate=unbook)
        await ctx.wait_for_signal("never")

    core = Core(registry(wf))
    core.start("r", "wf")
    core.cancel("r", compensate=True)
    assert core.state("r").status == "cancelled" and done == ["book", "unbook"]
    n = len(core.journal)
    core.cancel("r")  # cancelling a finished run changes nothing
    assert len(core.journal) == n


def test_continue_as_new_starts_a_fresh_run():
    async def counter(ctx, n: int) -> int:
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    core = Core(registry(counter))
    core.start("c", "counter", 0)
    assert core.state("c").continued_as == "c~1"
    new_id, name, cmd = core.commands[-1]
    assert (new_id, name, payload.loads(cmd["input"])) == ("c~1", "StartRun", 1)


def test_versions_are_pinned_and_unknown_versions_park():
    async def v1(ctx) -> str:
        await ctx.wait_for_signal("go")
        return "v1"

    async def v2(ctx) -> str:
        await ctx.wait_for_signal("go")
        return "v2"

    reg = registry(workflow_def(v1, name="wf", version="1"))
    core = Core(reg)
    core.start("old", "wf")
    reg.add_workflow(workflow_def(v2, name="wf", version="2"))
    core.start("new", "wf")
    assert core.state("new").version == "2"
    core.signal("old", "go", None)
    core.signal("new", "go", None)
    assert payload.loads(core.state("old").output) == "v1"
    assert payload.loads(core.state("new").output) == "v2"

    only_v2 = Core(registry(workflow_def(v2, name="wf", version="2")))
    only_v2.start("pinned", "wf", version="1")
    st = only_v2.state("pinned")
    assert st.status == "parked" and "version '1'" in st.reason


def test_recorded_values_are_stable_across_replays():
    seen = []

    async def wf(ctx) -> list:
        values = [ctx.uuid(), ctx.random(), ctx.now().isoformat()]
        seen.append(values)
        await ctx.sleep(1)
        return values

    core = Core(registry(wf))
    core.start("r", "wf")
    core.advance(1)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert payload.loads(core.state("r").output) == seen[0]


def test_recovery_reruns_an_interrupted_step_then_goes_dead():
    async def wf(ctx) -> int:
        return await ctx.step(add_one, 1)

    core = Core(registry(wf), max_recovery_attempts=2)
    core.auto_run_steps = False
    core.start("r", "wf")
    for n in (1, 2):
        core.recover("r")  # the process died while the step ran
        assert core.state("r").recoveries == n
        assert core.queued[-1].attempt == n + 1
    core.recover("r")
    assert (
        core.state("r").status == "dead" and core.dead and "interrupted" in core.dead[0]["reason"]
    )


def test_recovered_step_completes_once():
    async def wf(ctx) -> int:
        return await ctx.step(add_one, 1)

    core = Core(registry(wf))
    core.auto_run_steps = False
    core.start("r", "wf")
    stale = core.queued.pop()  # the first attempt: its process died
    core.recover("r")
    core.run_step(core.queued.pop())
    core.run_step(stale)  # a late outcome of the dead attempt is ignored
    assert core.state("r").status == "completed"
    assert len(core.facts("r", "StepCompleted")) == 1
