"""Clients waiting for a run to end, answered by its owner in the transaction that ends
the run: ``result()`` reads only its own replies, never a whole lifecycle partition, and
learns the end the moment it is committed.

The start's own question (StartRun.reply_to) is recorded in the run's RunStarted, so
whichever instance owns the run when it ends answers it. Later questions (a Query with
``wait``) live in the owner's memory only: an owner that loses the run's partition
forgets them, and so does a restart; the client asks again when no answer came after a
while, so nothing is lost, and nothing is written to the journal per question.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeGuard

from runstream.engine.state import RunState, State, Status
from runstream.engine.work import Batch, Waiter
from runstream.schemas.records import RunInfo


def _ended(st: State) -> TypeGuard[RunState]:
    """A run ended (or its start was rejected); an entity never ends."""
    return isinstance(st, RunState) and (st.terminal or st.status is Status.REJECTED)


#: Questions kept at most (a client that never reads its answers must not fill memory).
LIMIT = 100_000


class Waiters:
    """The open questions of one instance, by run."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._by_run: dict[str, dict[str, Waiter]] = {}  # run id -> request id -> waiter
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def answer(self, b: Batch, info: Callable[[RunState, str], RunInfo]) -> list[str]:
        """Add to ``b`` the answers to the questions about runs the batch ends (those
        asked in this batch included, and the one a run's start asked, recorded in its
        RunStarted); the runs answered, to `committed` once the batch commits."""
        answered = []
        asked: dict[str, dict[str, Waiter]] = {}
        for w in b.effects.waiters:
            asked.setdefault(w.run_id, {})[w.request_id] = w
        for run_id, run in b.runs.items():
            st = run.after
            if not _ended(st):
                continue
            waiting = {**self._by_run.get(run_id, {}), **asked.get(run_id, {})}
            if st.reply_to and not _ended(run.before):  # ends now: tell who started it
                waiting[st.request_id] = Waiter(run.partition, run_id, st.reply_to, st.request_id)
            for request_id, w in waiting.items():
                b.effects.replies.append((w.reply_to, info(st, request_id)))
            if waiting:
                answered.append(run_id)
        return answered

    def committed(self, b: Batch, answered: Iterable[str]) -> None:
        """The batch committed: forget what it answered, keep what it was asked."""
        for run_id in answered:
            self._count -= len(self._by_run.pop(run_id, {}))
        done = set(answered)
        for w in b.effects.waiters:
            if w.run_id not in done and self._count < self.limit:
                waiting = self._by_run.setdefault(w.run_id, {})
                self._count += w.request_id not in waiting
                waiting[w.request_id] = w

    def drop(self, partitions: set[int]) -> None:
        """Forget the questions about runs of ``partitions`` (revoked)."""
        for run_id in [
            r for r, ws in self._by_run.items() if next(iter(ws.values())).partition in partitions
        ]:
            self._count -= len(self._by_run.pop(run_id))
