"""The inbox's side of crash recovery: which crashed runs are recovered at once, side by
side, and which one at a time, alone; and what a handover leaves to the next owner."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runstream.engine.work import Recover, StepJob, StepOutcome
from runstream.engine.workflow import step_def
from runstream.runtime.inbox import Inbox
from runstream.runtime.steps import StepRunner


def _runner() -> StepRunner:
    return StepRunner(4, lambda _outcome: None)


def test_first_crashes_are_recovered_at_once_and_repeated_ones_one_at_a_time() -> None:
    inbox = Inbox()
    inbox.restored(0, [], ["a", "b", "c", "d"], {"c", "d"}, [], [])
    steps = _runner()
    first = [w.run_id for w in inbox.take(0, steps) if isinstance(w, Recover)]
    assert first == ["a", "b", "c"]  # a and b side by side; of c and d, one
    assert steps.hold  # while a run waits to be recovered alone, no new step starts
    assert [w.run_id for w in inbox.take(0, steps)] == ["d"]  # the next, once none runs
    steps.close()


def test_a_handover_gives_every_pending_recovery_to_the_next_owner() -> None:
    inbox = Inbox()
    inbox.restored(0, [], ["a", "b"], {"b"}, [], [])
    inbox.restored(1, [], ["x"], set(), [], [])
    assert inbox.let_go({0}) == {"a", "b"}  # neither handed over: the next owner recovers
    steps = _runner()
    assert [w.run_id for w in inbox.take(0, steps)] == ["x"]
    steps.close()


def test_no_new_step_starts_before_the_outcome_of_the_last_lone_recovery_is_committed() -> None:
    """The last run recovered alone succeeded; a step queued meanwhile (say a poison one)
    must not start while the batch carrying that outcome commits: a crash then would
    charge the run that ran alone, although its attempt succeeded."""
    outcomes: list[StepOutcome] = []
    steps = StepRunner(4, outcomes.append)
    inbox = Inbox()
    inbox.restored(0, [], ["alone"], {"alone"}, [], [])
    assert [w.run_id for w in inbox.take(0, steps)] == ["alone"]
    began: list[str] = []
    go = threading.Event()

    def body(n: str) -> str:
        began.append(n)
        go.wait(10)
        return n

    step = step_def(body, name="body")
    steps.submit([StepJob(0, "other", 1, 1, step, ("other",))])  # queued: steps.hold
    steps.submit([StepJob(0, "alone", 1, 2, step, ("alone",), isolated=True)])
    wait_for(lambda: began == ["alone"])
    assert inbox.take(0, steps) == [] and steps.hold  # it runs alone: nothing else starts
    go.set()
    wait_for(lambda: bool(outcomes))
    inbox.outcomes.put(outcomes.pop())
    batch = inbox.take(0, steps)  # carries the lone attempt's outcome, to be committed
    assert [(w.run_id, w.isolated) for w in batch] == [("alone", True)]
    assert steps.hold and began == ["alone"]  # "other" waits for that commit
    assert inbox.take(0, steps) == []  # the next batch: the outcome was committed
    wait_for(lambda: began == ["alone", "other"])
    steps.close()


def wait_for(done: Callable[[], bool], timeout: float = 10.0) -> None:
    until = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < until, "timed out"
        time.sleep(0.005)
