"""The update handlers of one run's `Context`: registered by the workflow's code, started
where the workflow waited when their update was accepted, and driven with seqs of their
own (`update_seq`), so they never shift the workflow's. `rules.updates` decides whether an
update is taken (its validator runs here); this runs the handlers' code.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runstream.engine import payload
from runstream.engine.interceptors import UpdateInput
from runstream.engine.requests import (
    Abort,
    Blocked,
    Completed,
    Failed,
    NonDeterministic,
    Outcome,
    Overrun,
    Suspend,
    close_coroutine,
)
from runstream.errors import NonDeterminismError
from runstream.schemas.records import UPDATE_SEQ_SPAN, UpdateAccepted, update_seq

if TYPE_CHECKING:
    from runstream.engine.workflow_context import Context


@dataclass(frozen=True, slots=True)
class UpdateHandler:
    """An update handler the workflow registered (`Context.update_handler`)."""

    name: str
    fn: Callable[[Any], Awaitable[Any]]
    validator: Callable[[Any], Any] | None


class HandlerRun:
    """An accepted update's handler coroutine and the operations it took so far."""

    __slots__ = ("accepted", "coro", "n", "outcome")

    def __init__(self, accepted: UpdateAccepted) -> None:
        self.accepted = accepted
        self.coro: Coroutine[Any, Any, Any] | None = None
        self.n = 0  # operations taken
        self.outcome: Outcome | None = None


class UpdateHandlers:
    """The handlers of ``ctx``'s run: those registered, those started, the one running."""

    __slots__ = ("_ctx", "current", "points", "registered", "runs", "validating")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.registered: dict[str, UpdateHandler] = {}
        self.runs: dict[str, HandlerRun] = {}  # by update id, started
        self.current: HandlerRun | None = None  # the handler running now (its seqs)
        # Where the workflow's code is: its operations and promise awaits so far. An update
        # accepted while it waits is anchored there (`start`).
        self.points = 0
        self.validating = False

    def peek(self) -> int:
        """The seq the running handler's next operation will take."""
        assert self.current is not None
        return update_seq(self.current.accepted.index, self.current.n + 1)

    def next(self) -> int:
        """The seq of the running handler's next operation, taken."""
        h = self.current
        assert h is not None
        h.n += 1
        if h.n >= UPDATE_SEQ_SPAN:
            raise RuntimeError(f"an update handler may do {UPDATE_SEQ_SPAN - 1} operations")
        return update_seq(h.accepted.index, h.n)

    def point(self) -> None:
        """The workflow's code reached its next point (where it may wait)."""
        self.points += 1
        if self._ctx._state.updates:
            self.start()

    def start(self) -> None:
        """Start the handlers of the updates accepted at or before the workflow's point
        now. An update is accepted while the workflow waits at its point ``anchor`` (an
        operation, or a promise's await); a replay starts its handler once the code gets
        there again, before it sees what it waits for: what the handler changes before
        its first await, the workflow's code sees at the same point every time."""
        for uid, accepted in self._ctx._state.updates.items():
            if accepted.anchor > self.points or uid in self.runs:
                continue
            h = self.runs[uid] = HandlerRun(accepted)
            if accepted.name not in self.registered:
                err = NonDeterminismError(
                    self._ctx.run_id, accepted.anchor, f"update {accepted.name}", "no such handler"
                )
                raise Abort(NonDeterministic(err))
            self._drive(h, accepted.arg)

    def resume(self) -> None:
        """Resume the handlers that wait, after the workflow's code suspended or ended."""
        for h in list(self.runs.values()):
            if isinstance(h.outcome, Blocked):
                self._drive(h)

    def _drive(self, h: HandlerRun, arg: bytes | None = None) -> None:
        """Run handler ``h`` (started with ``arg``, the first time) until it waits or ends:
        its outcome."""
        ctx = self._ctx
        prev, self.current = self.current, h
        try:
            if arg is not None:  # through the inbound links to the handler
                a = h.accepted
                settled = ctx._settled  # an earlier activation started it, or it ended
                again = settled.everything or a.update_id in settled.accepted
                again = again or a.update_id in ctx._state.update_results
                start = UpdateInput(
                    ctx.run_id, a.update_id, a.name, payload.loads(arg), ctx.headers, again,
                    ctx._state.retries + 1,
                )  # fmt: skip
                h.coro = ctx._inbound.update(start)
            if h.coro is None:
                return
            yielded = h.coro.send(None)
        except StopIteration as stop:
            h.coro, h.outcome = None, Completed(stop.value)
        except Abort as abort:
            h.coro = None
            if isinstance(abort.outcome, NonDeterministic):
                raise
            h.outcome = Failed("RuntimeError: an update handler may not continue as new", "")
        except Overrun:
            raise
        except BaseException as exc:  # user code, as in `_Live._step`
            h.coro = None
            h.outcome = Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
        else:
            if isinstance(yielded, Suspend):
                h.outcome = Blocked(yielded.request)
            else:
                close_coroutine(h.coro)
                h.coro = None
                h.outcome = Failed("TypeError: an update handler may only await Runstream "
                                   f"operations, not {yielded!r}", "")  # fmt: skip
        finally:
            self.current = prev

    def open(self) -> list[tuple[UpdateAccepted, Outcome]]:
        """The handlers whose update has no outcome in the history yet, and theirs now."""
        done = self._ctx._state.update_results
        return [
            (h.accepted, h.outcome)
            for uid, h in self.runs.items()
            if h.outcome is not None and uid not in done
        ]

    def validate(self, handler: UpdateHandler, arg: Any) -> None:
        """Run ``handler``'s validator on the workflow's state now; it raises to reject."""
        if handler.validator is None:
            return
        self.validating = True
        try:
            if isinstance(result := handler.validator(arg), Coroutine):
                result.close()
                raise TypeError("an update validator must be a plain function, not async")
        finally:
            self.validating = False

    def close(self) -> None:
        """Close the handlers' coroutines (their finally blocks run)."""
        for h in self.runs.values():
            coro, h.coro = h.coro, None
            close_coroutine(coro)
