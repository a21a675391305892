"""Steps and their attempts: start one (in this process, remotely, or after its permit),
settle an attempt's outcome (retried by its policy), and restart the attempts a gone
process left open (`recover`, `hand_over`). Remote attempts: `remote`."""

from __future__ import annotations

from typing import Any

from runstream.engine.rules import blobs, core, limits, remote
from runstream.engine.rules.context import Rules
from runstream.engine.state import RunState
from runstream.engine.work import Batch, HandOver, Recover, StepJob, StepOutcome
from runstream.engine.workflow import StepDef
from runstream.errors import Failure
from runstream.schemas.records import (
    Acquire,
    DeadLetter,
    PermitReceived,
    Reason,
    RunDead,
    RunRecovered,
    StepCompleted,
    StepFailed,
    StepHandedOver,
    StepHeld,
    StepStarted,
    limit_id,
)


def run_step(
    ctx: Rules,
    b: Batch,
    st: RunState,
    seq: int,
    step: StepDef,
    args: tuple[Any, ...],
    relaunch: frozenset[int],
    priority: int = 0,
    fairness: str = "",
    headers: dict[str, str] | None = None,
) -> None:
    # What its body's interceptors see (`runstream.interceptors`): the run's, or as the
    # outbound step interceptors left them.
    headers = st.headers if headers is None else headers
    fact = st.pending.get(seq)
    p = b.partition_of(st.run_id)
    match fact:
        case None:
            attempt = 1
        case StepFailed(retry_at_ms=int(due), attempt=prev) if due <= b.now:
            attempt = prev + 1
        case StepStarted(attempt=running, isolated=isolated) if seq in relaunch:
            job = StepJob(p, st.run_id, seq, running, step, args, isolated, headers)
            b.effects.steps.append(job)
            return
        case PermitReceived(attempt=attempt, granted=True):
            pass  # it has its permit
        case StepHeld(attempt=attempt):
            pass  # held by its paused task group (with its permit, if it needs one)
        case _:
            return  # running, waiting for its retry time or for a permit
    limit = None if isinstance(fact, PermitReceived | StepHeld) else ctx.registry.limit_of(step)
    if limit is not None:
        ent = limit_id(limit.name)
        ask = Acquire(
            ent,
            st.run_id,
            seq=seq,
            attempt=attempt,
            priority=priority,
            fairness=fairness,
            concurrency=limit.concurrency,
            rate=limit.rate,
            burst=limit.burst,
        )
        limits.request(b, st, ask)
        return
    if step.remote:
        remote.dispatch(ctx, b, st, seq, step, args, attempt, headers)
        return
    core.emit(b, st, StepStarted(st.run_id, b.now, seq=seq, name=step.name, attempt=attempt))
    b.effects.steps.append(StepJob(p, st.run_id, seq, attempt, step, args, headers=headers))


def step_outcome(ctx: Rules, b: Batch, st: RunState, o: StepOutcome) -> None:
    """A step attempt ended. Stale outcomes (an older attempt, a finished run) are dropped."""
    started = st.pending.get(o.seq)
    if not isinstance(started, StepStarted) or started.attempt != o.attempt:
        return
    clip = ctx.limits.clip
    limits.give_back(b, st, o.seq)
    output, too_large = (
        blobs.keep(ctx, b, st, "the step's output", o.output) if o.ok else (b"", None)
    )
    if o.ok and not too_large:
        core.emit(
            b,
            st,
            StepCompleted(
                st.run_id,
                b.now,
                seq=o.seq,
                name=started.name,
                output=output,
                attempt=o.attempt,
                duration_ms=o.duration_ms,
            ),
        )
    else:
        policy = ctx.registry.step_by_name(started.name).policy
        # While compensating, a failed step is not retried (a compensation is).
        retry = (
            not too_large
            and o.retryable
            and o.attempt <= policy.retries
            and (o.seq < 0 or st.compensation is None)
        )
        retry_at = b.now + int(policy.delay(o.attempt) * 1000) if retry else None
        error = too_large or o.error or ""
        core.emit(
            b,
            st,
            StepFailed(
                st.run_id,
                b.now,
                seq=o.seq,
                name=started.name,
                attempt=o.attempt,
                error=clip(error),
                traceback=clip(o.traceback or ""),
                retry_at_ms=retry_at,
            ),
        )
        if retry:
            return
        if too_large and blobs.failure(too_large) == Failure.BLOB_BUDGET:  # it cannot go on
            core.emit(b, st, blobs.failed(st.run_id, b.now, too_large))
            return
    core.advance(ctx, b, st)


def recover(ctx: Rules, b: Batch, st: RunState, _work: Recover) -> None:
    """After a restore: start again the steps that were open in a process that is gone.

    A step a graceful handover let go (StepHandedOver) starts again at once, under the
    same attempt number: a stop or a rebalance charges nothing.

    A step started but never finished ran in a process that crashed. After its first
    crash it runs again at once, beside the others (most crashes are nobody's: a kill, a
    lost machine). If that recovery crashes too, or the step ran alone, it runs again one
    run at a time, alone in the process (``isolated``; the shell queues such runs apart:
    `RunState.recovers_alone`). A crash while a step ran alone is the run's own doing and
    is charged to it; past ``max_recovery_attempts`` the run is dead. A crash that took
    down a step running beside others charges nobody, so a poison step never takes its
    co-runners along.
    """
    seqs, handed = st.running_steps(), st.handed_over_steps()
    if not (seqs or handed) or st.terminal:
        return
    if ctx.registry.get(st.workflow, st.version) is None:
        core.advance(ctx, b, st)  # parks it; recovered once its code is back
        return
    charged = any(isinstance(f := st.pending[s], StepStarted) and f.isolated for s in seqs)
    alone = st.recovers_alone()
    recoveries = st.recoveries + charged
    if recoveries > ctx.max_recovery_attempts:
        names = ", ".join(sorted({st.pending[s].name for s in seqs}))  # type: ignore[union-attr]
        reason = (
            f"step {names} was running alone when its engine process died, "
            f"{recoveries} times; max_recovery_attempts={ctx.max_recovery_attempts}"
        )
        core.emit(b, st, RunDead(st.run_id, b.now, reason=reason))
        b.effects.dead_letters.append(
            DeadLetter(
                f"run dead: {reason}",
                ctx.journal_topic,
                partition=b.partition_of(st.run_id),
                offset=-1,
                key=st.run_id.encode(),
                value=None,
                run_id=st.run_id,
                at_ms=b.now,
                code=Reason.RUN_DEAD,
            )
        )
        return
    for seq in seqs:
        started = st.pending[seq]
        assert isinstance(started, StepStarted)
        core.emit(b, st, RunRecovered(st.run_id, b.now, seq=seq, recoveries=recoveries))
        core.emit(
            b,
            st,
            StepStarted(
                st.run_id,
                b.now,
                seq=seq,
                name=started.name,
                attempt=started.attempt + 1,
                isolated=alone,
            ),
        )
    for seq in handed:
        let_go = st.pending[seq]
        assert isinstance(let_go, StepHandedOver)
        core.emit(
            b, st, StepStarted(st.run_id, b.now, seq=seq, name=let_go.name, attempt=let_go.attempt)
        )
    core.advance(ctx, b, st, relaunch=frozenset(seqs + handed))


def hand_over(ctx: Rules, b: Batch, st: RunState, work: HandOver) -> None:
    """The instance lets the run's partition go: its steps still open here are handed
    over to the next owner (see `recover`). ``work.began``: the seqs whose body had begun."""
    if st.terminal:
        return
    for seq in st.running_steps():
        started = st.pending[seq]
        assert isinstance(started, StepStarted)
        let_go = StepHandedOver(
            st.run_id,
            b.now,
            seq=seq,
            name=started.name,
            attempt=started.attempt,
            ran=seq in work.began,
        )
        core.emit(b, st, let_go)
