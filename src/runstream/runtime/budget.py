"""A time budget for each run of workflow code.

Workflow code runs on the engine's loop thread, between Kafka transactions, so a loop
or a blocking call in it would stop every partition of the instance. Each activation
(one `replay`) gets ``seconds`` of wall time, watched by a thread of its own:

- past the budget, `Overrun` is raised inside the workflow code (``PyThreadState_
  SetAsyncExc``); `replay` turns it into an outcome and the run is parked, with the
  reason, while the other runs keep flowing;
- an exception cannot interrupt a call blocked in C (a socket read, a lock). If the
  activation still has not ended ``grace`` seconds later, ``on_stuck(run_id)`` is called:
  the shell records the run and ends the process, and the instance that restarts parks
  that run before running anything of it again.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from runstream.engine.requests import Overrun

log = logging.getLogger("runstream.engine")


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``thread_id`` at its next bytecode (None: cancel a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class ActivationBudget:
    """Watches activations of workflow code; use one instance as ``with budget(run_id):``."""

    def __init__(
        self,
        seconds: float,
        on_stuck: Callable[[str], None] | None = None,
        grace: float | None = None,
    ) -> None:
        self.seconds = seconds
        self.grace = grace if grace is not None else max(5.0, 4 * seconds)
        self.on_stuck = on_stuck
        self._lock = threading.Lock()
        # (thread id, run id, started at, interrupted at or 0.0)
        self._current: tuple[int, str, float, float] | None = None
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None

    def __call__(self, run_id: str) -> _Activation:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="budget", daemon=True)
            self._watcher.start()
        return _Activation(self, run_id)

    def close(self) -> None:
        self._stopped.set()

    def _enter(self, run_id: str) -> None:
        with self._lock:
            self._current = (threading.get_ident(), run_id, time.monotonic(), 0.0)

    def _exit(self) -> None:
        with self._lock:
            current, self._current = self._current, None
            if current is not None and current[3]:
                _raise_in(current[0], None)  # fired but maybe not delivered yet: cancel it

    def _watch(self) -> None:
        tick = min(0.05, self.seconds / 4)
        while not self._stopped.wait(tick):
            stuck = None
            with self._lock:
                cur = self._current
                if cur is None:
                    continue
                thread_id, run_id, started, fired = cur
                now = time.monotonic()
                if not fired and now - started > self.seconds:
                    log.warning(
                        "workflow code of run %s overran its %gs budget; interrupting it",
                        run_id,
                        self.seconds,
                        extra={"run_id": run_id},
                    )
                    _raise_in(thread_id, Overrun)
                    self._current = (thread_id, run_id, started, now)
                elif fired and now - fired > self.grace:
                    stuck, self._current = run_id, None
            if stuck is not None:
                log.critical(
                    "workflow code of run %s is blocked in a call that cannot be interrupted",
                    stuck,
                    extra={"run_id": stuck},
                )
                if self.on_stuck is not None:
                    self.on_stuck(stuck)


class _Activation:
    __slots__ = ("_budget", "_run_id")

    def __init__(self, budget: ActivationBudget, run_id: str) -> None:
        self._budget, self._run_id = budget, run_id

    def __enter__(self) -> None:
        self._budget._enter(self._run_id)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._budget._exit()
