"""Running step bodies: one attempt (`execute`) and a pool of them (`StepRunner`).

`execute` never raises: whatever the step returns or raises becomes a `StepOutcome`.
A ``timeout`` fails an attempt that runs longer, and it is retried by the step's policy
like any failure. An ``async def`` step is cancelled at its timeout. A plain function
runs on a thread of its own, which Python cannot stop: past the timeout the attempt
counts as failed, the thread runs on, and whatever it returns later is logged and
ignored (the attempt's outcome is already recorded). Make such steps idempotent.

`StepRunner` runs attempts on a pool of threads. A recovery attempt (``isolated``,
after a crash) runs alone: nothing else starts until it ends, so if the process dies
meanwhile, the run it belongs to is the one charged (see `Rules.recover`). While the
shell has recoveries waiting, it sets `StepRunner.hold`: new attempts wait, the running
ones drain, and the next recovery can start alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runstream.engine import payload
from runstream.engine.work import StepJob, StepOutcome
from runstream.errors import StepTimeout, TerminalStepError

log = logging.getLogger("runstream.steps")


def execute(job: StepJob) -> StepOutcome:
    """Run one attempt of a step and say how it went. Never raises."""
    started = time.monotonic()
    step, timeout = job.step, job.step.policy.timeout
    try:
        if step.is_async:
            result = asyncio.run(_bounded(step.fn(*job.args), timeout, step.name))
        elif timeout is not None:
            result = _call_with_timeout(job, timeout)
        else:
            result = step.fn(*job.args)
        output = payload.dumps(result)
    except BaseException as exc:  # the step's own business, KeyboardInterrupt included
        final: tuple[type[BaseException], ...] = (TerminalStepError, *step.policy.non_retryable)
        return StepOutcome(
            job.partition,
            job.run_id,
            job.seq,
            job.attempt,
            False,
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            retryable=not isinstance(exc, final),
            duration_ms=_ms_since(started),
        )
    return StepOutcome(
        job.partition,
        job.run_id,
        job.seq,
        job.attempt,
        True,
        output,
        duration_ms=_ms_since(started),
    )


async def _bounded(coro: Any, timeout: float | None, name: str) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        raise StepTimeout(f"step {name!r} ran longer than its timeout of {timeout:g}s") from None


def _call_with_timeout(job: StepJob, timeout: float) -> Any:
    """Run a sync step on a thread of its own and stop waiting for it at ``timeout``."""
    box: dict[str, Any] = {}
    late = threading.Event()  # set once the attempt has been given up

    def body() -> None:
        try:
            box["result"] = job.step.fn(*job.args)
        except BaseException as exc:
            box["error"] = exc
        if late.is_set():
            log.warning(
                "step %r of run %s (attempt %d) ended after its %gs timeout; its result is ignored",
                job.step.name,
                job.run_id,
                job.attempt,
                timeout,
            )

    thread = threading.Thread(target=body, name=f"step-{job.step.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        late.set()
        raise StepTimeout(
            f"step {job.step.name!r} ran longer than its timeout of {timeout:g}s; "
            "its thread cannot be stopped and its result will be ignored"
        )
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


class StepRunner:
    """Runs step attempts on ``concurrency`` threads and reports each outcome to ``done``
    (called on the step's thread)."""

    def __init__(self, concurrency: int, done: Callable[[StepOutcome], None]) -> None:
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="step")
        self._concurrency = concurrency
        self._done = done
        self._lock = threading.Lock()
        self._queued: deque[StepJob] = deque()
        self._isolated: deque[StepJob] = deque()
        self._running = 0
        self._alone = False  # an isolated attempt is running
        self._closed = False
        self._hold = False

    @property
    def hold(self) -> bool:
        """Start no new (normal) attempts: recoveries are waiting to run alone."""
        return self._hold

    @hold.setter
    def hold(self, value: bool) -> None:
        with self._lock:
            self._hold = value
            self._start_what_may()

    @property
    def running(self) -> int:
        """Attempts running now."""
        with self._lock:
            return self._running

    @property
    def in_flight(self) -> int:
        """Attempts queued or running."""
        with self._lock:
            return self._running + len(self._queued) + len(self._isolated)

    def submit(self, jobs: Iterable[StepJob]) -> None:
        with self._lock:
            for job in jobs:
                (self._isolated if job.isolated else self._queued).append(job)
            self._start_what_may()

    def forget(self, partitions: set[int]) -> int:
        """Drop the queued (not yet started) attempts of ``partitions``; how many."""
        with self._lock:
            before = len(self._queued) + len(self._isolated)
            for q in (self._queued, self._isolated):
                kept = [j for j in q if j.partition not in partitions]
                q.clear()
                q.extend(kept)
            return before - len(self._queued) - len(self._isolated)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queued.clear()
            self._isolated.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _start_what_may(self) -> None:  # under the lock
        if self._closed or self._alone:
            return
        if self._isolated:  # let the running attempts end, then run it alone
            if self._running == 0:
                self._alone = True
                self._launch(self._isolated.popleft())
            return
        while self._queued and self._running < self._concurrency and not self._hold:
            self._launch(self._queued.popleft())

    def _launch(self, job: StepJob) -> None:  # under the lock
        self._running += 1
        self._pool.submit(self._run, job)

    def _run(self, job: StepJob) -> None:
        outcome = execute(job)
        with self._lock:
            self._running -= 1
            if job.isolated:
                self._alone = False
            self._start_what_may()
        self._done(outcome)
