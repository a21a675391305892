"""Run workflow code against a run's recorded facts.

Each durable call on the `Context` takes the next sequence number. If the history
settled that number, the call returns the recorded result without doing anything;
the first call without a recorded result suspends the workflow by yielding a
request out of the coroutine, which the driver then closes. Nothing is cached
between replays: correctness never depends on keeping coroutines alive.
"""

from __future__ import annotations

import contextlib
import os
import random as _random
import traceback
import uuid as _uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runstream.engine import payload
from runstream.engine.state import Fact, RunState
from runstream.engine.workflow import Registry, StepDef, WorkflowDef, seconds
from runstream.errors import NonDeterminismError, SignalTimeout, StepError


# What a suspended workflow waits for.
@dataclass(frozen=True, slots=True)
class StepCall:
    seq: int
    step: StepDef
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class SleepCall:
    seq: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SignalWait:
    seq: int
    name: str
    timeout: float | None


# How one replay ended.
@dataclass(frozen=True, slots=True)
class Completed:
    output: Any


@dataclass(frozen=True, slots=True)
class Failed:
    error: str
    traceback: str


@dataclass(frozen=True, slots=True)
class ContinuedAsNew:
    input: Any


@dataclass(frozen=True, slots=True)
class Blocked:
    request: StepCall | SleepCall | SignalWait


@dataclass(frozen=True, slots=True)
class NonDeterministic:
    error: NonDeterminismError


Outcome = Completed | Failed | ContinuedAsNew | Blocked | NonDeterministic


@dataclass(slots=True)
class Replay:
    outcome: Outcome
    new_facts: list[Fact] = field(default_factory=list)  # recorded values (now, uuid, random)
    compensations: list[tuple[StepDef, tuple[Any, ...]]] = field(default_factory=list)


class _Abort(BaseException):
    """Unwinds user code; a BaseException so `except Exception` in workflows can't swallow it."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


class _Suspend:
    __slots__ = ("request",)

    def __init__(self, request: StepCall | SleepCall | SignalWait) -> None:
        self.request = request

    def __await__(self) -> Generator[_Suspend, None, Any]:
        yield self
        raise RuntimeError("a suspended workflow cannot be resumed")  # the driver closes it


# The kind and name each fact records for its sequence number: what the code must ask for.
_KIND = {
    "StepStarted": "step",
    "StepCompleted": "step",
    "StepFailed": "step",
    "TimerScheduled": "sleep",
    "TimerFired": "sleep",
    "SignalAwaited": "signal",
    "SignalReceived": "signal",
    "SignalTimedOut": "signal",
    "ValueRecorded": "value",
}


def _op(fact: Fact) -> str:
    kind = _KIND[fact.name]
    return f"{kind} {fact.rec.get('name', '')}".rstrip() if kind != "sleep" else "sleep"


class Context:
    """What a workflow gets as its first argument."""

    def __init__(self, state: RunState, registry: Registry, now_ms: int) -> None:
        self.run_id = state.run_id
        self.workflow = state.workflow
        self.version = state.version
        self._state = state
        self._registry = registry
        self._now_ms = now_ms
        self._seq = 0
        self._new: list[Fact] = []
        self._compensations: list[tuple[StepDef, tuple[Any, ...]]] = []

    # -- durable operations ------------------------------------------------------
    async def step(
        self, fn: Callable[..., Any], *args: Any, compensate: Callable[..., Any] | None = None
    ) -> Any:
        """Run ``fn(*args)`` once, durably; on replay return its recorded result.

        ``compensate`` (called with the same arguments) is registered once the step
        succeeds, and runs if the workflow later fails or is cancelled with compensation.
        """
        sd = self._registry.step(fn)
        seq = self._next()
        fact = self._recorded(seq, "step " + sd.name)
        if (
            fact is None
            or fact.name == "StepStarted"
            or (fact.name == "StepFailed" and fact.rec["retry_at_ms"] is not None)
        ):
            await _Suspend(StepCall(seq, sd, args))
        assert fact is not None
        if fact.name == "StepFailed":
            raise StepError(sd.name, fact.rec["error"])
        if compensate is not None:
            self._compensations.append((self._registry.step(compensate), args))
        value = payload.loads(fact.rec["output"])
        return sd.output.validate_python(value) if sd.output is not None else value

    async def sleep(self, duration: float | int | str) -> None:
        """Sleep durably: seconds, or a string such as "5s", "10m", "1d"."""
        secs = seconds(duration)
        seq = self._next()
        fact = self._recorded(seq, "sleep")
        if fact is None or fact.name != "TimerFired":
            await _Suspend(SleepCall(seq, secs))

    async def wait_for_signal(self, name: str, timeout: float | int | str | None = None) -> Any:
        """The payload of the next signal ``name`` sent to this run (buffered if it came
        earlier). Raises `SignalTimeout` when ``timeout`` passes first."""
        secs = None if timeout is None else seconds(timeout)
        seq = self._next()
        fact = self._recorded(seq, "signal " + name)
        if fact is None or fact.name == "SignalAwaited":
            await _Suspend(SignalWait(seq, name, secs))
        assert fact is not None
        if fact.name == "SignalTimedOut":
            raise SignalTimeout(f"no signal {name!r} for run {self.run_id!r} within {timeout}")
        return payload.loads(fact.rec["payload"])

    def now(self) -> datetime:
        """The time, recorded on first execution so replays see the same value."""
        return datetime.fromtimestamp(self._value("now", lambda: self._now_ms) / 1000, UTC)

    def uuid(self) -> str:
        return self._value("uuid", lambda: str(_uuid.uuid4()))

    def random(self) -> float:
        return self._value("random", lambda: _random.Random(os.urandom(16)).random())

    def continue_as_new(self, input: Any = None) -> None:
        """End this run and start ``<run_id>~N`` with ``input`` and a fresh history."""
        raise _Abort(ContinuedAsNew(input))

    # -- internals ---------------------------------------------------------------
    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _recorded(self, seq: int, op: str) -> Fact | None:
        fact = self._state.resolved.get(seq) or self._state.pending.get(seq)
        if fact is None:
            for new in self._new:  # values recorded earlier in this same replay
                if new.rec["seq"] == seq:
                    fact = new
        if fact is not None and _op(fact) != op:
            raise _Abort(NonDeterministic(NonDeterminismError(self.run_id, seq, _op(fact), op)))
        return fact

    def _value(self, name: str, make: Callable[[], Any]) -> Any:
        seq = self._next()
        fact = self._recorded(seq, "value " + name)
        if fact is None:
            fact = Fact(
                "ValueRecorded",
                {
                    "run_id": self.run_id,
                    "at_ms": self._now_ms,
                    "seq": seq,
                    "name": name,
                    "value": payload.dumps(make()),
                },
            )
            self._new.append(fact)
        return payload.loads(fact.rec["value"])


def replay(wf: WorkflowDef, state: RunState, registry: Registry, now_ms: int) -> Replay:
    """Run ``wf`` against ``state``'s history until it ends or suspends."""
    ctx = Context(state, registry, now_ms)
    try:
        if wf.fn.__code__.co_argcount >= 2:
            coro = wf.fn(ctx, wf.parse_input(payload.loads(state.input)))
        else:
            coro = wf.fn(ctx)
        yielded = coro.send(None)
    except StopIteration as stop:
        outcome: Outcome = _check_nothing_left(state, ctx) or Completed(stop.value)
    except _Abort as abort:
        outcome = abort.outcome
    except Exception as exc:
        outcome = Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    else:
        with contextlib.suppress(RuntimeError):  # it awaited in a finally block: let it be
            coro.close()
        if isinstance(yielded, _Suspend):
            outcome = Blocked(yielded.request)
        else:
            outcome = Failed(
                "TypeError: a workflow may only await Runstream operations "
                f"(ctx.step, ctx.sleep, ctx.wait_for_signal), not {yielded!r}",
                "",
            )
    return Replay(outcome, ctx._new, ctx._compensations)


def _check_nothing_left(state: RunState, ctx: Context) -> NonDeterministic | None:
    """A workflow that finishes before reaching recorded operations no longer fits."""
    extra = [s for s in (*state.resolved, *state.pending) if s > ctx._seq]
    if not extra:
        return None
    seq = min(extra)
    fact = state.resolved.get(seq) or state.pending[seq]
    return NonDeterministic(NonDeterminismError(state.run_id, seq, _op(fact), "the end"))
