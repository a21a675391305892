"""Decisions: given a run's state and what happened, the facts to record and the work to do.

Every entry point appends to an `Effects` and applies each new fact to the state
at once (a working copy the shell throws away if its transaction aborts). No I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runstream.engine import lifecycle, payload
from runstream.engine.reducer import apply
from runstream.engine.replay import (
    Blocked,
    Completed,
    ContinuedAsNew,
    Failed,
    NonDeterministic,
    Replay,
    SignalWait,
    SleepCall,
    StepCall,
    replay,
)
from runstream.engine.state import PARKED, Fact, RunState
from runstream.engine.workflow import Registry, StepDef
from runstream.errors import InvalidInput, RunNotFound, WorkflowNotFound


@dataclass(frozen=True, slots=True)
class StepTask:
    """Run a step body (after the transaction recording its StepStarted commits)."""

    run_id: str
    seq: int
    attempt: int
    step: StepDef
    args: tuple[Any, ...]


@dataclass(slots=True)
class StepOutcome:
    """What a step attempt returned or raised."""

    run_id: str
    seq: int
    attempt: int
    ok: bool
    output: bytes = b"null"
    error: str | None = None
    traceback: str | None = None
    retryable: bool = True
    duration_ms: int = 0


@dataclass(slots=True)
class Effects:
    """Everything a batch of decisions produced, in order."""

    facts: list[Fact] = field(default_factory=list)
    lifecycle: list[dict[str, Any]] = field(default_factory=list)
    steps: list[StepTask] = field(default_factory=list)
    commands: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # to other runs
    dead_letters: list[dict[str, Any]] = field(default_factory=list)

    def mark(self) -> tuple[int, ...]:
        return tuple(
            len(x)
            for x in (self.facts, self.lifecycle, self.steps, self.commands, self.dead_letters)
        )

    def rollback(self, mark: tuple[int, ...]) -> None:
        for lst, n in zip(
            (self.facts, self.lifecycle, self.steps, self.commands, self.dead_letters),
            mark,
            strict=True,
        ):
            del lst[n:]


class Decider:
    """The engine's rules, parameterised by the workflows one App registered."""

    def __init__(self, registry: Registry, max_recovery_attempts: int = 3) -> None:
        self.registry = registry
        self.max_recovery_attempts = max_recovery_attempts

    # -- commands ------------------------------------------------------------------
    def start(self, state: RunState, cmd: dict[str, Any], now: int, out: Effects) -> None:
        """StartRun: idempotent by run id. Raises WorkflowNotFound / InvalidInput to reject."""
        if state.exists:
            return
        version = cmd.get("version")
        if version:
            wf = self.registry.get(cmd["workflow"], version)
            if wf is None and cmd["workflow"] not in self.registry.workflows:
                raise WorkflowNotFound(f"no workflow named {cmd['workflow']!r} is registered")
        else:
            wf = self.registry.latest(cmd["workflow"])
            version = wf.version
        if wf is not None:
            try:
                wf.parse_input(json.loads(cmd["input"] or b"null"))
            except ValueError as exc:  # JSONDecodeError included
                raise InvalidInput(f"input of workflow {wf.name!r} is not valid: {exc}") from exc
        self._emit(
            state,
            out,
            "RunStarted",
            now,
            workflow=cmd["workflow"],
            version=version,
            input=cmd["input"],
            parent_run_id=cmd.get("parent_run_id"),
            tags=cmd.get("tags") or {},
        )
        self._advance(state, now, out)

    def signal(self, state: RunState, cmd: dict[str, Any], now: int, out: Effects) -> None:
        if not state.exists:
            raise RunNotFound(f"signal {cmd['name']!r} for unknown run {state.run_id!r}")
        if state.terminal or cmd["signal_id"] in state.signal_ids:
            return  # a finished run takes no signals; a redelivered signal counts once
        waiting = [
            s
            for s, f in state.pending.items()
            if f.name == "SignalAwaited" and f.rec["name"] == cmd["name"]
        ]
        if waiting and state.status != PARKED and state.compensation is None:
            self._emit(
                state,
                out,
                "SignalReceived",
                now,
                seq=min(waiting),
                name=cmd["name"],
                payload=cmd["payload"],
                signal_id=cmd["signal_id"],
            )
            self._advance(state, now, out)
        else:
            self._emit(
                state,
                out,
                "SignalBuffered",
                now,
                name=cmd["name"],
                payload=cmd["payload"],
                signal_id=cmd["signal_id"],
            )

    def cancel(self, state: RunState, cmd: dict[str, Any], now: int, out: Effects) -> None:
        if not state.exists:
            raise RunNotFound(f"cancel of unknown run {state.run_id!r}")
        if state.terminal or state.compensation is not None:
            return
        reason = cmd.get("reason") or "cancelled"
        if cmd.get("compensate"):
            wf = self.registry.get(state.workflow, state.version)
            done = replay(wf, state, self.registry, now).compensations if wf else []
            if done:
                self._emit(
                    state,
                    out,
                    "CompensationStarted",
                    now,
                    error=reason,
                    traceback="",
                    cancelled=True,
                )
                self._compensate(state, done, now, out)
                return
        self._emit(state, out, "RunCancelled", now, reason=reason)

    def step_outcome(
        self, state: RunState, o: StepOutcome, policy_of: StepDef | None, now: int, out: Effects
    ) -> None:
        """A step attempt ended. Stale outcomes (an older attempt, a finished run) are dropped."""
        started = state.pending.get(o.seq)
        if started is None or started.name != "StepStarted" or started.rec["attempt"] != o.attempt:
            return
        name = started.rec["name"]
        if o.ok:
            self._emit(
                state,
                out,
                "StepCompleted",
                now,
                seq=o.seq,
                name=name,
                output=o.output,
                attempt=o.attempt,
                duration_ms=o.duration_ms,
            )
        else:
            policy = (policy_of or self.registry.step_by_name(name)).policy
            retry = o.retryable and o.attempt <= policy.retries
            retry_at = now + int(policy.delay(o.attempt) * 1000) if retry else None
            self._emit(
                state,
                out,
                "StepFailed",
                now,
                seq=o.seq,
                name=name,
                attempt=o.attempt,
                error=o.error or "",
                traceback=o.traceback or "",
                retry_at_ms=retry_at,
            )
            if retry:
                return
        self._advance(state, now, out)

    def timer_due(self, state: RunState, seq: int, now: int, out: Effects) -> None:
        """A due time of ``seq`` passed: fire the timer, retry the step, or time the wait out."""
        fact = state.pending.get(seq)
        if fact is None or state.status == PARKED:
            return
        if fact.name == "TimerScheduled" and fact.rec["due_ms"] <= now:
            self._emit(state, out, "TimerFired", now, seq=seq)
        elif fact.name == "SignalAwaited" and (fact.rec["timeout_at_ms"] or now + 1) <= now:
            self._emit(state, out, "SignalTimedOut", now, seq=seq, name=fact.rec["name"])
        elif not (fact.name == "StepFailed" and fact.rec["retry_at_ms"] <= now):
            return
        self._advance(state, now, out)

    def recover(self, state: RunState, now: int, out: Effects) -> None:
        """After a restore: steps started but never finished ran in a process that is gone."""
        seqs = state.running_steps()
        if not seqs or state.terminal:
            return
        if state.recoveries >= self.max_recovery_attempts:
            names = ", ".join(state.pending[s].rec["name"] for s in seqs)
            reason = (
                f"step {names} was interrupted {state.recoveries + 1} times; "
                f"max_recovery_attempts={self.max_recovery_attempts}"
            )
            self._emit(state, out, "RunDead", now, reason=reason)
            out.dead_letters.append({"run_id": state.run_id, "reason": f"run dead: {reason}"})
            return
        for seq in seqs:
            self._emit(state, out, "RunRecovered", now, seq=seq, recoveries=state.recoveries + 1)
            started = state.pending[seq].rec
            self._emit(
                state,
                out,
                "StepStarted",
                now,
                seq=seq,
                name=started["name"],
                attempt=started["attempt"] + 1,
            )
        self._advance(state, now, out, relaunch=frozenset(seqs))

    def resume(self, state: RunState, now: int, out: Effects) -> None:
        """Try a parked run again (its version may be registered now, its code fixed)."""
        if state.status == PARKED:
            self._advance(state, now, out)

    # -- the core loop ---------------------------------------------------------------
    def _advance(
        self, state: RunState, now: int, out: Effects, relaunch: frozenset[int] = frozenset()
    ) -> None:
        """Replay the workflow and record what it does next, until it waits or ends."""
        while not state.terminal:
            wf = self.registry.get(state.workflow, state.version)
            if wf is None:
                self._park(
                    state,
                    now,
                    out,
                    f"workflow {state.workflow!r} version "
                    f"{state.version!r} is not registered on this instance",
                )
                return
            result = replay(wf, state, self.registry, now)
            for fact in result.new_facts:
                self._record(state, out, fact)
            if state.compensation is not None:
                self._compensate(state, result.compensations, now, out, relaunch)
                return
            if not self._follow(state, result, now, out, relaunch):
                return

    def _follow(
        self, state: RunState, result: Replay, now: int, out: Effects, relaunch: frozenset[int]
    ) -> bool:
        """Record the consequence of one replay; True when the workflow can go further now."""
        match result.outcome:
            case Completed(output):
                self._emit(
                    state, out, "RunCompleted", now, output=payload.dumps(output), continued_as=None
                )
            case ContinuedAsNew(new_input):
                new_id = _next_run_id(state.run_id)
                self._emit(state, out, "RunCompleted", now, output=b"null", continued_as=new_id)
                out.commands.append(
                    (
                        new_id,
                        "StartRun",
                        {
                            "run_id": new_id,
                            "workflow": state.workflow,
                            "input": payload.dumps(new_input),
                            "version": None,
                            "parent_run_id": state.parent_run_id,
                            "tags": state.tags,
                            "sent_at_ms": now,
                        },
                    )
                )
            case Failed(error, tb):
                if result.compensations:
                    self._emit(
                        state,
                        out,
                        "CompensationStarted",
                        now,
                        error=error,
                        traceback=tb,
                        cancelled=False,
                    )
                    self._compensate(state, result.compensations, now, out)
                else:
                    self._emit(state, out, "RunFailed", now, error=error, traceback=tb)
            case NonDeterministic(err):
                self._park(state, now, out, f"non-determinism: {err}")
            case Blocked(StepCall(seq, step, args)):
                self._run_step(state, seq, step, args, now, out, relaunch)
            case Blocked(SleepCall(seq, secs)):
                if seq not in state.pending:
                    self._emit(
                        state, out, "TimerScheduled", now, seq=seq, due_ms=now + int(secs * 1000)
                    )
            case Blocked(SignalWait(seq, name, timeout)):
                if seq in state.pending:
                    return False
                buffered = next((s for s in state.signals if s["name"] == name), None)
                if buffered is not None:
                    self._emit(
                        state,
                        out,
                        "SignalReceived",
                        now,
                        seq=seq,
                        name=name,
                        payload=buffered["payload"],
                        signal_id=buffered["signal_id"],
                    )
                    return True
                timeout_at = None if timeout is None else now + int(timeout * 1000)
                self._emit(
                    state, out, "SignalAwaited", now, seq=seq, name=name, timeout_at_ms=timeout_at
                )
        return False

    def _run_step(
        self,
        state: RunState,
        seq: int,
        step: StepDef,
        args: tuple[Any, ...],
        now: int,
        out: Effects,
        relaunch: frozenset[int],
    ) -> None:
        fact = state.pending.get(seq)
        if fact is None:
            attempt = 1
        elif fact.name == "StepFailed" and fact.rec["retry_at_ms"] <= now:
            attempt = fact.rec["attempt"] + 1
        elif fact.name == "StepStarted" and seq in relaunch:
            out.steps.append(StepTask(state.run_id, seq, fact.rec["attempt"], step, args))
            return
        else:
            return  # running, or waiting for its retry time
        self._emit(state, out, "StepStarted", now, seq=seq, name=step.name, attempt=attempt)
        out.steps.append(StepTask(state.run_id, seq, attempt, step, args))

    def _compensate(
        self,
        state: RunState,
        done: list[tuple[StepDef, tuple[Any, ...]]],
        now: int,
        out: Effects,
        relaunch: frozenset[int] = frozenset(),
    ) -> None:
        """Run the compensations of completed steps, newest first, as steps -1, -2, ..."""
        for k, (step, args) in enumerate(reversed(done)):
            seq = -(k + 1)
            if seq in state.resolved:
                continue
            self._run_step(state, seq, step, args, now, out, relaunch)
            return
        failures = [
            f"compensation {f.rec['name']!r} failed: {f.rec['error']}"
            for s, f in sorted(state.resolved.items(), reverse=True)
            if s < 0 and f.name == "StepFailed"
        ]
        c = state.compensation
        assert c is not None
        if c["cancelled"]:
            self._emit(state, out, "RunCancelled", now, reason="; ".join([c["error"], *failures]))
        else:
            self._emit(
                state,
                out,
                "RunFailed",
                now,
                error="; ".join([c["error"], *failures]),
                traceback=c["traceback"],
            )

    def _park(self, state: RunState, now: int, out: Effects, reason: str) -> None:
        if not (state.status == PARKED and state.reason == reason):
            self._emit(state, out, "RunParked", now, reason=reason)

    def _emit(self, state: RunState, out: Effects, fact_name: str, now: int, **fields: Any) -> None:
        fields["run_id"], fields["at_ms"] = state.run_id, now
        self._record(state, out, Fact(fact_name, fields))

    @staticmethod
    def _record(state: RunState, out: Effects, fact: Fact) -> None:
        apply(state, fact)
        out.facts.append(fact)
        ev = lifecycle.event(fact, state)
        if ev is not None:
            out.lifecycle.append(ev)


def run_info(state: RunState, request_id: str) -> dict[str, Any]:
    """The answer to a Query (RunInfo.avsc)."""
    return {
        "request_id": request_id,
        "run_id": state.run_id,
        "found": state.exists,
        "status": state.status if state.exists else "",
        "workflow": state.workflow,
        "version": state.version,
        "input": state.input if state.exists else None,
        "output": state.output,
        "error": state.error,
        "reason": f"continued as {state.continued_as}" if state.continued_as else state.reason,
        "started_at_ms": state.started_at_ms if state.exists else None,
        "ended_at_ms": state.ended_at_ms,
        "steps": state.steps,
    }


def _next_run_id(run_id: str) -> str:
    base, sep, n = run_id.rpartition("~")
    return f"{base}~{int(n) + 1}" if sep and n.isdigit() else f"{run_id}~1"
