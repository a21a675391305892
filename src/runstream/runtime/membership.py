"""How long steps may still run ahead of their commit: while this instance's membership
of its consumer group is freshly proved.

An instance frozen past its session (SIGSTOP, a paused VM) wakes up a zombie whose
partitions another owner took, ran and committed; it learns so only when its next
commit fails. An assignment (the group's answer) or a commit that sent offsets (the
group's generation checked) proves membership. The group gives a member's partitions
away only after a session with no heartbeat from it, and heartbeats go on librdkafka's
own thread, so a proof older than the session less two heartbeat intervals means the
whole process stood still or lost the broker. An aborted commit voids the proof. What is
left: a freeze between the check and a body's start, which only a fence could close.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping


class Membership:
    def __init__(self, group_session: Mapping[str, int]) -> None:
        beat, session = group_session["heartbeat.interval.ms"], group_session["session.timeout.ms"]
        self._lease = (session - 2 * beat) / 1000
        self._proved_at = -math.inf  # time.monotonic()

    def proved(self, at: float | None = None) -> None:
        """Membership was proved at ``at`` (time.monotonic(); default now)."""
        self._proved_at = time.monotonic() if at is None else at

    def doubted(self) -> None:
        """A commit aborted: nothing runs ahead until one proves membership again."""
        self._proved_at = -math.inf

    def left(self) -> float:
        """Seconds the last proof still holds (0 or less: none)."""
        return self._proved_at + self._lease - time.monotonic()
