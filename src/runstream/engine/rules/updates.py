"""Validated updates: a request a run answers (`Context.update_handler`).

An `Update` command is decided on the run's partition like any other. Its validator runs
on the workflow's state as it waits now, inside the decision: a rejected update records
nothing and is answered at once with the validator's error; an accepted one is a fact
(`UpdateAccepted`), and its handler then runs as the workflow's code does (replayed,
its steps and sleeps durable) until its outcome is a fact too (`UpdateCompleted`). Both
stages are answered on ``<ns>.replies``, to the client the command names; the accepted
fact keeps whom to tell, so a new owner of the partition answers the completion.

An update is idempotent by its id: a duplicate is answered from the history (its
result, or that it is accepted and still running) and never runs the handler again. A
run that ends with updates in flight fails them (`ended`), with a fact each, so a late
duplicate learns the same. Caps (`Limits.updates_in_flight`, `updates_per_history`)
are checked before the validator.
"""

from __future__ import annotations

from runstream.engine import payload
from runstream.engine.requests import Blocked, Completed, Failed, Replay
from runstream.engine.rules import core, runs
from runstream.engine.rules.context import Rejected, Rules, settled
from runstream.engine.state import RunState, Status
from runstream.engine.work import Batch
from runstream.engine.workflow_context import Context
from runstream.schemas.records import (
    MAX_UPDATES,
    RUN_PERMIT_SEQ,
    Fact,
    PermitRequested,
    Reason,
    RunCancelled,
    RunCompleted,
    RunFailed,
    StartRun,
    Update,
    UpdateAccepted,
    UpdateCode,
    UpdateCompleted,
    UpdateReply,
    UpdateStage,
)


def update(ctx: Rules, b: Batch, st: RunState, cmd: Update) -> None:
    """Answer a duplicate from the history, refuse what cannot run, validate, accept."""
    workflow = None if st.exists else cmd.start_workflow  # update-with-start
    started = workflow is not None
    if workflow is not None:
        start = StartRun(
            st.run_id,
            workflow,
            input=cmd.start_input if cmd.start_input is not None else b"null",
            version=cmd.start_version,
            tags=dict(cmd.start_tags),
            sent_at_ms=cmd.sent_at_ms,
            timeout_ms=cmd.start_timeout_ms,
        )
        try:
            runs.start(ctx, b, st, start)
        except Rejected as exc:  # it records nothing before it refuses
            _refuse(b, st, cmd, UpdateCode.UNKNOWN_RUN, f"the run cannot start: {exc.reason}")
            return
    done = st.update_results.get(cmd.update_id)
    if done is not None:
        _reply(b, cmd.reply_to, cmd.request_id, done.update_id, st.run_id, done)
        return
    if cmd.update_id in st.updates:  # accepted, still running: its completion will come
        _reply(b, cmd.reply_to, cmd.request_id, cmd.update_id, st.run_id, None)
        return
    refused = _cannot_take(ctx, st)
    if refused is not None:
        _refuse(b, st, cmd, *refused, started)
        return
    wf = ctx.registry.get(st.workflow, st.version)
    if wf is None:
        why = f"run {st.run_id!r}: its code is not here"
        _refuse(b, st, cmd, UpdateCode.NOT_RUNNING, why, started)
        return
    guard = lambda: ctx.activation(st.run_id)  # noqa: E731
    with ctx.replayer.context(wf, st, b.now, guard, settled(b, st)) as live:
        verdict = _validate(ctx, st, cmd, live)
    if isinstance(verdict, tuple):
        _refuse(b, st, cmd, *verdict, started)
        return
    accepted = UpdateAccepted(
        st.run_id,
        b.now,
        update_id=cmd.update_id,
        name=cmd.name,
        arg=cmd.arg,
        index=len(st.updates),
        anchor=verdict,
        reply_to=cmd.reply_to,
        request_id=cmd.request_id,
    )
    core.emit(b, st, accepted)
    _reply(b, cmd.reply_to, cmd.request_id, cmd.update_id, st.run_id, None)
    core.advance(ctx, b, st)  # its handler starts


def _validate(
    ctx: Rules, st: RunState, cmd: Update, live: Context | None
) -> int | tuple[UpdateCode, str]:
    """Where the workflow waits (the update's anchor) if its handler takes the update;
    else why not. The validator runs here, on the workflow's state as it waits."""
    if live is None:
        return UpdateCode.NOT_RUNNING, f"run {st.run_id!r} cannot take updates now"
    handler = live._updates.registered.get(cmd.name)
    if handler is None:
        known = ", ".join(map(repr, sorted(live._updates.registered))) or "none"
        why = f"run {st.run_id!r} ({st.workflow}) has no update handler {cmd.name!r}"
        return UpdateCode.NO_HANDLER, f"{why} (it has: {known})"
    try:
        arg = payload.loads(cmd.arg)
    except ValueError as exc:
        return UpdateCode.INVALID_INPUT, f"the update's argument is not JSON: {exc}"
    try:
        with ctx.activation(st.run_id):
            live._updates.validate(handler, arg)
    except Exception as exc:  # the validator's verdict
        return UpdateCode.REJECTED, ctx.limits.clip(f"{type(exc).__name__}: {exc}")
    except BaseException:  # its time budget (runtime.budget): not the validator's verdict
        return UpdateCode.REJECTED, "the validator ran past its time budget (activation_budget)"
    return live._updates.points


def _cannot_take(ctx: Rules, st: RunState) -> tuple[UpdateCode, str] | None:
    """Why the run cannot take a new update now, or None."""
    if not st.exists:
        return UpdateCode.UNKNOWN_RUN, f"no run {st.run_id!r}"
    if st.terminal:
        return UpdateCode.RUN_ENDED, _ended(st)
    if st.status is Status.PARKED:
        return UpdateCode.NOT_RUNNING, f"run {st.run_id!r} is parked: {st.reason}"
    if st.paused is not None:  # its code runs no handler till the unpause: ask again then
        why = f"run {st.run_id!r} is paused ({st.paused.reason}, by {st.paused.by or 'someone'})"
        return UpdateCode.NOT_RUNNING, why
    if st.compensation is not None:
        return UpdateCode.NOT_RUNNING, f"run {st.run_id!r} is compensating"
    if isinstance(st.pending.get(RUN_PERMIT_SEQ), PermitRequested):
        return UpdateCode.NOT_RUNNING, f"run {st.run_id!r} waits for its concurrency permit"
    open_now, cap = len(st.updates_in_flight()), ctx.limits.updates_in_flight
    if open_now >= cap:
        return (
            UpdateCode.TOO_MANY,
            f"run {st.run_id!r} has {open_now} updates in flight (cap {cap})",
        )
    most = min(ctx.limits.updates_per_history, MAX_UPDATES)
    if len(st.updates) >= most:
        why = f"run {st.run_id!r} took {len(st.updates)} updates (cap {most}): continue as new"
        return UpdateCode.TOO_MANY, why
    return None


def follow(ctx: Rules, b: Batch, st: RunState, result: Replay, relaunch: frozenset[int]) -> bool:
    """Record how far the open handlers got in one replay (`core.advance`): an outcome
    is a fact and an answer; a wait is recorded as the workflow's are. True when a
    handler can go further now."""
    again = False
    for accepted, outcome in result.updates:
        match outcome:
            case Completed(value):
                output, problem = core._dumps(ctx, "the update's result", value, b, st)
                if problem:
                    _complete(b, st, accepted, error=problem, code=UpdateCode.HANDLER_FAILED)
                else:
                    _complete(b, st, accepted, output=output)
            case Failed(error):
                error = ctx.limits.clip(error)
                _complete(b, st, accepted, error=error, code=UpdateCode.HANDLER_FAILED)
            case Blocked():
                again |= core._follow(ctx, b, st, Replay(outcome), relaunch)
    return again


def ended(b: Batch, st: RunState, end: Fact) -> None:
    """The run ends (``end``, not applied yet) with updates in flight: each fails, and
    its caller hears why."""
    for accepted in st.updates_in_flight():
        why = f"run {st.run_id!r} {_how(end)} while update {accepted.update_id!r} was in flight"
        _complete(b, st, accepted, error=why, code=UpdateCode.RUN_ENDED)


def _complete(
    b: Batch,
    st: RunState,
    accepted: UpdateAccepted,
    *,
    output: bytes | None = None,
    error: str | None = None,
    code: str = "",
) -> None:
    done = UpdateCompleted(
        st.run_id, b.now, update_id=accepted.update_id, output=output, error=error, code=code
    )
    core.emit(b, st, done)
    _reply(b, accepted.reply_to, accepted.request_id, accepted.update_id, st.run_id, done)


def _reply(
    b: Batch,
    reply_to: str | None,
    request_id: str,
    update_id: str,
    run_id: str,
    done: UpdateCompleted | None,
) -> None:
    """Tell ``reply_to`` the update is accepted (``done`` None) or completed."""
    if reply_to is None:
        return
    if done is None:
        answer = UpdateReply(request_id, update_id, run_id=run_id, stage=UpdateStage.ACCEPTED)
    else:
        answer = UpdateReply(
            request_id,
            update_id,
            run_id=run_id,
            stage=UpdateStage.COMPLETED,
            output=done.output,
            error=done.error,
            code=done.code,
        )
    b.effects.replies.append((reply_to, answer))


def _refuse(
    b: Batch, st: RunState, cmd: Update, code: UpdateCode, why: str, started: bool = False
) -> None:
    """Refuse the update with no fact: its caller is told; an update nobody waits for
    goes to the dead-letter topic, so a refusal is never silent. The run it ``started``
    (update-with-start) stays started either way."""
    if cmd.reply_to is None:
        reason = f"update {cmd.update_id!r} ({code}): {why}"
        raise Rejected(Reason.UPDATE_REFUSED, reason, keep=started)
    answer = UpdateReply(
        cmd.request_id,
        cmd.update_id,
        run_id=st.run_id,
        stage=UpdateStage.REJECTED,
        error=why,
        code=code,
    )
    b.effects.replies.append((cmd.reply_to, answer))


def _ended(st: RunState) -> str:
    if st.continued_as:
        return f"run {st.run_id!r} continued as new as {st.continued_as!r}: update that run"
    return f"run {st.run_id!r} has ended: it is {st.status}"


def _how(end: Fact) -> str:
    match end:
        case RunCompleted(continued_as=str(successor)):
            return f"continued as new as {successor!r} (update that run)"
        case RunCompleted():
            return "completed"
        case RunFailed(error=error):
            return f"failed ({error[:200]})"
        case RunCancelled():
            return "was cancelled"
    return "died"
