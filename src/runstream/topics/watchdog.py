"""Ends the process when a Kafka call blocks for too long.

librdkafka can block in a transactional call forever when the group or transaction
coordinator dies at the wrong moment (librdkafka issues 5456 and 5511). Nothing can
cancel the call, and a hung instance sits on its partitions. Exiting is safe: nothing
uncommitted counts, and the supervisor of `runstream worker` starts the instance again,
which aborts the open transaction. After a stop request (SIGTERM) a call may block for
its grace at most, counted from the later of its start and the request, so a stop never
waits on a broker that is gone: `STOP_GRACE` for most calls, `DRAIN_GRACE` for those
the drain depends on: a transaction's outcome (it records the steps that ended during the
drain and the handover; a loaded machine with a slow replica can take seconds to commit
one) and the reads of a restore under way (the partitions already owned are handed over
once it returns, which an abandoned read would deny them).

Exit statuses (documented in docs/guides/deploying.md):
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("runstream.worker")

#: The instance ended itself so that it restarts: a Kafka call or workflow code hung.
EXIT_HUNG = 75
#: Stopped on request, but a Kafka call in progress had to be abandoned (nothing is lost).
EXIT_ABANDONED = 76
#: A Kafka producer became unusable for good (fenced, unauthorised): see `topics.txn`.
EXIT_FATAL = 77
#: After a stop request, how long a blocked Kafka call may still take.
STOP_GRACE = 1.5
#: The same for a call the drain depends on (a transaction's outcome, a restore's read).
DRAIN_GRACE = 10.0

__doc__ += f"""
- 0: stopped on request, everything in hand recorded;
- {EXIT_HUNG}: ended itself so that it restarts (a Kafka call hung, or workflow code
  blocked in a call that cannot be interrupted);
- {EXIT_ABANDONED}: stopped on request while a Kafka call was blocked; the call was
  abandoned (its transaction is aborted by Kafka; nothing committed is lost);
- {EXIT_FATAL}: Kafka refused the instance's transactional producer for good (fenced by
  another process with the same instance id, unauthorised).
"""


class Watchdog:
    """Watches the Kafka call under way (one at a time: the loop's thread makes them)."""

    def __init__(self, exit_on_hang: bool = True) -> None:
        self.exit_on_hang = exit_on_hang
        self._blocked: tuple[str, float, float, float] | None = None  # what, since, deadline, grace
        self._stopped_at: float | None = None
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watch(self, what: str, limit: float, grace: float = STOP_GRACE) -> Iterator[None]:
        """Bracket a blocking Kafka call that must return within ``limit`` seconds, and
        within ``grace`` seconds of a stop request."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
            self._thread.start()
        now = time.monotonic()
        self._blocked = (what, now, now + limit, grace)
        try:
            yield
        finally:
            self._blocked = None

    def stop_requested(self) -> None:
        """From now on, a call gets its grace at most."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()

    def _run(self) -> None:
        while True:
            time.sleep(0.1)
            blocked, now = self._blocked, time.monotonic()
            if blocked is None:
                continue
            what, since, deadline, grace = blocked
            stopped_at = self._stopped_at
            if stopped_at is not None and now - max(since, stopped_at) > grace:
                self._exit(EXIT_ABANDONED, f"stopping: abandoned {what}, which did not return")
            elif now > deadline:
                self._exit(EXIT_HUNG, f"{what} did not return; exiting so this instance restarts")

    def fatal(self, message: str) -> None:
        """A Kafka client is unusable for good: end the process with `EXIT_FATAL`."""
        self._exit(EXIT_FATAL, message)

    def _exit(self, code: int, message: str) -> None:
        if not self.exit_on_hang:  # an engine on a thread of a bigger program: only say it
            log.critical("%s (not exiting: exit_on_hang is off)", message)
            self._blocked = None
            return
        log.critical(message)
        logging.shutdown()
        os._exit(code)
