"""Run workflow code against a run's recorded facts.

The workflow's `Context` (`engine.workflow_context`) answers each durable call from the
history, or suspends the code with a request (`engine.requests`). `replay` runs the code
from the start and closes it; `Replayer` keeps suspended coroutines of recently active
runs and resumes them once the history settles what they wait for, so a step costs the
same however long the history is. Correctness never depends on that cache: a miss
replays from the start.

Whatever the workflow code raises, `replay` returns an outcome: user code cannot
take the engine down, not even with ``SystemExit`` or ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import traceback
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from runstream.engine import payload
from runstream.engine.interceptors import (
    ActivationInput,
    ExecuteInput,
    QueryInput,
    SignalInput,
    UpdateInput,
    WorkflowInbound,
    chain,
)
from runstream.engine.limits import Limits
from runstream.engine.requests import (
    Abort,
    Blocked,
    Completed,
    Failed,
    NonDeterministic,
    Outcome,
    Overran,
    Overrun,
    Replay,
    Suspend,
    close_coroutine,
    recorded_op,
)
from runstream.engine.settled import ALL_SETTLED, Settled
from runstream.engine.state import RunState
from runstream.engine.workflow import Registry, WorkflowDef
from runstream.engine.workflow_context import Context
from runstream.errors import NonDeterminismError, QueryFailed
from runstream.schemas.records import UPDATE_SEQ_BASE

log = logging.getLogger("runstream.engine")


class _Inbound(WorkflowInbound):
    """The last inbound link: the workflow code itself."""

    def __init__(self, live: _Live) -> None:
        self._live = live

    async def execute(self, input: ExecuteInput) -> Any:
        return await self._live.wf.call(self._live.ctx, input.input)

    def activate(self, input: ActivationInput) -> Outcome:
        self._live.outcome = self._live._step()
        return self._live.outcome

    def signal(self, input: SignalInput) -> Any:
        return input.payload

    async def update(self, input: UpdateInput) -> Any:
        result = self._live.ctx._updates.registered[input.name].fn(input.arg)
        return await result if isinstance(result, Coroutine) else result  # or a plain value

    def query(self, input: QueryInput) -> Any:
        fn = self._live.ctx._queries[input.name]
        return fn(input.arg) if inspect.signature(fn).parameters else fn()


def replay(
    wf: WorkflowDef,
    state: RunState,
    registry: Registry,
    now_ms: int,
    guard: AbstractContextManager[None] | None = None,
    settled: Settled = ALL_SETTLED,
) -> Replay:
    """Run ``wf`` against ``state``'s history from the start until it ends or suspends,
    then close it. Never raises. ``guard`` brackets the workflow code (the shell's time
    budget, `runtime.budget`). ``settled``: the highest seq settled before this
    activation (the interceptors' ``is_replaying`` up to it)."""
    live = _Live(wf, Context(state, registry, now_ms))
    result = live.run(state, now_ms, guard, settled)
    live.close()
    return result


def query(
    wf: WorkflowDef,
    state: RunState,
    registry: Registry,
    now_ms: int,
    name: str,
    arg: Any,
    guard: Callable[[], AbstractContextManager[None]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """What the workflow's query handler ``name`` returns for ``arg``, on the workflow
    replayed to ``state`` (from the start, never the `Replayer`'s cached coroutine, which
    a query must not move; what the replay would record is dropped). ``guard`` gives a
    bracket for each run of user code (the shell's time budget). The inbound
    interceptors see the run's headers with the caller's ``headers`` over them. Raises
    `QueryFailed`."""
    guard = guard or contextlib.nullcontext
    live = _Live(wf, Context(state, registry, now_ms))
    try:
        outcome = live.run(state, now_ms, guard()).outcome
        if isinstance(outcome, NonDeterministic):
            raise QueryFailed(f"the run no longer fits the workflow's code: {outcome.error}")
        if isinstance(outcome, Overran):
            raise QueryFailed("the workflow's code ran past its time budget while replaying")
        ctx = live.ctx
        fn = ctx._queries.get(name)
        if fn is None:
            known = ", ".join(repr(q) for q in sorted(ctx._queries)) or "none"
            raise QueryFailed(
                f"run {state.run_id!r} has no query handler {name!r} (its handlers: {known})"
            )
        ctx._querying = True
        try:
            with guard():
                seen = {**ctx.headers, **(headers or {})}
                return ctx._inbound.query(QueryInput(state.run_id, name, arg, seen))
        except Overrun:
            raise QueryFailed(f"query {name!r} ran past its time budget") from None
        except BaseException as exc:  # user code, as in `replay`
            raise QueryFailed(f"query {name!r} raised {type(exc).__name__}: {exc}") from None
    finally:
        live.close()


class Replayer:
    """Replays runs, resuming the suspended coroutines of up to ``size`` recent runs.

    A coroutine is resumed only for the state it suspended in, or a later one of the same
    history; the shell calls `forget` for runs whose uncommitted facts it drops (an
    aborted transaction, a revoked partition), so a coroutine is never ahead of its run.
    """

    def __init__(self, registry: Registry, size: int = 1024, limits: Limits | None = None) -> None:
        self.registry, self.size, self.limits = registry, size, limits
        self._live: OrderedDict[str, _Live] = OrderedDict()

    def replay(
        self,
        wf: WorkflowDef,
        state: RunState,
        now_ms: int,
        guard: AbstractContextManager[None] | None = None,
        settled: Settled = ALL_SETTLED,
    ) -> Replay:
        """As `replay`, resuming the run's coroutine when it fits ``state``."""
        live = self._live.pop(state.run_id, None)
        # A retry since it suspended reopened steps it saw fail: start again from scratch.
        if (
            live is None
            or live.wf is not wf
            or state.facts < live.facts
            or live.retries != state.retries
        ):
            if live is not None:
                live.close()
            live = _Live(wf, Context(state, self.registry, now_ms, self.limits), state.retries)
        result = live.run(state, now_ms, guard, settled)
        if isinstance(result.outcome, Blocked):
            live.facts = state.facts + len(result.new_facts)
            self._live[state.run_id] = live
            if len(self._live) > self.size:
                self._live.popitem(last=False)[1].close()
        else:
            live.close()
        return result

    @contextlib.contextmanager
    def context(
        self,
        wf: WorkflowDef,
        state: RunState,
        now_ms: int,
        guard: Callable[[], AbstractContextManager[None]],
        settled: Settled = ALL_SETTLED,
    ) -> Generator[Context | None, None, None]:
        """The context of the run's workflow where it waits now, its update handlers
        registered (None unless it waits with nothing left to record); ``guard`` gives
        each replay's bracket. A run this cache does not keep (size 0) is replayed on
        its own, and closed after."""
        result = self.replay(wf, state, now_ms, guard(), settled)
        live, own = self._live.get(state.run_id), None
        if live is None and isinstance(result.outcome, Blocked):
            own = live = _Live(wf, Context(state, self.registry, now_ms), state.retries)
            result = live.run(state, now_ms, guard())  # thrown away: a replay to the end
        try:
            ok = live is not None and not result.new_facts and isinstance(result.outcome, Blocked)
            yield live.ctx if ok and live is not None else None
        finally:
            if own is not None:
                own.close()

    def forget(self, run_ids: Iterable[str]) -> None:
        """Drop the coroutines of these runs (their state went back)."""
        for run_id in run_ids:
            live = self._live.pop(run_id, None)
            if live is not None:
                live.close()


class _Live:
    """A workflow's coroutine and context, started or suspended."""

    __slots__ = ("coro", "ctx", "facts", "inbound", "outcome", "retries", "wf")

    def __init__(self, wf: WorkflowDef, ctx: Context, retries: int = 0) -> None:
        self.wf, self.ctx = wf, ctx
        self.coro: Coroutine[Any, Any, Any] | None = None
        self.facts = 0  # the run's facts when it suspended, its own new ones included
        self.retries = retries  # the run's RunRetried facts when it started
        interceptors = ctx._registry.interceptors
        last: WorkflowInbound = _Inbound(self)
        self.inbound = chain(interceptors, last, lambda i, n: i.workflow_inbound(n))
        ctx._inbound = self.inbound
        self.outcome: Outcome | None = None  # what the code did in this activation

    def run(
        self,
        state: RunState,
        now_ms: int,
        guard: AbstractContextManager[None] | None,
        settled: Settled = ALL_SETTLED,
    ) -> Replay:
        ctx = self.ctx
        ctx._state, ctx._now_ms, ctx._new = state, now_ms, []
        ctx._settled = settled
        replaying = self.coro is None and settled.began  # from the start, and not the first
        act = ActivationInput(
            state.run_id,
            state.workflow,
            state.version,
            ctx.headers,
            now_ms,
            replaying,
            state.retries + 1,
        )
        self.outcome = None
        try:
            with guard if guard is not None else contextlib.nullcontext():
                outcome = self._activate(act)
                if ctx._updates.runs and not isinstance(outcome, NonDeterministic):
                    try:
                        ctx._updates.resume()
                    except Abort as abort:
                        outcome = abort.outcome
        except Overrun:
            self.coro = None
            outcome = Overran()
        # Code that no longer fits its history: its handlers' outcomes are not recorded.
        fits = not isinstance(outcome, NonDeterministic | Overran)
        return Replay(
            outcome, ctx._new, list(ctx._compensations), ctx._updates.open() if fits else []
        )

    def _activate(self, act: ActivationInput) -> Outcome:
        """The activation through the inbound links. A link that raises changes nothing
        of what the code did (it is logged): the code runs, once, all the same."""
        try:
            result = self.inbound.activate(act)
        except Exception:
            log.exception("an interceptor failed around an activation of run %s", act.run_id)
            return self.outcome if self.outcome is not None else self._step()
        return result if self.outcome is None else self.outcome

    def _step(self) -> Outcome:
        ctx = self.ctx
        state = ctx._state
        try:
            if self.coro is None:
                value = self.wf.parse_input(payload.loads(state.input))
                run = ExecuteInput(
                    state.run_id,
                    state.workflow,
                    state.version,
                    value,
                    ctx.headers,
                    state.started_at_ms,
                    ctx._settled.began,
                    state.retries + 1,
                )
                self.coro = self.inbound.execute(run)
            elif state.updates:  # updates accepted while it waited start here
                ctx._updates.start()
            yielded = self.coro.send(None)
        except StopIteration as stop:
            self.coro = None
            return _check_nothing_left(state, ctx) or Completed(stop.value)
        except Abort as abort:
            self.coro = None
            return abort.outcome
        except Overrun:
            raise
        except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt included
            self.coro = None
            return Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
        if isinstance(yielded, Suspend):
            return Blocked(yielded.request)
        self.close()
        return Failed(
            "TypeError: a workflow may only await Runstream operations "
            f"(ctx.step, ctx.sleep, ctx.wait_for_signal), not {yielded!r}",
            "",
        )

    def close(self) -> None:
        """Close the coroutine and its update handlers' (their finally blocks run; what
        they raise is ignored)."""
        coro, self.coro = self.coro, None
        close_coroutine(coro)
        self.ctx._updates.close()


def _check_nothing_left(state: RunState, ctx: Context) -> NonDeterministic | None:
    """A workflow that finishes before reaching recorded operations no longer fits."""
    extra = [s for s in (*state.resolved, *state.pending) if ctx._seq < s < UPDATE_SEQ_BASE]
    if not extra:
        return None
    seq = min(extra)
    fact = state.resolved.get(seq) or state.pending[seq]
    return NonDeterministic(NonDeterminismError(state.run_id, seq, recorded_op(fact), "the end"))
