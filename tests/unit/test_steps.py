"""Step bodies: one attempt (`runtime.steps.execute`) and the pool (`StepRunner`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from runstream.engine import payload
from runstream.engine.work import StepJob, StepOutcome
from runstream.engine.workflow import StepPolicy, step_def
from runstream.runtime.steps import StepRunner, execute


def job(fn, *args, isolated: bool = False, seq: int = 1, **policy) -> StepJob:
    return StepJob(0, "r", seq, 1, step_def(fn, StepPolicy(**policy)), args, isolated)


def test_a_sync_step_past_its_timeout_fails_retryably_and_its_late_result_is_ignored(caplog):
    release, finished = threading.Event(), threading.Event()

    def slow() -> str:
        release.wait(5)
        finished.set()
        return "late"

    outcome = execute(job(slow, timeout=0.2))
    assert not outcome.ok and outcome.retryable
    assert outcome.error.startswith("StepTimeout: step") and "timeout of 0.2s" in outcome.error
    assert not finished.is_set()  # the thread cannot be stopped: it still runs
    with caplog.at_level(logging.WARNING, logger="runstream.steps"):
        release.set()
        assert finished.wait(5)
        time.sleep(0.1)
    assert "ended after its 0.2s timeout; its result is ignored" in caplog.text


def test_a_sync_step_within_its_timeout_returns_its_result():
    outcome = execute(job(lambda x: x * 2, 21, timeout=5))
    assert outcome.ok and payload.loads(outcome.output) == 42


def test_an_async_step_past_its_timeout_is_cancelled_and_fails_retryably():
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    outcome = execute(job(slow, timeout=0.2))
    assert not outcome.ok and outcome.retryable and "timeout of 0.2s" in outcome.error
    assert cancelled.is_set()


def test_non_retryable_exceptions_fail_at_once():
    def picky() -> None:
        raise KeyError("gone")

    assert not execute(job(picky, non_retryable=(KeyError,))).retryable
    assert execute(job(picky)).retryable


def test_an_attempt_counts_as_ended_only_once_its_outcome_is_delivered():
    """The shell starts the next recovery when the runner is idle: the outcome of the one
    before must be in its hands by then, or both commit apart and a crash of the next
    charges the one before (seen as a healthy run charged in the poison-step test)."""
    delivered: list[StepOutcome] = []

    def slow_delivery(outcome: StepOutcome) -> None:
        time.sleep(0.2)  # the shell's queue, as late as a busy machine makes it
        delivered.append(outcome)

    runner = StepRunner(2, slow_delivery)
    runner.submit([job(lambda: 1, isolated=True)])  # running at once: nothing else is
    deadline = time.monotonic() + 5
    while runner.running and time.monotonic() < deadline:
        time.sleep(0.001)
    assert delivered, "the runner looked idle before its last outcome was delivered"
    runner.close()


def test_an_isolated_attempt_runs_alone():
    gate = threading.Event()
    running: set[int] = set()
    overlaps: list[set[int]] = []
    lock = threading.Lock()

    def body(n: int) -> int:
        with lock:
            running.add(n)
            overlaps.append(set(running))
        gate.wait(5)
        with lock:
            running.discard(n)
        return n

    done: list[StepOutcome] = []
    runner = StepRunner(8, done.append)
    runner.submit([job(body, 1, seq=1), job(body, 2, seq=2)])  # two normal ones run...
    runner.submit([job(body, 3, seq=3, isolated=True)])  # ...the recovery waits for them
    runner.submit([job(body, 4, seq=4)])  # ...and this one waits for the recovery
    time.sleep(0.2)
    assert running == {1, 2} and runner.in_flight == 4
    gate.set()
    deadline = time.monotonic() + 5
    while len(done) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(o.seq for o in done) == [1, 2, 3, 4]
    assert {3} in overlaps and not any(3 in s and len(s) > 1 for s in overlaps)
    runner.close()


@pytest.mark.parametrize("partitions", [{0}, {1}])
def test_queued_attempts_of_revoked_partitions_are_dropped(partitions):
    gate = threading.Event()
    runner = StepRunner(1, lambda _o: None)
    runner.submit([job(gate.wait, 5, seq=1), job(gate.wait, 5, seq=2)])
    dropped = runner.forget(partitions)
    assert dropped == (1 if partitions == {0} else 0)  # the running one stays
    gate.set()
    runner.close()


def test_held_attempts_start_when_the_hold_is_released():
    done: list[StepOutcome] = []
    runner = StepRunner(4, done.append)
    runner.hold = True
    runner.submit([job(lambda: 1, seq=1)])
    time.sleep(0.1)
    assert not done and runner.in_flight == 1 and runner.running == 0
    runner.hold = False
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [o.seq for o in done] == [1]
    runner.close()
