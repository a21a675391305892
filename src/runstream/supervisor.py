"""Keeps an engine instance running: `runstream worker` runs the engine in a child
process and starts it again when it dies (a crash, a poison step that takes the
process down, the watchdog ending a hung Kafka call). A crash is always safe to
restart from: what was not committed is redone, what was committed is never lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("runstream.supervisor")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # In the child: if the supervisor is killed (even SIGKILL), the engine dies too,
    # exactly as if the one process had crashed. Linux only.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def supervise(argv: Sequence[str], *, delay: float = 1.0, max_delay: float = 30.0,
              grace: float = 30.0) -> int:  # fmt: skip
    """Run ``argv`` until it exits 0 or we are told to stop (SIGTERM/SIGINT, passed on
    to the child, which gets ``grace`` seconds before SIGKILL). Returns its exit code."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait = delay
    while True:
        started = time.monotonic()
        child = subprocess.Popen(list(argv), preexec_fn=_die_with_parent)
        code = _wait(child, lambda: stopping, grace)
        if stopping or code == 0:
            return code
        if time.monotonic() - started > 60:
            wait = delay  # it ran a good while: this is a new problem, not a crash loop
        log.warning("engine process exited with %s; starting it again in %.0f s", code, wait)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not stopping:
            time.sleep(0.1)
        if stopping:
            return code
        wait = min(wait * 2, max_delay)


def _wait(child: subprocess.Popen[bytes], stopping: Callable[[], bool], grace: float) -> int:
    stop_deadline = None
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if stopping() and stop_deadline is None:
            stop_deadline = time.monotonic() + grace
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            log.warning("engine process did not stop within %.0f s; killing it", grace)
            child.kill()
