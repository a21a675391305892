"""`apply(state, fact)`: the only place a run's state changes.

No clock, no I/O, no randomness: replaying a run's journal facts in order
always gives the same state, which is what restore and rebuild rely on.
"""

from __future__ import annotations

from runstream.engine.state import (
    CANCELLED,
    COMPENSATING,
    COMPLETED,
    DEAD,
    FAILED,
    PARKED,
    RUNNING,
    Fact,
    RunState,
)


class UnknownFactError(ValueError):
    """A fact type the reducer has no rule for: never skipped silently."""


def apply(state: RunState, fact: Fact) -> RunState:
    """Fold ``fact`` into ``state`` (in place) and return it."""
    name, r = fact
    state.facts += 1
    if state.status == PARKED and name not in _KEEPS_PARKED:
        state.status, state.reason = RUNNING, None  # the run made progress again
    if name in _OPEN:
        state.pending[r["seq"]] = fact
    elif name in _SETTLE:
        seq = r["seq"]
        state.pending.pop(seq, None)
        state.resolved[seq] = fact
        if name == "StepCompleted":
            state.steps += 1
        elif name == "SignalReceived":
            _consume_buffered(state, r["signal_id"])
    elif name == "StepFailed":
        seq = r["seq"]
        if r["retry_at_ms"] is None:  # final: the workflow sees the error
            state.pending.pop(seq, None)
            state.resolved[seq] = fact
        else:
            state.pending[seq] = fact
    elif name == "RunStarted":
        state.workflow, state.version, state.input = r["workflow"], r["version"], r["input"]
        state.parent_run_id, state.tags = r["parent_run_id"], dict(r["tags"])
        state.started_at_ms, state.status = r["at_ms"], RUNNING
    elif name == "SignalBuffered":
        state.signals.append(r)
        state.signal_ids.add(r["signal_id"])
    elif name == "RunRecovered":
        state.recoveries = r["recoveries"]
    elif name == "CompensationStarted":
        state.compensation, state.status = r, COMPENSATING
    elif name == "RunParked":
        state.status, state.reason = PARKED, r["reason"]
    elif name in _END:
        state.status, state.ended_at_ms = _END[name], r["at_ms"]
        state.pending.clear()
        if name == "RunCompleted":
            state.output, state.continued_as = r["output"], r["continued_as"]
        elif name == "RunFailed":
            state.error = r["error"]
        else:
            state.reason = r["reason"]
    else:
        raise UnknownFactError(name)
    return state


def fold(run_id: str, facts: list[Fact]) -> RunState:
    state = RunState(run_id)
    for fact in facts:
        apply(state, fact)
    return state


def _consume_buffered(state: RunState, signal_id: str) -> None:
    state.signal_ids.add(signal_id)
    for i, sig in enumerate(state.signals):
        if sig["signal_id"] == signal_id:
            del state.signals[i]
            return


_OPEN = frozenset({"StepStarted", "TimerScheduled", "SignalAwaited"})
_SETTLE = frozenset(
    {"StepCompleted", "TimerFired", "SignalReceived", "SignalTimedOut", "ValueRecorded"}
)
_KEEPS_PARKED = frozenset({"RunParked", "SignalBuffered"})
_END = {"RunCompleted": COMPLETED, "RunFailed": FAILED, "RunCancelled": CANCELLED, "RunDead": DEAD}
