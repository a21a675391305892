"""An instance's internal work, beside the commands it polls: step outcomes, due timers,
runs to recover after a crash, and work set back by an aborted transaction.

The loop takes it all before each batch (`Inbox.take`), puts a redone batch's work back
(`Inbox.put_back`), and forgets a partition's work when the partition goes.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections import deque
from collections.abc import Callable, Container, Iterable

from runstream.engine.work import LogRecord, Recover, Resume, StepOutcome, Work
from runstream.runtime.steps import StepRunner
from runstream.runtime.timers import TimerQueue

#: At most this many due timers per batch, so one burst can't make a huge transaction.
TIMERS_PER_BATCH = 5000
#: Under load, how long a poll may wait for more commands to share one transaction.
LINGER = 0.01
#: Idle, how long a poll waits for commands at most (a stop request is seen as soon).
IDLE_WAIT = 0.5
#: The longest poll while the instance owns no partition: Kafka hands the assignment over
#: inside a poll, and its restore can only begin once that poll returns.
JOINING_POLL = 0.02

Poll = Callable[[float, int], list[LogRecord]]  # (timeout s, max records) -> records


class Inbox:
    """Work that comes from inside the instance. ``outcomes`` is filled by step threads."""

    def __init__(self) -> None:
        self.timers = TimerQueue()
        self.outcomes: queue.SimpleQueue[StepOutcome] = queue.SimpleQueue()
        self._requeued: list[Work] = []
        self._recovering: deque[Recover] = deque()  # one at a time: see Rules.recover
        self._busy = False  # the last poll brought more than one command

    def poll(
        self, poll: Poll, limit: int, steps_in_flight: bool, owning: bool = True
    ) -> list[LogRecord]:
        """Up to ``limit`` commands from ``poll``, waiting no longer than the internal work
        allows: not at all when some is ready, briefly while steps run, else until the next
        timer is due, or only briefly while the instance owns no partition (``owning``).
        Under load, linger a moment to fill a bigger batch."""
        if self.ready():
            return poll(0, limit)
        if steps_in_flight:
            # poll() can't be woken by a finishing step: look at Kafka without waiting,
            # then wait on the step outcomes (woken at once) for a moment.
            records = poll(0, limit)
            if not records:
                self.wait(0.002)
            return records
        wait = IDLE_WAIT if owning else JOINING_POLL
        due = self.timers.next_due()
        if due is not None:
            wait = max(0.0, min(wait, due / 1000 - time.time()))
        records = poll(wait, limit)
        if self._busy and records:  # fewer, bigger transactions
            until = time.monotonic() + LINGER
            while len(records) < limit and (left := until - time.monotonic()) > 0:
                records += poll(left, limit - len(records))
        self._busy = len(records) > 1
        return records

    def ready(self) -> bool:
        """Work is waiting now (timers aside: `timers.next_due` says when they are)."""
        return bool(self._requeued or self._recovering) or not self.outcomes.empty()

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a step outcome (woken at once by one)."""
        with contextlib.suppress(queue.Empty):
            self._requeued.append(self.outcomes.get(timeout=timeout))

    def take(self, now_ms: int, steps: StepRunner) -> list[Work]:
        """Everything ready now. A crashed run is recovered alone: while any waits, no new
        step starts, and the next is taken only once the running ones drained."""
        items, self._requeued = self._requeued, []
        # No new step starts while a run recovers alone, nor before the outcome of its
        # attempt is committed (a crash meanwhile would charge that run, which succeeded).
        # `isolating` is asked first: an attempt delivers its outcome before it ends.
        hold = bool(self._recovering) or steps.isolating
        if self._recovering and steps.running == 0:
            items.append(self._recovering.popleft())
        while True:
            try:
                items.append(self.outcomes.get_nowait())
            except queue.Empty:
                break
        steps.hold = hold or any(isinstance(w, StepOutcome) and w.isolated for w in items)
        items.extend(self.timers.pop_due(now_ms, TIMERS_PER_BATCH))
        return items

    def put_back(self, items: Iterable[Work], outcomes: Iterable[StepOutcome] = ()) -> None:
        """Work of a batch that was not committed (commands aside: they are read again),
        and ``outcomes`` decided along with it, to be taken again first."""
        items = list(items)
        self._recovering.extendleft(w for w in items if isinstance(w, Recover))
        self._requeued[:0] = [w for w in items if not isinstance(w, LogRecord | Recover)]
        self._requeued += outcomes

    def restored(
        self,
        p: int,
        timers: Iterable[tuple[int, str, int]],
        crashed: Iterable[str],
        alone: Container[str],
        handed_over: Iterable[str],
        parked: Iterable[str],
    ) -> None:
        """Partition ``p`` was restored: arm its timers (due, run id, seq), recover the runs
        whose step crashed (those in ``alone`` one by one, the others at once, side by
        side: `rules.steps.recover`), start handed-over steps again at once, and try parked
        runs again."""
        for due, run_id, seq in timers:
            self.timers.add(p, run_id, seq, due)
        crashed = list(crashed)
        self._recovering.extend(Recover(p, r) for r in crashed if r in alone)
        again = {r for r in crashed if r not in alone}.union(handed_over)
        self._requeued += [Recover(p, r) for r in sorted(again)]
        self._requeued += [Resume(p, r) for r in parked]

    def let_go(self, partitions: set[int]) -> set[str]:
        """``partitions`` are being handed over: drop their timers (the next owner arms
        them) and pending recoveries, keep the outcomes of bodies that ran; the runs that
        were waiting for a crash recovery (the next owner recovers and charges them)."""
        self.timers.drop(partitions)
        crashed = {
            r.run_id
            for r in (*self._recovering, *self._requeued)
            if isinstance(r, Recover) and r.partition in partitions
        }
        self._recovering = deque(r for r in self._recovering if r.partition not in partitions)
        self._requeued = [
            w for w in self._requeued if w.partition not in partitions or isinstance(w, StepOutcome)
        ]
        return crashed

    def drop(self, partitions: set[int]) -> None:
        """``partitions`` are gone: forget their timers and recoveries. (Requeued work of
        theirs is skipped by the loop, which decides only for owned partitions.)"""
        self.timers.drop(partitions)
        self._recovering = deque(r for r in self._recovering if r.partition not in partitions)
