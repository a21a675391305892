"""A run's state, folded from its journal facts by `reducer.apply`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Statuses a run can be in. "Terminal" runs never change again.
RUNNING = "running"
COMPENSATING = "compensating"
PARKED = "parked"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
DEAD = "dead"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, DEAD})


class Fact(NamedTuple):
    """One journal record: its Avro type name and its fields."""

    name: str
    rec: dict[str, Any]


@dataclass(slots=True)
class RunState:
    """Everything the engine knows about one run.

    ``resolved`` maps a sequence number to the fact that settled it (StepCompleted,
    a final StepFailed, TimerFired, SignalReceived, SignalTimedOut, ValueRecorded);
    ``pending`` maps it to the fact of an operation still open (StepStarted, a
    StepFailed awaiting its retry, TimerScheduled, SignalAwaited).
    """

    run_id: str
    workflow: str = ""
    version: str = ""
    input: bytes = b"null"
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    status: str = RUNNING
    started_at_ms: int = 0
    ended_at_ms: int | None = None
    resolved: dict[int, Fact] = field(default_factory=dict)
    pending: dict[int, Fact] = field(default_factory=dict)
    signals: list[dict[str, Any]] = field(default_factory=list)  # buffered, not yet consumed
    signal_ids: set[str] = field(default_factory=set)  # every signal id seen: dedupe
    recoveries: int = 0
    compensation: dict[str, Any] | None = None  # CompensationStarted fields while compensating
    output: bytes | None = None
    error: str | None = None
    reason: str | None = None
    continued_as: str | None = None
    facts: int = 0  # facts applied: the next fact's index in the projection
    steps: int = 0  # StepCompleted facts

    @property
    def exists(self) -> bool:
        return self.facts > 0

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def copy(self) -> RunState:
        """A copy whose containers can change without touching this one."""
        return RunState(
            self.run_id,
            self.workflow,
            self.version,
            self.input,
            self.parent_run_id,
            self.tags,
            self.status,
            self.started_at_ms,
            self.ended_at_ms,
            dict(self.resolved),
            dict(self.pending),
            list(self.signals),
            set(self.signal_ids),
            self.recoveries,
            self.compensation,
            self.output,
            self.error,
            self.reason,
            self.continued_as,
            self.facts,
            self.steps,
        )

    def timers(self) -> list[tuple[int, int]]:
        """(due_ms, seq) of every open operation that waits for a time."""
        out = []
        for seq, fact in self.pending.items():
            due = (
                fact.rec.get("due_ms")
                or fact.rec.get("retry_at_ms")
                or fact.rec.get("timeout_at_ms")
            )
            if due is not None:
                out.append((due, seq))
        return out

    def running_steps(self) -> list[int]:
        """Sequence numbers of steps started with no recorded outcome yet."""
        return [s for s, f in self.pending.items() if f.name == "StepStarted"]
