"""Queries in the pure core: ``ctx.set_event`` is a fact set once (a replay, a recovery,
a retry and a redone decision never set it again), told on the lifecycle stream, capped
in the decision; a live query answers from the replayed workflow and records nothing."""

from __future__ import annotations

from typing import Any

import pytest

from examples.testing import test_queries_flow as example
from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.limits import Limits
from runstream.engine.reducer import fold
from runstream.engine.workflow import Registry, workflow_def
from runstream.errors import EventRefused, TerminalStepError
from runstream.schemas.records import (
    Kind,
    LiveQuery,
    QueryAnswer,
    Retry,
)

from .corehelp import Core

calls: list[str] = []


def work(x: Any) -> Any:
    calls.append("work")
    return x


def fails(x: Any) -> Any:
    calls.append("fails")
    if calls.count("fails") == 1:
        raise TerminalStepError("not yet")
    return x


async def progress(ctx, n: int) -> int:
    done = 0

    @ctx.query_handler("done")
    def _done() -> int:
        return done

    @ctx.query_handler("times")
    def _times(k: int) -> int:
        return done * k

    ctx.set_event("stage", "started")
    for _ in range(n):
        await ctx.step(work, 1)
        done += 1
        ctx.set_event("done", done)
    await ctx.wait_for_signal("go")
    ctx.set_event("stage", "finished")
    return done


async def flaky(ctx) -> str:
    ctx.set_event("before", 1)
    await ctx.step(fails, 1)
    ctx.set_event("after", 2)
    return "ok"


async def big(ctx, size: int) -> str:
    try:
        ctx.set_event("big", "x" * size)
    except EventRefused as exc:
        return f"refused: {exc}"
    return "set"


async def many(ctx, n: int) -> str:
    for i in range(n):
        ctx.set_event(f"k{i}", i)
    ctx.set_event("k0", "again")  # an old key may be set again past the cap
    return "ok"


async def continues(ctx, n: int) -> int:
    ctx.set_event("n", n)
    if n < 2:
        ctx.continue_as_new(n + 1)
    await ctx.wait_for_signal("end")
    return n


async def rude(ctx) -> None:
    @ctx.query_handler("step")
    def _step() -> Any:
        return ctx.now()  # a durable operation: refused

    @ctx.query_handler("boom")
    def _boom() -> Any:
        raise ValueError("no")

    @ctx.query_handler("odd")
    def _odd() -> Any:
        return object()

    await ctx.wait_for_signal("end")


def core(limits: Limits | None = None) -> Core:
    reg = Registry()
    for fn in (progress, flaky, big, many, continues, rude):
        reg.add_workflow(workflow_def(fn))
    calls.clear()
    return Core(reg, limits=limits)


def events(c: Core, run_id: str) -> list[tuple[str, Any]]:
    return [(f.key, payload.loads(f.value)) for f in c.facts(run_id, "RunEventSet")]


def ask(c: Core, run_id: str, name: str, arg: Any = None) -> QueryAnswer:
    n = len(c.replies)
    c.command(LiveQuery(run_id, f"q{n}", reply_to="me", name=name, arg=payload.dumps(arg)))
    (to, answer), *_ = c.replies[n:]
    assert to == "me" and isinstance(answer, QueryAnswer) and answer.request_id == f"q{n}"
    return answer


def test_set_event_is_a_fact_once_per_call_and_on_the_lifecycle_stream() -> None:
    c = core()
    c.start("r", "progress", 2)
    c.signal("r", "go", None)
    assert events(c, "r") == [("stage", "started"), ("done", 1), ("done", 2), ("stage", "finished")]
    told = [e for e in c.lifecycle if e.type == Kind.RUN_EVENT_SET]
    assert [(e.key, payload.loads(e.output), e.seq) for e in told] == [
        (f.key, payload.loads(f.value), f.seq) for f in c.facts("r", "RunEventSet")
    ]
    assert not check_run(c.facts("r"))


def test_a_recovery_and_a_replay_set_nothing_again() -> None:
    c = core()
    c.start("r", "progress", 2)
    before = events(c, "r")
    c.recover("r")  # a new owner: folded from the journal, the workflow replayed
    c.signal("r", "go", None)
    assert events(c, "r") == [*before, ("stage", "finished")]
    assert fold("r", c.facts("r")) == c.states["r"]


def test_a_retried_run_keeps_its_events_and_sets_the_later_ones_once() -> None:
    c = core()
    c.start("r", "flaky")
    assert c.states["r"].status == "failed"
    c.command(Retry("r", "again", retry_id="x"))
    assert c.states["r"].status == "completed"
    assert events(c, "r") == [("before", 1), ("after", 2)]
    assert not check_run(c.facts("r"))


def test_a_value_past_the_cap_is_refused_in_the_workflow_before_any_record() -> None:
    c = core(Limits(event_value=1000))
    c.start("small", "big", 900)
    c.start("large", "big", 1000)
    assert [k for k, _ in events(c, "small")] == ["big"]
    assert events(c, "large") == []
    out = payload.loads(c.states["large"].output)
    assert out.startswith("refused: ctx.set_event('big'): the value is 1,002 bytes")


def test_keys_past_the_cap_fail_the_run_with_a_clear_error() -> None:
    c = core(Limits(event_keys=3))
    c.start("ok", "many", 3)
    c.start("over", "many", 4)
    assert c.states["ok"].status == "completed"
    assert [k for k, _ in events(c, "ok")] == ["k0", "k1", "k2", "k0"]
    st = c.states["over"]
    assert st.status == "failed" and "EventRefused" in (st.error or "")
    assert "has set 3 keys, the limit (Limits.event_keys)" in (st.error or "")


def test_each_incarnation_of_continue_as_new_sets_its_own_events() -> None:
    c = core()
    c.start("r", "continues", 0)
    while c.commands:  # the successors' starts, as the commands topic brings them
        c.command(c.commands.pop(0))
    assert events(c, "r") == [("n", 0)]
    assert events(c, "r~1") == [("n", 1)]
    assert events(c, "r~2") == [("n", 2)]


def test_a_live_query_answers_from_the_replayed_workflow_and_records_nothing() -> None:
    c = core()
    c.start("r", "progress", 3)
    journal, ran = list(c.journal), list(calls)
    assert payload.loads(ask(c, "r", "done").value) == 3
    assert payload.loads(ask(c, "r", "times", 2).value) == 6
    assert c.journal == journal and calls == ran  # no fact, no step
    c.signal("r", "go", None)
    answer = ask(c, "r", "done")  # an ended run still answers
    assert answer.found and payload.loads(answer.value) == 3


def test_a_query_that_cannot_be_answered_says_why() -> None:
    c = core()
    c.start("r", "rude")
    journal = list(c.journal)
    missing = ask(c, "r", "nope")
    assert missing.found and missing.value is None
    handlers = "(its handlers: 'boom', 'odd', 'step')"
    assert missing.error == f"run 'r' has no query handler 'nope' {handlers}"
    assert "may not call durable operations" in (ask(c, "r", "step").error or "")
    assert ask(c, "r", "boom").error == "query 'boom' raised ValueError: no"
    assert "is not JSON" in (ask(c, "r", "odd").error or "")
    unknown = ask(c, "nobody", "done")
    assert not unknown.found and unknown.error is None
    assert c.journal == journal and not c.dead


async def huge(ctx) -> None:
    @ctx.query_handler("all")
    def _all() -> str:
        return "x" * 400_000

    await ctx.wait_for_signal("end")


def test_a_foreign_producers_odd_query_is_answered_with_the_reason_never_a_dead_letter() -> None:
    c = core()
    c.start("r", "progress", 1)
    journal = list(c.journal)
    c.command(LiveQuery("r", "odd", reply_to="me", name="times", arg=b"\xff{not json"))
    answer = c.replies[-1][1]
    assert isinstance(answer, QueryAnswer) and answer.request_id == "odd"
    assert answer.found and "the argument of query 'times' is not JSON" in (answer.error or "")
    c.record(b"\xc3\x01garbage", b"r")  # undecodable: a dead letter, as any command
    assert [d.code for d in c.dead] == ["undecodable"]
    assert c.journal == journal


def test_an_answer_larger_than_a_record_may_be_is_an_error_not_a_record() -> None:
    reg = Registry()
    reg.add_workflow(workflow_def(huge))
    c = Core(reg, limits=Limits(max_record=300_000))
    c.start("r", "huge")
    answer = ask(c, "r", "all")
    assert answer.value is None and "the answer of query 'all' is 400,002 bytes" in (
        answer.error or ""
    )


# -- the testing kit -------------------------------------------------------------------


def test_the_workflow_tester_reads_events_and_asks_queries() -> None:
    from runstream import App
    from runstream.errors import QueryFailed, RunNotFound
    from runstream.testing import WorkflowTester

    app = App("kit")
    app.workflow(progress)
    app.workflow(continues)
    t = WorkflowTester(app)
    run = t.start("progress", 2, run_id="p")
    assert run.events == {"stage": "started", "done": 2}
    assert t.query("p", "done") == 2 and t.query("p", "times", 5) == 10
    history = list(run.history)
    with pytest.raises(QueryFailed, match="no query handler 'nope'"):
        t.query("p", "nope")
    with pytest.raises(RunNotFound):
        t.query("nobody", "done")
    assert run.history == history  # a query records nothing
    t.signal("p", "go")
    assert run.events["stage"] == "finished" and run.result() == 2
    chain = t.start("continues", 0, run_id="c")
    assert chain.events == {"n": 2}  # the newest value along continue-as-new


@pytest.mark.parametrize("name", sorted(n for n in vars(example) if n.startswith("test_")))
def test_the_example_test_file_passes(name: str) -> None:
    getattr(example, name)()
