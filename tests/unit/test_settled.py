"""`rules.context.settled`: what an earlier activation of a run's code saw settle, read
once per decision. It must not walk the run's history (W9: a run of 5,000 sequential
steps spent half its CPU there, quadratic in its length), and it must give what the rule
says: the seqs settled before this batch and still settled, none settled while paused."""

from __future__ import annotations

from typing import Any

from runstream.engine.reducer import apply
from runstream.engine.rules.context import settled
from runstream.engine.settled import Settled
from runstream.engine.state import RunState
from runstream.engine.work import Batch
from runstream.schemas.records import (
    UPDATE_SEQ_BASE,
    Fact,
    PromiseCompleted,
    PromiseCreated,
    RunPaused,
    RunRetried,
    RunStarted,
    RunUnpaused,
    StepCompleted,
    StepFailed,
    StepStarted,
    UpdateAccepted,
)

RUN = "r"


def started() -> RunState:
    return apply(RunState(RUN), RunStarted(RUN, 0, workflow="w", version="1", input=b"null"))


def step(state: RunState, seq: int, fail: bool = False) -> None:
    apply(state, StepStarted(RUN, 1, seq=seq, name="s", attempt=1))
    done: Fact = (
        StepFailed(RUN, 2, seq=seq, name="s", attempt=1, error="no", traceback="")
        if fail
        else StepCompleted(RUN, 2, seq=seq, name="s", output=b"1", attempt=1, duration_ms=0)
    )
    apply(state, done)


def by_the_rule(before: RunState, st: RunState) -> Settled:
    """The rule, walking the whole history."""
    seen = [s for s in before.resolved if s in st.resolved and s not in before.settled_paused]
    return Settled(
        max((s for s in seen if s < UPDATE_SEQ_BASE), default=0),
        frozenset(s for s in seen if s >= UPDATE_SEQ_BASE),
        began=bool(before.resolved) or bool(before.pending),
        accepted=frozenset(before.updates),
    )


def batch_over(before: RunState) -> tuple[Batch, RunState]:
    b = Batch(lambda _p, _run: before, now=10)
    st = b.state(0, RUN)
    assert isinstance(st, RunState)
    return b, st


class Unwalkable(dict[int, Any]):
    """A history that may be looked up but not walked."""

    def __iter__(self) -> Any:
        raise AssertionError("settled() walked the run's history")

    def keys(self) -> Any:
        raise AssertionError("settled() walked the run's history")

    def items(self) -> Any:
        raise AssertionError("settled() walked the run's history")

    def values(self) -> Any:
        raise AssertionError("settled() walked the run's history")


def test_settled_of_a_long_history_walks_none_of_it() -> None:
    st = started()
    for seq in range(1, 5001):
        step(st, seq)
    st.resolved = Unwalkable(st.resolved)
    empty = Batch(lambda _p, _run: st, now=10)  # the run is not in it: before is st
    assert settled(empty, st) == Settled(5000, began=True)


def test_settled_leaves_out_a_step_this_batch_reopened() -> None:
    before = started()
    for seq in (1, 2, 3):
        step(before, seq)
    step(before, 4, fail=True)
    b, st = batch_over(before)
    apply(st, RunRetried(RUN, 5, seqs=[4]))
    assert settled(b, st) == by_the_rule(before, st) == Settled(3, began=True)


def test_a_reopened_top_step_is_no_longer_the_top_in_later_batches() -> None:
    before = started()
    for seq in (1, 2, 3):
        step(before, seq)
    step(before, 4, fail=True)
    apply(before, RunRetried(RUN, 5, seqs=[4]))  # an earlier batch reopened it
    b, st = batch_over(before)
    assert settled(b, st) == by_the_rule(before, st) == Settled(3, began=True)


def test_settled_leaves_out_what_settled_while_paused() -> None:
    before = started()
    step(before, 1)
    apply(before, RunPaused(RUN, 3, reason="", by="me"))
    step(before, 2)
    b, st = batch_over(before)
    apply(st, RunUnpaused(RUN, 4, reason="", by="me"))
    assert settled(b, st) == by_the_rule(before, st) == Settled(1, began=True)


def test_settled_names_the_update_handlers_seqs_and_a_promise_outcome() -> None:
    before = started()
    step(before, 1)
    handler = UPDATE_SEQ_BASE + 3
    step(before, handler)
    apply(before, PromiseCreated(RUN, 5, seq=2, promise_id=f"{RUN}/promise/2"))
    apply(before, PromiseCompleted(RUN, 6, seq=2, value=b"1"))
    b, st = batch_over(before)
    step(st, 3)  # settled in this batch: not seen before
    assert settled(b, st) == by_the_rule(before, st) == Settled(2, frozenset({handler}), began=True)


def test_a_run_whose_only_settled_seq_is_negative_keeps_it() -> None:
    before = started()
    step(before, -5)
    b, st = batch_over(before)
    assert settled(b, st) == by_the_rule(before, st) == Settled(-5, began=True)


def test_a_state_rebuilt_from_its_facts_after_a_takeover_settles_as_the_live_one() -> None:
    """A new owner (a crash, a handover, a snapshot) rebuilds the run from its journal
    with the reducer: what it keeps beside the history comes back the same."""
    facts: list[Fact] = []
    live = started()
    facts.append(RunStarted(RUN, 0, workflow="w", version="1", input=b"null"))

    def record(fact: Fact) -> None:
        facts.append(fact)
        apply(live, fact)

    for seq in (1, 2):
        record(StepStarted(RUN, 1, seq=seq, name="s", attempt=1))
        record(StepCompleted(RUN, 2, seq=seq, name="s", output=b"1", attempt=1, duration_ms=0))
    handler = UPDATE_SEQ_BASE + 1
    record(StepStarted(RUN, 3, seq=handler, name="s", attempt=1))
    record(StepFailed(RUN, 4, seq=handler, name="s", attempt=1, error="no", traceback=""))
    record(StepStarted(RUN, 3, seq=3, name="s", attempt=1))
    record(StepFailed(RUN, 4, seq=3, name="s", attempt=1, error="no", traceback=""))
    record(RunRetried(RUN, 5, seqs=[3, handler]))  # reopens the top step and the handler's
    rebuilt = RunState(RUN)
    for fact in facts:
        apply(rebuilt, fact)
    assert (
        (rebuilt.top_seq, rebuilt.handler_seqs) == (live.top_seq, live.handler_seqs) == (2, set())
    )
    for st in (live, rebuilt):
        assert settled(Batch(lambda _p, _run, st=st: st, now=10), st) == Settled(2, began=True)


def test_a_run_whose_code_only_opened_operations_began_and_names_its_running_handlers() -> None:
    """Nothing settled yet, but the code ran (a step is running, an update's handler
    too): its start and the handler's are replays in a later batch (`is_replaying`)."""
    before = started()
    apply(before, StepStarted(RUN, 1, seq=1, name="s", attempt=1))
    apply(before, UpdateAccepted(RUN, 2, update_id="u1", name="add", arg=b"1", index=0, anchor=1))
    b, st = batch_over(before)
    running = Settled(0, began=True, accepted=frozenset({"u1"}))
    assert settled(b, st) == by_the_rule(before, st) == running
    fresh = started()
    b, st = batch_over(fresh)
    assert settled(b, st) == by_the_rule(fresh, st) == Settled(0)
