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

`chain` runs the attempts a fresh batch starts before its transaction commits. If that
commit aborts, the runner keeps what those attempts did (`StepRunner.keep`): the batch,
redone, schedules the same attempts again, and they get the kept outcomes instead of
running their bodies a second time.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runstream.engine import payload
from runstream.engine.interceptors import Interceptor, StepBody, StepBodyInput
from runstream.engine.interceptors import chain as wrapped
from runstream.engine.steps import StepContext
from runstream.engine.work import Attempt, Batch, StepJob, StepOutcome
from runstream.errors import StepTimeout, TerminalStepError

log = logging.getLogger("runstream.steps")


def execute(
    job: StepJob, context: StepContext | None = None, interceptors: Sequence[Interceptor] = ()
) -> StepOutcome:
    """Run one attempt of a step and say how it went. Never raises. A step that takes a
    `StepContext` gets ``context`` (or one that only keeps the details). ``interceptors``'
    step-body links wrap the body (`runstream.interceptors.StepBody`)."""
    started = time.monotonic()
    step = job.step
    kwargs: dict[str, Any] = {}
    if step.context_param is not None:
        kwargs[step.context_param] = context or StepContext(job.run_id, job.seq, job.attempt)
    try:
        if interceptors:
            last: StepBody = _Body(job, kwargs)
            body = wrapped(interceptors, last, lambda i, n: i.step_body(n))
            group = step.policy.group
            attempt = StepBodyInput(
                job.run_id, job.seq, job.attempt, step.name, job.args, job.headers, group
            )
            result = body.execute(attempt)
        else:
            result = _body(job, job.args, kwargs)
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
            isolated=job.isolated,
        )
    return StepOutcome(
        job.partition,
        job.run_id,
        job.seq,
        job.attempt,
        True,
        output,
        duration_ms=_ms_since(started),
        isolated=job.isolated,
    )


class _Body(StepBody):
    """The last step-body link: the body itself."""

    def __init__(self, job: StepJob, kwargs: dict[str, Any]) -> None:
        self._job, self._kwargs = job, kwargs

    def execute(self, input: StepBodyInput) -> Any:
        return _body(self._job, input.args, self._kwargs)


def _body(job: StepJob, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    step, timeout = job.step, job.step.policy.timeout
    if step.is_async:
        return asyncio.run(_bounded(step.fn(*args, **kwargs), timeout, step.name))
    if timeout is not None:
        return _call_with_timeout(job, timeout, args, kwargs)
    return step.fn(*args, **kwargs)


async def _bounded(coro: Any, timeout: float | None, name: str) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        raise StepTimeout(f"step {name!r} ran longer than its timeout of {timeout:g}s") from None


def _call_with_timeout(
    job: StepJob, timeout: float, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run a sync step on a thread of its own and stop waiting for it at ``timeout``."""
    box: dict[str, Any] = {}
    late = threading.Event()  # set once the attempt has been given up
    context = contextvars.copy_context()  # an interceptor's current span, say

    def body() -> None:
        try:
            box["result"] = context.run(job.step.fn, *args, **kwargs)
        except BaseException as exc:
            box["error"] = exc
        if late.is_set():
            log.warning(
                "step %r of run %s (attempt %d) ended after its %gs timeout; its result is ignored",
                job.step.name,
                job.run_id,
                job.attempt,
                timeout,
                extra={"run_id": job.run_id},
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

    def __init__(
        self,
        concurrency: int,
        done: Callable[[StepOutcome], None],
        interceptors: Sequence[Interceptor] = (),
    ) -> None:
        self._interceptors = interceptors
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="step")
        self._concurrency = concurrency
        self._done = done
        self._lock = threading.Lock()
        self._queued: deque[StepJob] = deque()
        self._isolated: deque[StepJob] = deque()
        self._running = 0
        self._began: dict[Attempt, int] = {}  # attempts running now -> their partition
        self._alone = False  # an isolated attempt is running
        self._closed = False
        self._hold = False
        # attempts that ran ahead of an aborted commit: their outcome (None: not yet
        # known), and those of them scheduled again, whose outcome is due on arrival
        self._kept: dict[Attempt, tuple[int, StepOutcome | None]] = {}
        self._due: set[Attempt] = set()

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
    def isolating(self) -> bool:
        """An attempt runs alone, or waits to (`StepJob.isolated`)."""
        with self._lock:
            return self._alone or bool(self._isolated)

    @property
    def running(self) -> int:
        """Attempts running now."""
        with self._lock:
            return self._running

    def began(self, partitions: set[int]) -> set[Attempt]:
        """The attempts of ``partitions`` running now."""
        with self._lock:
            return {key for key, p in self._began.items() if p in partitions}

    @property
    def in_flight(self) -> int:
        """Attempts queued or running."""
        with self._lock:
            return self._running + len(self._queued) + len(self._isolated)

    def submit(self, jobs: Iterable[StepJob]) -> None:
        known: list[StepOutcome] = []
        jobs = list(jobs)  # before the lock: a generator may ask the runner (ran_ahead)
        with self._lock:
            for job in jobs:
                if job.key in self._kept:  # it ran ahead of an aborted commit
                    outcome = self._kept[job.key][1]
                    if outcome is None:
                        self._due.add(job.key)
                    else:
                        del self._kept[job.key]
                        known.append(outcome)
                else:
                    (self._isolated if job.isolated else self._queued).append(job)
            self._start_what_may()
        for outcome in known:
            self._done(outcome)

    def keep(self, jobs: Iterable[StepJob], outcomes: Iterable[StepOutcome]) -> None:
        """``jobs`` ran (or run) ahead of a commit that aborted, and ``outcomes`` are those
        of them that ended: keep them for when the redone batch schedules them again.
        The ones still running keep theirs when they end; the ones still queued are
        dropped (the instance may be a zombie now: the redone batch starts them anew)."""
        with self._lock:
            keys = {job.key for job in jobs}
            queued = {j.key for q in (self._queued, self._isolated) for j in q if j.key in keys}
            for q in (self._queued, self._isolated):
                kept = [j for j in q if j.key not in queued]
                q.clear()
                q.extend(kept)
            for job in jobs:
                if job.key not in queued:
                    self._kept[job.key] = (job.partition, None)
            for outcome in outcomes:
                self._kept[outcome.key] = (outcome.partition, outcome)

    def drop_queued(self, partitions: set[int]) -> int:
        """Drop the attempts of ``partitions`` that are queued, not begun; how many."""
        with self._lock:
            return self._drop_queued(partitions)

    def _drop_queued(self, partitions: set[int]) -> int:  # under the lock
        before = len(self._queued) + len(self._isolated)
        for q in (self._queued, self._isolated):
            kept = [j for j in q if j.partition not in partitions]
            q.clear()
            q.extend(kept)
        return before - len(self._queued) - len(self._isolated)

    def ran_ahead(self, key: Attempt) -> bool:
        """The attempt ran (or runs) ahead of a commit that aborted (see `keep`)."""
        with self._lock:
            return key in self._kept

    def forget(self, partitions: set[int]) -> int:
        """Drop the queued (not yet started) and kept attempts of ``partitions``; how many
        queued ones."""
        with self._lock:
            for key in [k for k, (p, _) in self._kept.items() if p in partitions]:
                del self._kept[key]
                self._due.discard(key)
            return self._drop_queued(partitions)

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
        self._began[job.key] = job.partition
        self._pool.submit(self._run, job)

    def _run(self, job: StepJob) -> None:
        outcome = execute(job, None, self._interceptors)
        with self._lock:
            deliver = True
            if job.key in self._kept:  # ran ahead of an aborted commit
                if job.key not in self._due:
                    self._kept[job.key] = (job.partition, outcome)
                    deliver = False  # until the redone batch schedules it again
                else:
                    del self._kept[job.key]
                    self._due.discard(job.key)
        # Deliver before the attempt counts as ended: whoever then sees the runner idle (the
        # shell, about to start the next recovery alone) has this outcome in hand, so both
        # never commit apart.
        if deliver:
            self._done(outcome)
        with self._lock:
            self._running -= 1
            self._began.pop(job.key, None)
            if job.isolated:
                self._alone = False
            self._start_what_may()


def chain(
    b: Batch,
    decide: Callable[[StepOutcome], str | None],
    runner: StepRunner,
    outcomes: queue.SimpleQueue[StepOutcome],
    careful: set[str],
    budget: float,
    started: dict[Attempt, StepJob],
    decided: list[StepOutcome],
) -> None:
    """Run the steps batch ``b`` starts now, before its transaction commits, and decide
    their outcomes into it as they come, for up to ``budget`` seconds: a chain of quick
    local steps, and the run's end, then commit in one transaction, not one per step.

    Safe because nothing of it counts until the commit: a crash before it leaves no trace
    and the steps run again (at least once, as always). A step that takes its process down
    this way is caught on the next try, which is careful: runs touched by work a former
    process may have seen (``careful``: old commands, timers, recoveries) and recoveries
    themselves never run ahead of their commit. Once ``budget`` is spent (also by a
    process that stood still meanwhile) nothing more starts ahead. Fills in the attempts
    started here (``started``) and the outcomes decided here (``decided``), also when a
    decision raises: if the commit aborts, the shell keeps the first and requeues the
    others.
    """

    def launch(since: int = 0) -> set[Attempt]:
        jobs = [
            j
            for j in b.effects.steps[since:]
            if j.key not in started and not j.isolated and j.run_id not in careful
        ]
        started.update((j.key, j) for j in jobs)
        runner.submit(jobs)
        return {j.key for j in jobs}

    if runner.hold:  # recoveries are waiting: nothing may start now
        return
    deadline = time.monotonic() + budget
    waiting = launch()
    while waiting:
        try:
            outcome = outcomes.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        decided.append(outcome)
        waiting.discard(outcome.key)
        known = len(b.effects.steps)  # a decision only appends (or undoes its own)
        run_id = decide(outcome)
        if outcome.isolated and run_id:
            careful.add(run_id)  # a recovered run goes on one committed step at a time
        if time.monotonic() < deadline:  # past it (the process may have stood still) the
            waiting |= launch(min(known, len(b.effects.steps)))  # steps wait for the commit
