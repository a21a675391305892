"""Remote step attempts: a task sent to a task group (`dispatch`), its result
(`step_result`), its heartbeats, and its liveness when its timer comes (`check_liveness`)."""

from __future__ import annotations

from typing import Any

from runstream.engine import payload
from runstream.engine.limits import headers_bytes
from runstream.engine.rules import core, steps, taskgroups
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, RunView
from runstream.engine.work import Batch, StepOutcome
from runstream.engine.workflow import StepDef
from runstream.errors import STEP_TIMED_OUT
from runstream.schemas.records import (
    Heartbeat,
    Kind,
    LifecycleEvent,
    Reason,
    StepResult,
    StepStarted,
    StepTask,
)


def dispatch(
    ctx: Rules,
    b: Batch,
    st: RunState,
    seq: int,
    step: StepDef,
    args: tuple[Any, ...],
    attempt: int,
    headers: dict[str, str] | None = None,
) -> None:
    """Start a remote attempt: record it and send its task to its group, in one
    transaction. Its id (seq, attempt, time) names it apart from every other attempt,
    a retried dead run's included. Held while its group is paused (`taskgroups`)."""
    policy, p = step.policy, b.partition_of(st.run_id)
    assert policy.group is not None
    if taskgroups.holds(ctx, b, st, seq, step.name, policy.group, attempt):
        return
    attempt_id = f"{seq}.{attempt}.{b.now:x}"
    deadline = None if policy.timeout is None else b.now + int(policy.timeout * 1000)
    beat = None if policy.heartbeat is None else int(policy.heartbeat * 1000)
    started = StepStarted(
        st.run_id,
        b.now,
        seq=seq,
        name=step.name,
        attempt=attempt,
        attempt_id=attempt_id,
        isolated=False,
        group=policy.group,
        deadline_ms=deadline,
        heartbeat_ms=beat,
    )
    core.emit(b, st, started)
    sent = dict(st.headers if headers is None else headers)
    try:
        data = payload.dumps(list(args))
        size = len(data) + 2 * headers_bytes(sent)  # also the task's Kafka record headers
        error = ctx.limits.too_large(
            f"the task of step {step.name!r} (its arguments and headers)", size
        )
    except Exception as exc:  # not JSON: the task cannot be sent, now or later
        error = f"the arguments of remote step {step.name!r} are not JSON: {exc}"
    if error:  # fails for good: no attempt can do better
        outcome = StepOutcome(p, st.run_id, seq, attempt, False, error=error, retryable=False)
        steps.step_outcome(ctx, b, st, outcome)
        return
    task = StepTask(
        st.run_id,
        seq,
        attempt=attempt,
        name=step.name,
        args=data,
        deadline_ms=deadline,
        attempt_id=attempt_id,
        group=policy.group,
        heartbeat_ms=beat,
        sent_at_ms=b.now,
        headers=sent,
    )
    b.effects.tasks.append(task)


def step_result(ctx: Rules, b: Batch, st: RunState, cmd: StepResult) -> None:
    """A remote step's result: it settles the attempt only if that attempt is still
    open. Any other (late, duplicated, from a worker presumed dead) changes nothing
    and is told on the lifecycle stream; a result for no run is dead-lettered."""
    started = st.pending.get(cmd.seq)
    if not (
        isinstance(started, StepStarted)
        and started.remote
        and started.attempt_id == cmd.attempt_id
        and started.attempt == cmd.attempt
    ):
        if not st.exists:
            raise Rejected(
                Reason.UNKNOWN_RUN,
                f"a result of step {cmd.seq} (attempt id {cmd.attempt_id!r}) for run "
                f"{st.run_id!r}, which does not exist",
            )
        _ignore_result(b, st, cmd, started)
        return
    steps.step_outcome(
        ctx,
        b,
        st,
        StepOutcome(
            b.partition_of(st.run_id),
            st.run_id,
            cmd.seq,
            cmd.attempt,
            cmd.ok,
            cmd.output,
            cmd.error,
            cmd.traceback,
            cmd.retryable,
            cmd.duration_ms,
        ),
    )


def _ignore_result(b: Batch, st: RunView, cmd: StepResult, open_fact: object | None) -> None:
    if isinstance(open_fact, StepStarted) and open_fact.remote:
        why = f"attempt {open_fact.attempt_id!r} is the open one"
    elif st.terminal:
        why = f"the run is {st.status}"
    elif cmd.seq in st.resolved:
        why = "the step is settled already"
    else:
        why = "no remote attempt of that step is open"
    reason = f"result of attempt {cmd.attempt_id!r} ignored: {why}"
    b.effects.lifecycle.append(
        LifecycleEvent(
            Kind.STEP_RESULT_IGNORED,
            st.run_id,
            at_ms=b.now,
            workflow=st.workflow,
            version=st.version,
            status=st.status,
            seq=cmd.seq,
            attempt=cmd.attempt,
            reason=reason,
        )
    )


def heartbeat(ctx: Rules, b: Batch, st: RunState, cmd: Heartbeat) -> None:
    """A remote attempt is alive: its liveness counts from now. Not a fact (the
    projection keeps it); a heartbeat for an attempt no longer open is dropped."""
    started = st.pending.get(cmd.seq)
    if isinstance(started, StepStarted) and started.attempt_id == cmd.attempt_id:
        st.beats[cmd.seq] = (b.now, cmd.details)


def check_liveness(ctx: Rules, b: Batch, st: RunState, seq: int, started: StepStarted) -> None:
    """A remote attempt's time may be up: no result by its deadline, or no heartbeat
    for its interval. Then it fails as timed out, and is retried by its policy."""
    p = b.partition_of(st.run_id)
    due = st.liveness_due(seq, started, since=b.since(p))
    if due is None or due > b.now:
        if due is not None and due != st.liveness_due(seq, started):
            # Its heartbeats before this instance took over were not seen here: it
            # gets one full interval from the takeover (this re-arms its timer).
            st.beats[seq] = (b.since(p), st.beats.get(seq, (0, None))[1])
        return
    if started.deadline_ms is not None and started.deadline_ms <= b.now:
        took = (started.deadline_ms - started.at_ms) / 1000
        error = f"sent no result within its timeout of {took:g}s"
    else:
        assert started.heartbeat_ms is not None
        error = f"sent no heartbeat for {started.heartbeat_ms / 1000:g}s"
    beat = st.beats.get(seq)
    if beat is not None and beat[1] is not None:
        error += f" (last heartbeat: {beat[1].decode(errors='replace')})"
    error = f"{STEP_TIMED_OUT}remote step {started.name!r} (task group {started.group!r}) {error}"
    steps.step_outcome(
        ctx, b, st, StepOutcome(p, st.run_id, seq, started.attempt, False, error=error)
    )
