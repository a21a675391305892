"""The inbox's side of crash recovery: which crashed runs are recovered at once, side by
side, and which one at a time, alone; and what a handover leaves to the next owner."""

from __future__ import annotations

from runstream.engine.work import Recover
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
