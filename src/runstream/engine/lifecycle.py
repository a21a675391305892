"""The public lifecycle stream: one event per fact worth telling the outside world.

Documented in the README as a contract; fields are those of LifecycleEvent.avsc.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from runstream.engine.state import Fact, RunState


def event(fact: Fact, state: RunState) -> dict[str, Any] | None:
    """The lifecycle event for ``fact`` (already applied to ``state``), or None."""
    name, r = fact
    kind = _TYPES.get(name)
    if kind is None:
        return None
    ev: dict[str, Any] = {
        "type": kind,
        "run_id": state.run_id,
        "at_ms": r["at_ms"],
        "workflow": state.workflow,
        "version": state.version,
        "status": state.status,
        "seq": r.get("seq"),
        "step": r.get("name") if name.startswith("Step") else None,
        "attempt": r.get("attempt"),
        "duration_ms": r.get("duration_ms"),
        "output": None,
        "error": r.get("error"),
        "reason": r.get("reason"),
    }
    if name == "TimerScheduled":
        due = datetime.fromtimestamp(r["due_ms"] / 1000, UTC).isoformat(timespec="milliseconds")
        ev["reason"] = f"sleeping until {due}"
    elif name == "SignalAwaited":
        ev["reason"] = f"waiting for signal {r['name']!r}"
    elif name == "RunParked":
        ev["reason"] = r["reason"]
    elif name in ("RunCompleted", "RunFailed", "RunCancelled", "RunDead"):
        ev["duration_ms"] = r["at_ms"] - state.started_at_ms
        if name == "RunCompleted":
            ev["output"] = r["output"]
            if r["continued_as"]:
                ev["reason"] = f"continued as {r['continued_as']}"
    return ev


def rejected(run_id: str, at_ms: int, workflow: str, reason: str) -> dict[str, Any]:
    """A start that never became a run (unknown workflow, invalid input)."""
    return {
        "type": "run.rejected",
        "run_id": run_id,
        "at_ms": at_ms,
        "workflow": workflow,
        "version": "",
        "status": "rejected",
        "seq": None,
        "step": None,
        "attempt": None,
        "duration_ms": None,
        "output": None,
        "error": None,
        "reason": reason,
    }


_TYPES = {
    "RunStarted": "run.started",
    "StepStarted": "step.started",
    "StepCompleted": "step.completed",
    "StepFailed": "step.failed",
    "TimerScheduled": "run.suspended",
    "SignalAwaited": "run.suspended",
    "RunParked": "run.suspended",
    "RunCompleted": "run.completed",
    "RunFailed": "run.failed",
    "RunCancelled": "run.cancelled",
    "RunDead": "run.dead",
}
