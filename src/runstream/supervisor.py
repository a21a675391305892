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
-- ENGINE ARGV``): it imports nothing but the standard library, so it adds little
memory next to the engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
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


def supervise(
    argv: Sequence[str], *, delay: float = 1.0, max_delay: float = 30.0, grace: float = 15.0
) -> int:
    """Run ``argv`` until it exits 0 or we are told to stop; then its exit status.

    A stop signal is passed on; the child gets ``grace`` seconds before SIGKILL.
    """
    stopped = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: object) -> None:
        stopped.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait = delay
    while True:
        started = time.monotonic()
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


def _wait(child: subprocess.Popen[bytes], stopped: threading.Event, grace: float) -> int:
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
    """``GRACE -- ENGINE ARGV...``: supervise the engine command (`runstream worker`)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    grace, sep, *engine = argv
    if sep != "--" or not engine:
        raise SystemExit("usage: python -m runstream.supervisor GRACE -- ENGINE ARGV...")
    return supervise(engine, grace=float(grace))


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
