"""The pure core: replay, non-determinism, retries, compensation, timers, signals."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
from pydantic import BaseModel

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.limits import Limits
from runstream.engine.reducer import fold
from runstream.engine.replay import replay
from runstream.engine.requests import Blocked
from runstream.engine.workflow import Registry, StepPolicy, step_def, workflow_def
from runstream.errors import SignalTimeout, StepError, TerminalStepError
from runstream.schemas.records import Signal, StartRun

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
    assert [e.type for e in core.lifecycle][-1] == "run.completed"


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
    core = Core(registry(typed))
    core.start("ok", "typed", {"id": 1, "amount": 2.5})
    assert payload.loads(core.state("ok").output) == 5.0
    core.start("bad", "typed", {"id": "x"})
    assert not core.state("bad").exists and core.state("bad").status == "rejected"
    assert [d.code for d in core.dead] == ["invalid-input"]
    assert "input of workflow 'typed'" in core.dead[0].reason and "id" in core.dead[0].reason


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
    assert core.lifecycle[-1].type == "run.suspended"


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
    assert len(failed) == 1 and failed[0].retry_at_ms == core.now + 2000
    core.advance(2)  # first retry at +2 s fails, schedules the next at +4 s
    assert core.state("r").status == "running"
    core.advance(4)
    assert core.state("r").status == "completed" and attempts["n"] == 3
    assert [f.attempt for f in core.facts("r", "StepStarted")] == [1, 2, 3]


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
    comp = [f.seq for f in core.facts("s", "StepCompleted") if f.seq < 0]
    assert comp == [-2, -1]  # the undo of step s is step -s, newest first
    assert len(core.facts("s", "StepFailed")) == 1  # no retry of a terminal error


def test_sleep_is_a_durable_timer():
    async def wf(ctx) -> str:
        await ctx.sleep("5s")
        return "woke"

    core = Core(registry(wf))
    core.start("r", "wf")
    st = core.state("r")
    assert st.timers() == {(core.now + 5000, 1)} and st.status == "running"
    core.advance(4.9)
    assert core.state("r").status == "running"
    core.advance(0.1)
    assert payload.loads(core.state("r").output) == "woke"


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


@pytest.mark.parametrize("waiting", [True, False])
def test_a_signal_whose_payload_is_not_json_is_refused_and_the_run_goes_on(waiting):
    """A foreign producer's bytes: recorded, they would fail the run at its replay, for
    good (a retry replays the same fact). Refused to the dead-letter topic instead, as
    an update's argument or a promise's value; a signal-with-start so made starts nothing."""

    async def napping(ctx) -> dict:
        await ctx.sleep(10)  # a signal sent meanwhile is buffered
        return await approval(ctx)

    core = Core(registry(approval, napping))
    core.start("r", "approval" if waiting else "napping")
    before = len(core.journal)
    core.command(Signal("r", "approve", payload=b"{x", signal_id="bad"))
    assert core.journal[before:] == [] and [d.code for d in core.dead] == ["invalid-input"]
    assert "not JSON" in core.dead[0].reason
    core.signal("r", "approve", "b", signal_id="s2")
    core.signal("r", "approve", "c", signal_id="s3")
    core.advance(10)
    assert payload.loads(core.state("r").output) == {"first": "b", "second": "c"}
    core.command(StartRun("new", "approval", input=b"null", signal="approve", signal_payload=b"{x"))
    assert not core.state("new").exists and len(core.dead) == 2


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
    cmd = core.commands[-1]
    assert (cmd.run_id, cmd.continued_from, payload.loads(cmd.input)) == ("c~1", "c", 1)


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
    core.decider.forget(["r"])  # as after a restart: the next activation replays from start
    core.advance(1)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert payload.loads(core.state("r").output) == seen[0]


def test_a_suspended_run_resumes_without_replaying_its_history():
    started = Counter()

    async def long(ctx, n: int) -> int:
        started["runs"] += 1  # once per replay from the start
        total = 0
        for _ in range(n):
            total = await ctx.step(add_one, total)
        return total

    core = Core(registry(long))
    core.start("l", "long", 50)
    assert payload.loads(core.state("l").output) == 50
    assert started["runs"] == 1  # 51 activations, one coroutine

    core.auto_run_steps = False
    core.start("m", "long", 2)
    core.decider.forget(["m"])  # its coroutine is gone: replayed, with the same results
    core.run_step(core.queued.pop())
    core.run_step(core.queued.pop())
    assert payload.loads(core.state("m").output) == 2 and started["runs"] == 3


def test_recovery_reruns_a_crashed_step_beside_others_then_alone_then_goes_dead():
    async def wf(ctx) -> int:
        return await ctx.step(add_one, 1)

    core = Core(registry(wf), max_recovery_attempts=2)
    core.auto_run_steps = False
    core.start("r", "wf")
    assert not core.state("r").recovers_alone()
    core.recover("r")  # died beside other steps: nobody to blame, it runs again at once
    assert core.state("r").recoveries == 0
    assert (core.queued[-1].attempt, core.queued[-1].isolated) == (2, False)
    assert core.state("r").recovers_alone()  # if this one dies too
    core.recover("r")  # that recovery died beside others too: now it runs alone
    assert core.state("r").recoveries == 0
    assert (core.queued[-1].attempt, core.queued[-1].isolated) == (3, True)
    for n in (1, 2):
        assert core.state("r").recovers_alone()
        core.recover("r")  # the process died while the step ran alone: its own doing
        assert core.state("r").recoveries == n
        assert core.queued[-1].attempt == n + 3 and core.queued[-1].isolated
    core.recover("r")
    assert core.state("r").status == "dead"
    assert [d.code for d in core.dead] == ["run-dead"]
    assert "running alone when its engine process died, 3 times" in core.dead[0].reason


def test_a_step_that_completes_after_a_recovery_beside_others_leaves_no_mark():
    async def wf(ctx) -> int:
        x = await ctx.step(add_one, 1)
        return await ctx.step(add_one, x)

    core = Core(registry(wf))
    core.auto_run_steps = False
    core.start("r", "wf")
    core.recover("r")  # the first step, recovered beside others
    core.run_step(core.queued.pop())  # ... completes: the second step starts
    core.recover("r")  # the second step's first crash is its first: beside others again
    assert (core.queued[-1].seq, core.queued[-1].isolated) == (2, False)


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


def test_a_handed_over_step_starts_again_with_its_attempt_and_no_charge():
    async def wf(ctx) -> int:
        x = await ctx.step(add_one, 1)
        return await ctx.step(add_one, x)

    core = Core(registry(wf), max_recovery_attempts=0)  # any charge would kill the run
    core.auto_run_steps = False
    core.start("r", "wf")
    core.hand_over("r", began=frozenset({1}))
    (handed,) = core.facts("r", "StepHandedOver")
    assert (handed.seq, handed.attempt, handed.ran) == (1, 1, True)
    assert [e.type for e in core.lifecycle][-1] == "step.handed_over"
    core.recover("r")  # the next owner, from the journal alone
    (job,) = core.queued
    assert (job.seq, job.attempt, job.isolated) == (1, 1, False)
    core.auto_run_steps = True
    core.run_step(core.queued.pop())
    assert core.state("r").status == "completed" and core.state("r").recoveries == 0
    assert "RunRecovered" not in core.names("r")
    assert check_run(core.facts("r"), expect_finished=True) == []


def test_replaying_a_run_whose_step_was_handed_over_blocks_on_that_step():
    """Before its next owner starts it again, a handed-over step is still the step the
    code asked for (`runstream replay` replays such runs): not a failure of the code."""

    async def wf(ctx) -> int:
        x = await ctx.step(add_one, 1)
        return await ctx.step(add_one, x)

    reg = registry(wf)
    core = Core(reg)
    core.auto_run_steps = False
    core.start("r", "wf")
    core.hand_over("r", began=frozenset({1}))
    state = fold("r", core.facts("r"))
    outcome = replay(reg.latest("wf"), state, reg, core.now).outcome
    assert isinstance(outcome, Blocked) and outcome.request.seq == 1, outcome


def test_a_handover_leaves_a_run_without_open_steps_alone():
    async def sleeper(ctx) -> None:
        await ctx.sleep(10)

    core = Core(registry(sleeper))
    core.start("s", "sleeper")
    before = list(core.journal)
    core.hand_over("s")
    assert core.journal == before


# -- compensation with a step in flight at cancel (defect b) ------------------------------


@pytest.mark.parametrize("gone", ["crash", "handover"])
def test_a_step_relaunched_after_a_cancel_runs_and_the_run_then_compensates(gone):
    """The step's process went away (a crash or a handover), then a cancel came, then the
    next owner recovered the run: the step must run again, or the compensation waits for
    it forever."""

    async def wf(ctx) -> int:
        return await ctx.step(add_one, 1)

    core = Core(registry(wf))
    core.auto_run_steps = False
    core.start("r", "wf")
    if gone == "crash":
        core.queued.clear()
    else:
        core.hand_over("r")
    core.cancel("r", compensate=True)
    core.recover("r")
    assert [j.seq for j in core.queued] == [1]
    core.auto_run_steps = True
    core.run_step(core.queued.pop())
    assert core.state("r").status == "cancelled"


def _booking(log: list[str], fail_second: bool = False):
    def book_a(x):
        log.append("book a")

    def book_b(x):
        log.append("book b")
        if fail_second:
            raise TerminalStepError("sold out")

    def undo_a(x):
        log.append("undo a")

    def undo_b(x):
        log.append("undo b")

    async def trip(ctx) -> None:
        await ctx.step(book_a, 1, compensate=undo_a)
        await ctx.step(book_b, 1, compensate=undo_b)
        await ctx.wait_for_signal("never")

    return trip


def test_cancel_waits_for_the_step_in_flight_then_compensates_it_too():
    log: list[str] = []
    core = Core(registry(_booking(log)))
    core.auto_run_steps = False
    core.start("t", "trip")
    core.run_step(core.queued.pop(0))  # book a
    in_flight = core.queued.pop(0)  # book b has started...
    core.cancel("t", compensate=True)  # ...when the cancel comes
    assert core.state("t").status == "compensating" and not core.queued  # nothing undone yet
    core.run_step(in_flight)  # book b completes after the cancel
    while core.queued:
        core.run_step(core.queued.pop(0))
    assert log == ["book a", "book b", "undo b", "undo a"]  # each undo once, newest first
    assert core.state("t").status == "cancelled"
    assert [f.seq for f in core.facts("t", "StepCompleted")] == [1, 2, -2, -1]


def test_cancel_with_a_step_in_flight_that_then_fails_undoes_only_what_completed():
    log: list[str] = []
    core = Core(registry(_booking(log, fail_second=True)))
    core.auto_run_steps = False
    core.start("t", "trip")
    core.run_step(core.queued.pop(0))
    in_flight = core.queued.pop(0)
    core.cancel("t", compensate=True)
    core.run_step(in_flight)  # book b fails: nothing of it to undo, and no retry
    while core.queued:
        core.run_step(core.queued.pop(0))
    assert log == ["book a", "book b", "undo a"]
    assert core.state("t").status == "cancelled"
    assert len(core.facts("t", "StepStarted")) == 3  # a, b once, then undo a


def test_cancel_without_compensation_drops_the_late_outcome():
    log: list[str] = []
    core = Core(registry(_booking(log)))
    core.auto_run_steps = False
    core.start("t", "trip")
    core.run_step(core.queued.pop(0))
    in_flight = core.queued.pop(0)
    core.cancel("t")
    core.run_step(in_flight)
    assert core.state("t").status == "cancelled" and "undo a" not in log
    assert core.names("t")[-1] == "RunCancelled"


# -- what any producer may send (defects c, i, j) -----------------------------------------


def test_bad_run_ids_are_dead_lettered_and_the_neighbouring_run_is_untouched():
    core = Core(registry(three_steps))
    core.start("a", "three_steps", 1)
    before = core.state("a")
    for bad in ("a\x00b", "x" * 300, ""):
        core.start(bad, "three_steps", 1)
    assert [d.code for d in core.dead] == ["bad-run-id"] * 3
    assert "NUL" in core.dead[0].reason and "1 to 255 bytes" in core.dead[1].reason
    assert core.dead[0].value is not None and core.dead[0].key == b"a\x00b"
    assert core.state("a") == before and set(core.states) == {"a"}


def test_continue_as_new_ids_are_reserved():
    async def counter(ctx, n: int) -> int:
        if n < 1:
            ctx.continue_as_new(n + 1)
        return n

    core = Core(registry(counter))
    core.start("c~1", "counter", 5)  # a user id that looks like a continuation
    assert [d.code for d in core.dead] == ["bad-run-id"] and "reserves" in core.dead[0].reason
    core.start("c", "counter", 0)
    successor = core.commands[-1]
    core.command(successor)  # the engine's own start of c~1 is accepted
    assert core.state("c").continued_as == "c~1"
    assert payload.loads(core.state("c~1").output) == 1
    forged = StartRun("c~2", "counter", input=b"0", continued_from="someone-else")
    core.command(forged)
    assert core.dead[-1].code == "bad-run-id" and not core.state("c~2").exists


def test_a_step_result_from_any_producer_does_not_settle_a_local_step():
    async def wf(ctx) -> int:
        return await ctx.step(add_one, 1)

    core = Core(registry(wf))
    core.auto_run_steps = False
    core.start("r", "wf")
    core.step_result("r", 1, 1)  # forged: the step is local, nobody dispatched it
    core.step_result("r", 1, 1, attempt_id="guess")
    ignored = [e for e in core.lifecycle if e.type == "step.result_ignored"]
    assert [(e.seq, e.attempt) for e in ignored] == [(1, 1)] * 2
    assert "ignored: no remote attempt of that step is open" in (ignored[0].reason or "")
    assert not core.dead
    core.step_result("nobody", 1, 1, attempt_id="guess")  # no such run: set aside
    assert [d.code for d in core.dead] == ["unknown-run"]
    assert core.names("r") == ["RunStarted", "StepStarted"]  # still running
    core.run_step(core.queued.pop())
    assert payload.loads(core.state("r").output) == 2


# -- sizes (defect a), checked before anything reaches Kafka --------------------------------


def test_an_oversize_start_is_rejected_with_its_reason():
    limits = Limits(max_record=200_000)
    core = Core(registry(three_steps), limits=limits)
    core.start("big", "three_steps", "x" * 150_000)
    assert core.state("big").status == "rejected"
    (letter,) = core.dead
    assert letter.code == "oversize" and "the StartRun command is 150,0" in letter.reason
    assert letter.value is None and "not copied" in letter.reason  # only what fits
    assert core.lifecycle[-1].type == "run.rejected" and core.lifecycle[-1].code == "oversize"
    assert core.query("big").status == "rejected"


def test_without_blobs_an_oversize_step_output_fails_the_step_and_a_run_output_the_run():
    def huge(n: int) -> str:
        return "y" * n

    async def wf(ctx, n: int) -> str:
        try:
            await ctx.step(huge, n)
        except StepError as exc:
            return f"caught: {exc.error[:40]}"
        return "fits"

    async def big_result(ctx, n: int) -> str:
        return "z" * n

    limits = Limits(max_record=200_000, blob_threshold=0)  # blobs off (engine.blobs)
    core = Core(registry(wf, big_result), limits=limits)
    core.start("s", "wf", 150_000)
    caught = payload.loads(core.state("s").output)
    assert caught == "caught: the step's output is 150,002 bytes; the "
    assert len(core.facts("s", "StepFailed")) == 1  # not retried: it would not fit again
    core.start("r", "big_result", 150_000)
    assert core.state("r").status == "failed" and "the run's output is" in core.state("r").error


def test_a_reply_that_would_be_too_large_is_answered_with_an_error():
    async def echo(ctx, s: str) -> str:
        return s

    core = Core(registry(echo), limits=Limits(max_record=200_000))
    core.start("e", "echo", "w" * 80_000)  # input and output each fit, together they don't
    assert core.state("e").status == "completed"
    info = core.query("e")
    assert info.found and info.input is None and info.output is None
    assert "input and output together" in info.reply_error


def test_long_errors_are_clipped():
    def loud(x: int) -> None:
        raise TerminalStepError("e" * 50_000)

    async def wf(ctx) -> None:
        await ctx.step(loud, 1)

    core = Core(registry(wf))
    core.start("l", "wf")
    failed = core.facts("l", "StepFailed")[0]
    assert len(failed.error) < 9_000 and failed.error.endswith("characters cut]")


# -- how a workflow takes its input (defect g) -----------------------------------------------


def _logged(fn):
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        return await fn(*args, **kwargs)

    return wrapper


@_logged
async def greet(ctx, name: str) -> str:
    return f"hi {name}"


async def keyword_only(ctx, *, name: str) -> str:
    return f"hello {name}"


def _undecorated_wrapper(fn):
    async def wrapper(*args):  # no functools.wraps: the input is passed along positionally
        return await fn(*args)

    return wrapper


def test_decorated_and_keyword_only_workflows_get_their_input():
    plain = workflow_def(_undecorated_wrapper(greet.__wrapped__), name="plain")
    core = Core(registry(greet, keyword_only, plain))
    core.start("d", "greet", "ann")
    core.start("k", "keyword_only", "bob")
    core.start("p", "plain", "cy")
    assert payload.loads(core.state("d").output) == "hi ann"
    assert payload.loads(core.state("k").output) == "hello bob"
    assert payload.loads(core.state("p").output) == "hi cy"


def test_a_decorated_workflow_validates_its_declared_input():
    core = Core(registry(greet))
    core.start("bad", "greet", {"not": "a string"})
    assert [d.code for d in core.dead] == ["invalid-input"]


def test_workflows_that_cannot_take_an_input_are_refused_at_registration():
    async def three(ctx, a, b) -> None: ...

    def not_async(ctx) -> None: ...

    with pytest.raises(TypeError, match="must take"):
        workflow_def(three)
    with pytest.raises(TypeError, match="async def"):
        workflow_def(not_async)


@pytest.mark.parametrize(
    "exc", [SystemExit(3), KeyboardInterrupt()], ids=lambda e: type(e).__name__
)
def test_workflow_code_raising_systemexit_or_keyboardinterrupt_fails_its_run_only(exc):
    """Defect d: the core catches what user code can raise, BaseException included."""

    async def quits(ctx) -> None:
        raise exc

    core = Core(registry(quits, three_steps))
    core.start("q", "quits")
    core.start("ok", "three_steps", 1)
    assert core.state("q").status == "failed"
    assert core.state("q").error.startswith(type(exc).__name__)
    assert payload.loads(core.state("ok").output) == 4
