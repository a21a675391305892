"""Keeps an engine instance running: `runstream worker` runs the engine in a child
process and starts it again when it dies (a crash, a poison step that takes the process
down, the watchdog ending a hung Kafka call). A crash is always safe to restart from:
what was not committed is redone, what was committed is never lost.

SIGTERM and SIGINT are passed on to the engine (its own process group, so a Ctrl-C
reaches it once), and an engine the supervisor was asked to stop is never started
again, also during the back-off between two restarts. An engine that cannot load its
App (``MODULE:APP`` does not import) exits with `EXIT_CANNOT_LOAD` and is not started
again either: a restart would only fail the same way.

The supervisor process runs this module alone (``python -m runstream.supervisor GRACE
[--adopt PID] -- ENGINE ARGV``): it imports nothing but the standard library, so it adds
little memory next to the engine. The first engine is not started from ENGINE ARGV:
`runstream worker` forks it once its options are read, then becomes this supervisor (the
same process, so still its parent), which adopts it; a restart need not wait for the
command line's imports twice.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("runstream.supervisor")

_PR_SET_PDEATHSIG = 1
#: The engine's exit status when its App cannot be loaded (sysexits' EX_CONFIG).
EXIT_CANNOT_LOAD = 78


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child (a ``preexec_fn``): receive ``sig`` when the parent dies, even by
    SIGKILL, exactly as if the one process had crashed. Linux only; elsewhere a no-op."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, sig)


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM and SIGINT, even while the main thread blocks in a C call
    (a Kafka request): the signal wakes a socket (``set_wakeup_fd``) that a thread reads.
    Main thread only."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the wakeup socket does the work

    def listen() -> None:
        while reader.recv(1):
            stop()

    threading.Thread(target=listen, name="signals", daemon=True).start()
    _keep.append((reader, writer))  # open for the life of the process


_keep: list[tuple[socket.socket, socket.socket]] = []


class Adopted:
    """A child this process did not start through `subprocess` (forked before the process
    became the supervisor), behind the part of Popen's interface `supervise` uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        until = time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = until - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(min(left, 0.05))
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def supervise(
    argv: Sequence[str],
    *,
    delay: float = 1.0,
    max_delay: float = 30.0,
    grace: float = 15.0,
    adopt: int | None = None,
) -> int:
    """Run ``argv`` until it exits 0 or we are told to stop; then its exit status.
    ``adopt``: the pid of a first engine already running as this process's child.

    A stop signal is passed on; the child gets ``grace`` seconds before SIGKILL.
    """
    stopped = threading.Event()
    child: subprocess.Popen[bytes] | Adopted | None = None

    def stop(signum: int, _frame: object) -> None:
        stopped.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait = delay
    while True:
        started = time.monotonic()
        if adopt is not None:
            child, adopt = Adopted(adopt), None
        else:
            child = subprocess.Popen(list(argv), preexec_fn=die_with_parent, process_group=0)
        code = _wait(child, stopped, grace)
        if stopped.is_set() or code == 0:
            return code if code >= 0 else 128 - code
        if code == EXIT_CANNOT_LOAD:
            log.error("the engine cannot load its App (exit %d): not starting it again", code)
            return code
        if time.monotonic() - started > 60:
            wait = delay  # it ran a good while: a new problem, not a crash loop
        log.warning("engine process exited with %s; starting it again in %.0f s", code, wait)
        until = time.monotonic() + wait
        while time.monotonic() < until and not stopped.is_set():
            time.sleep(0.05)
        if stopped.is_set():  # asked to stop during the back-off: never start it again
            return code if code >= 0 else 128 - code
        wait = min(wait * 2, max_delay)


def _wait(child: subprocess.Popen[bytes] | Adopted, stopped: threading.Event, grace: float) -> int:
    kill_at = None
    while True:
        try:
            return child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        if stopped.is_set() and kill_at is None:
            kill_at = time.monotonic() + grace
        if kill_at is not None and time.monotonic() > kill_at:
            log.warning("engine process did not stop within %.0f s; killing it", grace)
            child.kill()


def main(argv: Sequence[str]) -> int:
    """``GRACE [--adopt PID] -- ENGINE ARGV...``: supervise the engine command (`runstream
    worker`), the first one already running as child PID if given."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    grace, *rest = argv
    adopt = None
    if rest[:1] == ["--adopt"] and len(rest) > 1 and rest[1].isdigit():
        adopt, rest = int(rest[1]), rest[2:]
    sep, *engine = rest or [""]
    if sep != "--" or not engine:
        raise SystemExit(
            "usage: python -m runstream.supervisor GRACE [--adopt PID] -- ENGINE ARGV..."
        )
    return supervise(engine, grace=float(grace), adopt=adopt)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
