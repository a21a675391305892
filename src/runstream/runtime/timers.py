"""Due times of the owned runs' open operations, earliest first: one entry per operation.

Timers, step retries and signal timeouts all wait for a time. The projection indexes
them; this in-memory queue holds the ones of the partitions an instance owns, so the
loop knows how long it may wait for Kafka (nothing polls). An operation whose due time
changes or passes is replaced, never duplicated: stale heap entries are skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from runstream.engine.work import TimerDue

_Key = tuple[int, str, int]  # (partition, run id, seq)


class TimerQueue:
    """The due times of owned operations (`TimerDue` work once due)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str, int]] = []  # (due, partition, run id, seq)
        self._due: dict[_Key, int] = {}

    def __len__(self) -> int:
        return len(self._due)

    def update(
        self,
        p: int,
        run_id: str,
        before: Iterable[tuple[int, int]],
        after: Iterable[tuple[int, int]],
    ) -> None:
        """A run's (due_ms, seq) set changed from ``before`` to ``after``."""
        after = set(after)
        for due, seq in set(before) - after:
            if self._due.get((p, run_id, seq)) == due:
                del self._due[p, run_id, seq]
        for due, seq in after:
            self.add(p, run_id, seq, due)

    def add(self, p: int, run_id: str, seq: int, due: int) -> None:
        key = (p, run_id, seq)
        if self._due.get(key) != due:
            self._due[key] = due
            heapq.heappush(self._heap, (due, p, run_id, seq))

    def drop(self, partitions: set[int]) -> None:
        """Forget every timer of ``partitions`` (revoked)."""
        for key in [k for k in self._due if k[0] in partitions]:
            del self._due[key]

    def next_due(self) -> int | None:
        """The earliest due time (ms), or None."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int, limit: int) -> list[TimerDue]:
        """Up to ``limit`` operations due at ``now``, earliest first."""
        out: list[TimerDue] = []
        while len(out) < limit:
            self._skip_stale()
            if not self._heap or self._heap[0][0] > now:
                break
            _due, p, run_id, seq = heapq.heappop(self._heap)
            del self._due[p, run_id, seq]
            out.append(TimerDue(p, run_id, seq))
        return out

    def _skip_stale(self) -> None:
        heap, due = self._heap, self._due
        while heap and due.get((heap[0][1], heap[0][2], heap[0][3])) != heap[0][0]:
            heapq.heappop(heap)
