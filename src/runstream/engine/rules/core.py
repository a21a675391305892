"""The loop every rule ends in: replay the workflow and record what it does next, until
it waits or ends (`advance`, `_follow`); compensate, park, and `emit` one fact."""

from __future__ import annotations

from typing import Any

from runstream.engine import lifecycle, payload
from runstream.engine.limits import headers_bytes
from runstream.engine.reducer import apply
from runstream.engine.replay import replay
from runstream.engine.requests import (
    Blocked,
    ChildCall,
    Completed,
    ContinuedAsNew,
    EntityRead,
    EventWait,
    Failed,
    NonDeterministic,
    Overran,
    PromiseWait,
    Replay,
    SignalWait,
    SleepCall,
    StepCall,
)
from runstream.engine.rules import blobs, children, entities, limits, pause, runs, steps, updates
from runstream.engine.rules.context import Rules, settled
from runstream.engine.state import RunState, RunView, State, Status
from runstream.engine.work import Batch
from runstream.engine.workflow import WorkflowDef
from runstream.errors import HISTORY_TOO_LARGE, Failure, failure_code
from runstream.schemas.records import (
    END_FACTS,
    RUN_PERMIT_SEQ,
    CompensationStarted,
    EventAwaited,
    Fact,
    PermitRequested,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunParked,
    SignalAwaited,
    SignalReceived,
    StepFailed,
    Subscribe,
    TimerScheduled,
    continuation_of,
    correlation_id,
)

OVERRAN = (
    "workflow code ran past its time budget (Settings.activation_budget) and was "
    "stopped: a loop or a blocking call in workflow code? Do I/O in steps"
)


def advance(ctx: Rules, b: Batch, st: RunState, relaunch: frozenset[int] = frozenset()) -> None:
    """Replay the workflow and record what it does next, until it waits or ends."""
    if isinstance(st.pending.get(RUN_PERMIT_SEQ), PermitRequested):
        return  # no code runs before the run's permit comes
    if st.paused is not None:  # no code runs while paused, only the steps in flight
        pause.relaunch(ctx, b, st, relaunch)
        return
    while not st.terminal:
        if st.compensation is not None:
            relaunch_forward(ctx, b, st, relaunch)
            compensate(ctx, b, st, relaunch)
            return
        wf = ctx.registry.get(st.workflow, st.version)
        if wf is None:
            park(
                ctx,
                b,
                st,
                f"workflow {st.workflow!r} version {st.version!r} is not "
                "registered on this instance",
            )
            return
        if st.run_id in b.parked:
            park(ctx, b, st, b.parked[st.run_id])
            return
        if _history_full(ctx, b, st):
            return
        result = _replay(ctx, b, wf, st)
        for fact in result.new_facts:
            emit(b, st, fact)
        handlers_go_on = result.updates and updates.follow(ctx, b, st, result, relaunch)
        if not _follow(ctx, b, st, result, relaunch) and not handlers_go_on:
            return


def _history_full(ctx: Rules, b: Batch, st: RunState) -> bool:
    """At its history's cap the run fails rather than replay a history that only grows."""
    over = ctx.limits.history_over(st.facts, st.history_bytes)
    if over is None:
        return False
    error = (
        f"{HISTORY_TOO_LARGE}run {st.run_id!r} has {over} in its history. Every activation "
        "replays the whole history: a long-running loop should call ctx.continue_as_new(...) "
        "every few thousand steps, which starts a fresh history"
    )
    emit(
        b,
        st,
        RunFailed(st.run_id, b.now, error=error, traceback="", code=Failure.HISTORY_TOO_LARGE),
    )
    return True


def _replay(ctx: Rules, b: Batch, wf: WorkflowDef, st: RunState) -> Replay:
    return ctx.replayer.replay(wf, st, b.now, ctx.activation(st.run_id), settled(b, st))


def _follow(ctx: Rules, b: Batch, st: RunState, result: Replay, relaunch: frozenset[int]) -> bool:
    """Record the consequence of one replay; True when the workflow can go further now."""
    run_id, now = st.run_id, b.now
    match result.outcome:
        case Completed(value):
            output, problem = _dumps(ctx, "the run's output", value, b, st)
            if problem:
                emit(b, st, blobs.failed(run_id, now, problem))
            else:
                emit(b, st, RunCompleted(run_id, now, output=output))
        case ContinuedAsNew(value, headers):
            data, problem = _dumps(ctx, "the continue-as-new input", value, b, st)
            if headers is not None and not problem:  # an interceptor's headers ride along
                size = len(data) + headers_bytes(headers)
                problem = ctx.limits.too_large("the continue-as-new input with headers", size)
            if problem:
                emit(b, st, blobs.failed(run_id, now, problem))
                return False
            successor = continuation_of(run_id)
            emit(b, st, RunCompleted(run_id, now, output=b"null", continued_as=successor))
            runs.start_successor(b, st, successor, data, dict(st.tags), st.parent_seq, headers)
        case Failed(error, tb):
            error, tb = ctx.limits.clip(error), ctx.limits.clip(tb)
            if result.compensations:
                emit(
                    b,
                    st,
                    CompensationStarted(run_id, now, error=error, traceback=tb, cancelled=False),
                )
                return True  # advance compensates
            emit(
                b,
                st,
                RunFailed(run_id, now, error=error, traceback=tb, code=Failure.WORKFLOW_ERROR),
            )
        case NonDeterministic(err):
            park(ctx, b, st, f"non-determinism: {err}")
        case Overran():
            park(ctx, b, st, OVERRAN)
        case Blocked(StepCall(seq, step, args, priority, fairness, headers)):
            steps.run_step(ctx, b, st, seq, step, args, relaunch, priority, fairness, headers)
        case Blocked(SleepCall(seq, secs)):
            if seq not in st.pending:
                emit(b, st, TimerScheduled(run_id, now, seq=seq, due_ms=now + int(secs * 1000)))
        case Blocked(SignalWait(seq, name, timeout)):
            if seq in st.pending:
                return False
            buffered = next((s for s in st.signals if s.name == name), None)
            if buffered is not None:
                emit(
                    b,
                    st,
                    SignalReceived(
                        run_id,
                        now,
                        seq=seq,
                        name=name,
                        payload=buffered.payload,
                        signal_id=buffered.signal_id,
                    ),
                )
                return True
            timeout_at = None if timeout is None else now + int(timeout * 1000)
            emit(b, st, SignalAwaited(run_id, now, seq=seq, name=name, timeout_at_ms=timeout_at))
        case Blocked(ChildCall() as call):
            return children.start_child(ctx, b, st, call)
        case Blocked(EntityRead() as read):
            return entities.ask(ctx, b, st, read)
        case Blocked(PromiseWait(seq)):  # its PromiseCreated is recorded: no fact, but say so
            b.effects.lifecycle.append(lifecycle.awaiting_promise(st, seq, now))
        case Blocked(EventWait(seq, name, key, timeout)):
            if seq not in st.pending:
                timeout_at = None if timeout is None else now + int(timeout * 1000)
                emit(
                    b,
                    st,
                    EventAwaited(
                        run_id, now, seq=seq, name=name, key=key, timeout_at_ms=timeout_at
                    ),
                )
                corr = correlation_id(name, key)
                b.effects.commands.append(
                    Subscribe(
                        corr,
                        name,
                        subscriber=run_id,
                        seq=seq,
                        key=key,
                        cancel=False,
                        sent_at_ms=now,
                    )
                )
    return False


def relaunch_forward(ctx: Rules, b: Batch, st: RunState, relaunch: frozenset[int]) -> None:
    """A forward step recovered while the run compensates (a cancel came between its
    process going away and the recovery): run it again, as the compensation waits for
    it. Its call (step and arguments) is where the workflow's replay blocks."""
    wf = ctx.registry.get(st.workflow, st.version)
    if wf is None or not any(s > 0 for s in relaunch):
        return
    result = replay(wf, st, ctx.registry, b.now, ctx.activation(st.run_id))
    for outcome in [result.outcome, *(o for _, o in result.updates)]:  # an update's step too
        match outcome:
            case Blocked(StepCall(seq, step, args, headers=headers)) if seq in relaunch:
                steps.run_step(ctx, b, st, seq, step, args, relaunch, headers=headers)


def compensate(ctx: Rules, b: Batch, st: RunState, relaunch: frozenset[int] = frozenset()) -> None:
    """Wait for the steps in flight; then undo every completed step that registered a
    compensation, the last completed first (``resolved``'s order: a handler's seqs come
    after all of the workflow's), one at a time: the undo of step ``s`` is step ``-s``.
    Then end the run (cancelled or failed, with any compensation's failure)."""
    if in_flight(st):
        return
    order = {seq: i for i, seq in enumerate(st.resolved)}
    for c in sorted(compensations(ctx, b, st), key=lambda c: -order.get(c.seq, -1)):
        if -c.seq not in st.resolved:
            steps.run_step(ctx, b, st, -c.seq, c.step, c.args, relaunch)
            return
    failures = [
        f"compensation {f.name!r} failed: {f.error}"
        for s, f in sorted(st.resolved.items(), reverse=True)
        if s < 0 and isinstance(f, StepFailed)
    ]
    c = st.compensation
    assert c is not None
    text = ctx.limits.clip("; ".join([c.error, *failures]))
    if c.cancelled:
        emit(b, st, RunCancelled(st.run_id, b.now, reason=text))
    else:
        code = failure_code(c.error) or Failure.WORKFLOW_ERROR  # the cause: its text is ours
        emit(b, st, RunFailed(st.run_id, b.now, error=text, traceback=c.traceback, code=code))


def compensations(ctx: Rules, b: Batch, st: RunState) -> list[Any]:
    wf = ctx.registry.get(st.workflow, st.version)
    guard = ctx.activation(st.run_id)
    return replay(wf, st, ctx.registry, b.now, guard).compensations if wf else []


def in_flight(st: RunView) -> bool:
    """A forward step (positive seq) is running, or handed over to run again."""
    return any(s > 0 for s in st.running_steps() + st.remote_steps() + st.handed_over_steps())


def park(ctx: Rules, b: Batch, st: RunState, reason: str) -> None:
    reason = ctx.limits.clip(reason)
    if not (st.status is Status.PARKED and st.reason == reason):
        emit(b, st, RunParked(st.run_id, b.now, reason=reason))


def _dumps(ctx: Rules, what: str, value: Any, b: Batch, st: RunState) -> tuple[bytes, str | None]:
    """JSON bytes of a workflow's value (or their blob's reference), or why not."""
    try:
        data = payload.dumps(value)
    except Exception as exc:  # pydantic_core.PydanticSerializationError and friends
        return b"", ctx.limits.clip(f"{what} is not JSON-serialisable: {exc}")
    return blobs.keep(ctx, b, st, what, data)


def emit(b: Batch, st: State, fact: Fact) -> None:
    """Record ``fact``: apply it to the working copy, add it to the batch with its
    lifecycle event; an end also gives the run's permits back and tells its family."""
    if not isinstance(st, RunState):  # an entity's fact: no lifecycle, never an end
        apply(st, fact)
        b.effects.facts.append(fact)
        return
    ending = type(fact) in END_FACTS
    kids = children.children(st) if ending else []  # before the end clears pending
    permits = dict(st.permits) if ending else {}
    if ending and st.updates:
        updates.ended(b, st, fact)  # first: its updates in flight fail
    apply(st, fact)
    b.effects.facts.append(fact)
    ev = lifecycle.event(fact, st)
    if ev is not None:
        b.effects.lifecycle.append(ev)
    if ending:
        for asked in permits.values():  # the run's permits and requests go back
            value = entities.state_after(st, fact, asked)  # an entity call's new state
            b.effects.commands.append(limits.release_of(b, st, asked, value))
        children.ended(b, st, fact, kids)
