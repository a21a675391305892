"""A tiny in-process driver of the pure core for unit tests: no Kafka, no RocksDB.

It plays the shell's part: keeps states, runs step bodies at once, fires timers on
a fake clock, and keeps every fact in one list so tests can check the journal.
"""

from __future__ import annotations

import traceback
from typing import Any

from runstream.engine import payload
from runstream.engine.decide import Decider, Effects, StepOutcome, StepTask
from runstream.engine.reducer import fold
from runstream.engine.state import Fact, RunState
from runstream.engine.workflow import Registry
from runstream.errors import TerminalStepError


class Core:
    def __init__(self, registry: Registry, max_recovery_attempts: int = 3) -> None:
        self.decider = Decider(registry, max_recovery_attempts)
        self.now = 1_000_000
        self.states: dict[str, RunState] = {}
        self.journal: list[Fact] = []
        self.lifecycle: list[dict[str, Any]] = []
        self.commands: list[tuple[str, str, dict[str, Any]]] = []
        self.dead: list[dict[str, Any]] = []
        self.queued: list[StepTask] = []
        self.auto_run_steps = True

    def state(self, run_id: str) -> RunState:
        return self.states.setdefault(run_id, RunState(run_id))

    def _do(self, fn, run_id: str, *args: Any) -> None:
        out = Effects()
        fn(self.state(run_id), *args, self.now, out)
        self._absorb(out)

    def _absorb(self, out: Effects) -> None:
        self.journal += out.facts
        self.lifecycle += out.lifecycle
        self.commands += out.commands
        self.dead += out.dead_letters
        self.queued += out.steps
        while self.auto_run_steps and self.queued:
            self.run_step(self.queued.pop(0))

    def start(self, run_id: str, workflow: str, value: Any = None, version: str | None = None):
        cmd = {
            "run_id": run_id,
            "workflow": workflow,
            "input": payload.dumps(value),
            "version": version,
            "parent_run_id": None,
            "tags": {},
        }
        self._do(self.decider.start, run_id, cmd)

    def signal(self, run_id: str, name: str, value: Any, signal_id: str = "") -> None:
        cmd = {
            "run_id": run_id,
            "name": name,
            "payload": payload.dumps(value),
            "signal_id": signal_id or f"{name}-{len(self.journal)}",
        }
        self._do(self.decider.signal, run_id, cmd)

    def cancel(self, run_id: str, compensate: bool = False) -> None:
        self._do(self.decider.cancel, run_id, {"compensate": compensate, "reason": "by test"})

    def run_step(self, task: StepTask) -> None:
        try:
            result = task.step.fn(*task.args)
            o = StepOutcome(task.run_id, task.seq, task.attempt, True, payload.dumps(result))
        except Exception as exc:
            o = StepOutcome(
                task.run_id,
                task.seq,
                task.attempt,
                False,
                error=repr(exc),
                traceback=traceback.format_exc(),
                retryable=not isinstance(exc, TerminalStepError),
            )
        out = Effects()
        self.decider.step_outcome(self.state(task.run_id), o, task.step, self.now, out)
        self._absorb(out)

    def advance(self, seconds: float) -> None:
        """Move the fake clock and fire everything due, in due order."""
        self.now += int(seconds * 1000)
        while True:
            due = sorted(
                (d, rid, s)
                for rid, st in self.states.items()
                for d, s in st.timers()
                if d <= self.now
            )
            if not due:
                return
            _, rid, seq = due[0]
            self._do(self.decider.timer_due, rid, seq)

    def recover(self, run_id: str) -> None:
        """As after a crash: rebuild the state from the journal and recover it."""
        self.states[run_id] = fold(run_id, [f for f in self.journal if f.rec["run_id"] == run_id])
        self.queued = [t for t in self.queued if t.run_id != run_id]
        self._do(self.decider.recover, run_id)

    def facts(self, run_id: str, name: str | None = None) -> list[Fact]:
        return [f for f in self.journal if f.rec["run_id"] == run_id and name in (None, f.name)]

    def names(self, run_id: str) -> list[str]:
        return [f.name for f in self.facts(run_id)]
