"""Validated updates in the pure core: a validator that rejects leaves no fact; an
accepted update is a fact whose handler runs once (its steps durable, its seqs its own)
and answers on the replies; duplicates, caps, update-with-start, and runs that end,
are cancelled or continue as new with updates in flight."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.limits import Limits
from runstream.engine.reducer import fold
from runstream.engine.work import Batch
from runstream.engine.workflow import Registry, workflow_def
from runstream.errors import TerminalStepError
from runstream.schemas.records import (
    Cancel,
    CompletePromise,
    Pause,
    Reason,
    Retry,
    StartRun,
    Unpause,
    Update,
    UpdateCode,
    UpdateReply,
    UpdateStage,
    promise_id,
    update_seq,
)

from .corehelp import Core

paid: Counter[int] = Counter()


def pay(amount: int) -> str:
    paid[amount] += 1
    return f"receipt-{amount}"


def fail_once(x: Any) -> Any:
    paid[-1] += 1
    if paid[-1] == 1:
        raise TerminalStepError("not yet")
    return x


async def account(ctx, start: int) -> Any:
    balance = {"v": start}

    def enough(amount: int) -> None:
        if amount > balance["v"]:
            raise ValueError(f"insufficient funds: {balance['v']}")

    async def withdraw(amount: int) -> Any:
        balance["v"] -= amount  # before its first await: a replay does it at the same point
        receipt = await ctx.step(pay, amount)
        return {"balance": balance["v"], "receipt": receipt}

    def peek(_: Any) -> int:
        return balance["v"]

    async def nap(secs: int) -> str:
        await ctx.sleep(secs)
        return "rested"

    async def fails(_: Any) -> None:
        raise KeyError("broken handler")

    def uses_ctx(_: Any) -> None:
        ctx.now()

    ctx.update_handler("withdraw", withdraw, validator=enough)
    ctx.update_handler("peek", peek)
    ctx.update_handler("nap", nap)
    ctx.update_handler("fails", fails)
    ctx.update_handler("sneaky", peek, validator=uses_ctx)
    while (go := await ctx.wait_for_signal("go")) != "close":
        if go == "fail":
            await ctx.step(fail_once, go)
        if balance["v"] <= 0:
            ctx.continue_as_new(0)
    return balance["v"]


@pytest.fixture(autouse=True)
def _reset() -> None:
    paid.clear()


def core(limits: Limits | None = None) -> Core:
    reg = Registry()
    reg.add_workflow(workflow_def(account))
    return Core(reg, limits=limits)


def update(
    c: Core, run_id: str, name: str, arg: Any = None, uid: str = "u1", **kw: Any
) -> list[UpdateReply]:
    """Send an update; the answers sent since (its step bodies run at once, unless not)."""
    kw.setdefault("reply_to", "me")
    n = len(c.replies)
    c.command(Update(run_id, name, update_id=uid, arg=payload.dumps(arg), request_id=uid, **kw))
    return [a for _, a in c.replies[n:] if isinstance(a, UpdateReply)]


def answers(b: Batch) -> list[UpdateReply]:
    return [a for _, a in b.effects.replies if isinstance(a, UpdateReply)]


def clean(c: Core, run_id: str) -> None:
    assert check_run(c.facts(run_id)) == []
    assert fold(run_id, c.facts(run_id)) == c.state(run_id)


def test_an_accepted_update_runs_its_handler_once_and_answers_accepted_then_completed():
    c = core()
    c.start("r", "account", 100)
    accepted, completed = update(c, "r", "withdraw", 30)
    assert (accepted.stage, completed.stage) == (UpdateStage.ACCEPTED, UpdateStage.COMPLETED)
    assert payload.loads(completed.output) == {"balance": 70, "receipt": "receipt-30"}
    assert paid == {30: 1}
    names = c.names("r")
    assert names[-4:] == ["UpdateAccepted", "StepStarted", "StepCompleted", "UpdateCompleted"]
    (step,) = c.facts("r", "StepCompleted")
    assert step.seq == update_seq(0, 1)  # its own seqs: the workflow's are not shifted
    c.decider.forget(["r"])  # a replay from the start sees the handler at the same point
    c.signal("r", "go", "close")
    assert payload.loads(c.state("r").output) == 70 and paid == {30: 1}
    clean(c, "r")


def test_a_rejected_update_leaves_no_fact_and_answers_the_validators_error():
    c = core()
    c.start("r", "account", 10)
    before = len(c.journal)
    (rejected,) = update(c, "r", "withdraw", 30)
    assert rejected.stage == UpdateStage.REJECTED and rejected.code == UpdateCode.REJECTED
    assert rejected.error == "ValueError: insufficient funds: 10"
    assert len(c.journal) == before and not paid and not c.dead
    # the same id may be sent again once it can pass (a rejection is not recorded)
    stages = [a.stage for a in update(c, "r", "withdraw", 5, uid="u1")]
    assert stages == [UpdateStage.ACCEPTED, UpdateStage.COMPLETED] and paid == {5: 1}
    clean(c, "r")


def test_a_duplicate_update_gets_the_same_answer_and_the_handler_never_runs_again():
    c = core()
    c.start("r", "account", 100)
    first = update(c, "r", "withdraw", 30)[-1]
    again = update(c, "r", "withdraw", 30)
    assert [a.stage for a in again] == [UpdateStage.COMPLETED]
    assert again[0].output == first.output and paid == {30: 1}
    assert c.names("r").count("UpdateAccepted") == 1
    clean(c, "r")


def test_a_duplicate_of_an_update_in_flight_is_told_it_is_accepted():
    c = core()
    c.auto_run_steps = False
    c.start("r", "account", 100)
    update(c, "r", "withdraw", 30)
    (dup,) = update(c, "r", "withdraw", 30)
    assert dup.stage == UpdateStage.ACCEPTED
    c.run_step(c.queued.pop())  # the completion goes to whom the accepted fact names
    assert [a.stage for _, a in c.replies[-1:]] == [UpdateStage.COMPLETED] and paid == {30: 1}


def test_refusals_name_why_no_handler_unknown_run_invalid_validator_using_ctx():
    c = core()
    c.start("r", "account", 100)
    (no,) = update(c, "r", "nope")
    assert no.code == UpdateCode.NO_HANDLER and "'withdraw'" in (no.error or "")
    (unknown,) = update(c, "ghost", "withdraw", 1)
    assert unknown.code == UpdateCode.UNKNOWN_RUN
    b = c.command(Update("r", "withdraw", update_id="x", arg=b"{nope", reply_to="me"))
    assert answers(b)[0].code == UpdateCode.INVALID_INPUT
    (sneaky,) = update(c, "r", "sneaky", uid="s")
    assert sneaky.code == UpdateCode.REJECTED and "may not call durable" in (sneaky.error or "")
    assert "UpdateAccepted" not in c.names("r")
    clean(c, "r")


def test_an_update_nobody_waits_for_is_dead_lettered_when_refused():
    c = core()
    c.start("r", "account", 1)
    update(c, "r", "withdraw", 30, reply_to=None)
    assert [d.code for d in c.dead] == [Reason.UPDATE_REFUSED]
    assert "insufficient funds" in c.dead[0].reason


def test_a_plain_handler_and_a_failing_handler_complete_with_a_value_or_an_error():
    c = core()
    c.start("r", "account", 7)
    assert payload.loads(update(c, "r", "peek", uid="p")[-1].output) == 7
    failed = update(c, "r", "fails", uid="f")[-1]
    assert failed.stage == UpdateStage.COMPLETED and failed.code == UpdateCode.HANDLER_FAILED
    assert "broken handler" in (failed.error or "") and c.state("r").status == "running"
    clean(c, "r")


def test_a_handler_sleeps_durably():
    c = core()
    c.start("r", "account", 7)
    assert [a.stage for a in update(c, "r", "nap", 5)] == [UpdateStage.ACCEPTED]
    c.advance(5)
    assert payload.loads(c.replies[-1][1].output) == "rested"
    clean(c, "r")


@pytest.mark.parametrize(
    ("end", "says"),
    [("cancel", "was cancelled"), ("complete", "completed"), ("continue", "continued as new")],
)
def test_a_run_that_ends_with_an_update_in_flight_fails_it_with_a_clear_error(end, says):
    c = core()
    c.auto_run_steps = False
    c.start("r", "account", 100)
    update(c, "r", "withdraw", 30)
    update(c, "r", "withdraw", 70, uid="u2")  # the balance is 0: "again" continues as new
    if end == "cancel":
        c.cancel("r")
    else:
        c.signal("r", "go", "close" if end == "complete" else "again")
    failed = [a for _, a in c.replies if isinstance(a, UpdateReply) and a.stage == "completed"]
    assert {a.update_id for a in failed} == {"u1", "u2"}
    assert all(a.code == UpdateCode.RUN_ENDED and says in (a.error or "") for a in failed)
    again = update(c, "r", "withdraw", 30)  # a late duplicate: the same answer, not "not found"
    assert again[0].code == UpdateCode.RUN_ENDED and says in (again[0].error or "")
    (new,) = update(c, "r", "withdraw", 1, uid="u3")
    assert new.stage == UpdateStage.REJECTED and new.code == UpdateCode.RUN_ENDED
    clean(c, "r")


def test_update_with_start_starts_the_run_and_updates_it_in_one_decision():
    c = core()
    b = c.command(
        Update(
            "r", "withdraw", update_id="u1", arg=b"5", reply_to="me",
            start_workflow="account", start_input=b"50",
        )
    )  # fmt: skip
    names = [type(f).__name__ for f in b.effects.facts]
    assert names[:3] == ["RunStarted", "SignalAwaited", "UpdateAccepted"]  # it waits: then taken
    assert payload.loads(c.replies[-1][1].output) == {"balance": 45, "receipt": "receipt-5"}
    # again: the run exists, the update is a duplicate; nothing starts or runs twice
    c.command(Update("r", "withdraw", update_id="u1", arg=b"5", reply_to="me",
                     start_workflow="account", start_input=b"50"))  # fmt: skip
    assert c.names("r").count("RunStarted") == 1 and paid == {5: 1}
    b = c.command(Update("s", "x", update_id="v", arg=b"1", reply_to="me", start_workflow="nope"))
    assert answers(b)[0].code == UpdateCode.UNKNOWN_RUN and "nope" in (answers(b)[0].error or "")
    clean(c, "r")


@pytest.mark.parametrize("reply_to", ["me", None])
def test_update_with_start_whose_update_is_refused_starts_the_run_whether_or_not_a_caller_waits(
    reply_to: str | None,
) -> None:
    """The validator refuses the update (30 > 10); the run starts all the same, answered
    or not: a foreign producer's update-with-start (no reply_to) is refused to the
    dead-letter topic, and the start it carried still holds."""
    c = core()
    uws = Update("r", "withdraw", update_id="u1", arg=b"30", reply_to=reply_to,
                 start_workflow="account", start_input=b"10")  # fmt: skip
    b = c.command(uws)
    assert c.state("r").exists and c.names("r")[:2] == ["RunStarted", "SignalAwaited"]
    assert "UpdateAccepted" not in c.names("r")
    if reply_to is None:
        (letter,) = b.effects.dead_letters
        assert letter.code == Reason.UPDATE_REFUSED and "insufficient funds" in letter.reason
        assert letter.run_id == "r" and letter.offset >= 0  # it points at the command
    else:
        assert answers(b)[0].stage == UpdateStage.REJECTED and not b.effects.dead_letters
    c.command(uws)  # again: the run exists, the update is refused again, nothing starts
    assert c.names("r").count("RunStarted") == 1
    clean(c, "r")


def test_caps_on_updates_in_flight_and_in_a_history_are_checked_in_the_decision():
    c = core(Limits(updates_in_flight=1, updates_per_history=2))
    c.auto_run_steps = False
    c.start("r", "account", 100)
    update(c, "r", "withdraw", 1)
    (busy,) = update(c, "r", "withdraw", 2, uid="u2")
    assert busy.code == UpdateCode.TOO_MANY and "in flight" in (busy.error or "")
    c.run_step(c.queued.pop())
    update(c, "r", "peek", uid="u3")
    (full,) = update(c, "r", "peek", uid="u4")
    assert full.code == UpdateCode.TOO_MANY and "continue as new" in (full.error or "")


def test_an_update_whose_step_was_in_flight_when_the_engine_died_completes_once():
    c = core()
    c.auto_run_steps = False
    c.start("r", "account", 100)
    update(c, "r", "withdraw", 30)
    c.decider.forget(["r"])  # a new process: no coroutine
    c.recover("r")  # the step's body never ran; it runs again, alone
    c.run_step(c.queued.pop())
    done = c.replies[-1][1]
    assert isinstance(done, UpdateReply) and done.stage == UpdateStage.COMPLETED
    assert payload.loads(done.output) == {"balance": 70, "receipt": "receipt-30"}
    assert paid == {30: 1} and c.names("r").count("UpdateCompleted") == 1
    clean(c, "r")


def test_a_failed_run_with_updates_is_retried_from_its_own_failed_step():
    """The handlers' seqs are not the workflow's: a retry reopens the workflow's failed
    step, though an update's step completed after it in seq order; the update that was
    in flight when the run failed stays failed, its handler is not resumed."""
    c = core()
    c.start("r", "account", 100)
    update(c, "r", "withdraw", 30)
    c.auto_run_steps = False
    update(c, "r", "withdraw", 5, uid="u2")  # its step is in flight when the run fails
    c.signal("r", "go", "fail")
    pay_job, fail_job = c.queued
    c.queued.clear()
    c.run_step(fail_job)
    assert c.state("r").status == "failed"
    assert c.state("r").update_results["u2"].code == UpdateCode.RUN_ENDED
    c.run_step(pay_job)  # its outcome comes late: dropped
    c.auto_run_steps = True
    c.command(Retry("r", "fixed", retry_id="x"))
    assert c.state("r").status == "running" and paid[-1] == 2
    c.signal("r", "go", "close")
    assert payload.loads(c.state("r").output) == 65 and paid[5] == 1
    clean(c, "r")


def test_a_run_that_times_out_fails_the_update_in_flight():
    c = core()
    c.auto_run_steps = False
    c.command(StartRun("r", "account", input=b"100", timeout_ms=5_000))
    update(c, "r", "nap", 60)  # its timer is due after the run's timeout
    c.advance(5)
    (failed,) = [a for _, a in c.replies if isinstance(a, UpdateReply) and a.stage == "completed"]
    assert failed.code == UpdateCode.RUN_ENDED and "failed" in (failed.error or "")
    assert c.state("r").status == "failed"
    clean(c, "r")


def test_a_handed_over_handler_step_runs_again_on_the_next_owner_and_completes_once():
    c = core()
    c.auto_run_steps = False
    c.start("r", "account", 100)
    update(c, "r", "withdraw", 30)
    c.hand_over("r")  # a graceful stop before the body began
    c.decider.forget(["r"])
    c.recover("r")
    c.run_step(c.queued.pop())
    assert payload.loads(c.replies[-1][1].output)["balance"] == 70 and paid == {30: 1}
    clean(c, "r")


def test_an_oversized_or_undecodable_update_is_a_dead_letter_not_a_stuck_partition():
    c = core(Limits(max_record=200_000))
    c.start("r", "account", 100)
    big = Update("r", "withdraw", update_id="big", arg=b"1" * 150_000, reply_to="me")
    c.command(big)
    c.record(c.codec.encode(big)[:40], b"r")  # cut short: a foreign producer's bytes
    assert [d.code for d in c.dead] == [Reason.OVERSIZE, Reason.UNDECODABLE]
    assert update(c, "r", "peek", uid="after")[-1].stage == UpdateStage.COMPLETED


def test_an_update_step_recovered_while_the_run_compensates_runs_again_so_the_run_ends():
    """A crash with an update's step in flight, then a cancel with compensation: the
    compensation waits for that step, which a new owner must run again (not only the
    workflow's own step), else the run never ends."""
    c = core()
    c.auto_run_steps = False
    c.start("r", "account", 100)
    update(c, "r", "withdraw", 30)
    c.command(Cancel("r", True, reason="stop"))
    assert c.state("r").status == "compensating"
    c.decider.forget(["r"])
    c.recover("r")
    assert [j.seq for j in c.queued] == [update_seq(0, 1)]
    c.run_step(c.queued.pop())
    assert c.state("r").status == "cancelled"
    assert c.replies[-1][1].code == UpdateCode.RUN_ENDED
    clean(c, "r")


registers = {"handler": True}


async def fickle(ctx) -> Any:
    async def slow(_: Any) -> str:
        return await ctx.step(pay, 1)

    if registers["handler"]:
        ctx.update_handler("slow", slow)
    return await ctx.wait_for_signal("go")


def test_code_that_no_longer_registers_an_accepted_handler_parks_the_run():
    reg = Registry()
    reg.add_workflow(workflow_def(fickle))
    c = Core(reg)
    c.auto_run_steps = False
    c.start("r", "fickle")
    update(c, "r", "slow")
    registers["handler"] = False  # a deploy of code without the handler
    try:
        c.decider.forget(["r"])
        c.run_step(c.queued.pop())
        st = c.state("r")
        assert st.status == "parked" and "update slow" in (st.reason or "")
        assert "UpdateCompleted" not in c.names("r")  # not recorded from code that does not fit
    finally:
        registers["handler"] = True


async def promising(ctx) -> Any:
    seen = {"v": 0}

    def put(k: int) -> int:
        seen["v"] = k
        return k

    ctx.update_handler("put", put)
    p = ctx.promise()
    await ctx.step(pay, 1)
    before = seen["v"]  # read before the await: an update accepted during it is not seen
    await p
    return [before, seen["v"]]


@pytest.mark.parametrize("cache_miss", [False, True])
def test_a_replay_starts_a_handler_where_it_was_accepted_even_at_a_promise_await(cache_miss):
    reg = Registry()
    reg.add_workflow(workflow_def(promising))
    c = Core(reg)
    c.start("r", "promising")
    update(c, "r", "put", 5)  # the run awaits its promise
    if cache_miss:
        c.decider.forget(["r"])
    c.command(CompletePromise("r", promise_id("r", 1), value=b"null"))
    assert payload.loads(c.state("r").output) == [0, 5]
    clean(c, "r")


def test_an_update_to_a_paused_run_is_refused_with_why_and_taken_after_the_unpause():
    c = core()
    c.start("r", "account", 100)
    c.command(Pause("r", "audit", by="ops"))
    before = len(c.journal)
    (refused,) = update(c, "r", "withdraw", 30)
    assert refused.stage == UpdateStage.REJECTED and refused.code == UpdateCode.NOT_RUNNING
    assert "paused" in (refused.error or "") and "audit" in (refused.error or "")
    assert len(c.journal) == before and not paid
    c.command(Unpause("r"))
    stages = [a.stage for a in update(c, "r", "withdraw", 30)]
    assert stages == [UpdateStage.ACCEPTED, UpdateStage.COMPLETED] and paid == {30: 1}
    clean(c, "r")


undone: list[str] = []


def book(x: str) -> str:
    return x


def unbook(x: str) -> None:
    undone.append(x)


async def booking(ctx: Any, _: Any) -> None:
    async def extra(x: str) -> str:
        return await ctx.step(book, x, compensate=unbook)

    ctx.update_handler("extra", extra)
    await ctx.wait_for_signal("a")
    await ctx.step(book, "workflow's, later", compensate=unbook)
    await ctx.wait_for_signal("b")


@pytest.mark.parametrize("restored", [False, True])
def test_compensations_undo_a_handlers_step_and_the_workflows_last_completed_first(restored):
    """A handler's step takes a seq above every workflow step's, yet completed first:
    it is undone last, on a live state and on one a new owner rebuilt from the journal."""
    undone.clear()
    reg = Registry()
    reg.add_workflow(workflow_def(booking))
    c = Core(reg)
    c.start("r", "booking")
    update(c, "r", "extra", "handler's, first")
    c.signal("r", "a", 1)
    if restored:
        c.recover("r")
    c.cancel("r", compensate=True)
    assert undone == ["workflow's, later", "handler's, first"]
    assert c.state("r").status == "cancelled"
    clean(c, "r")
