"""Runs: a start (idempotent by run id), the run that carries one on, a parked run's
resume, and what a Query learns about a run."""

from __future__ import annotations

from runstream.engine import payload
from runstream.engine.rules import children, core, limits, signals
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, RunView, State, Status
from runstream.engine.work import Batch, Resume, Waiter
from runstream.engine.workflow import WorkflowDef
from runstream.errors import InvalidInput, WorkflowNotFound
from runstream.schemas.records import Query, Reason, RunInfo, RunStarted, Signal, StartRun

#: A run's answer names this many of its children at most (the record has a size limit).
MAX_CHILDREN_SHOWN = 1000


def start(ctx: Rules, b: Batch, st: RunState, cmd: StartRun) -> None:
    """StartRun: idempotent by run id. With ``signal`` (signal-with-start), the signal
    is delivered whether this starts the run or it exists already, once per id."""
    if st.exists:
        if (cmd.parent_run_id, cmd.parent_seq) != (st.parent_run_id, st.parent_seq):
            # A child whose id another run has: its parent must hear of it now.
            why = f"run id {st.run_id!r} is taken by another run"
            children.tell_refused_parent(b, cmd, f"{Reason.BAD_RUN_ID}: {why}")
        if cmd.signal is not None:
            signals.signal(ctx, b, st, _start_signal(st, cmd))
        return
    wf = checked(ctx, cmd.workflow, cmd.version, cmd.input)
    permit = limits.run_permit(wf, cmd.run_id, cmd.input) if wf is not None else None
    version = cmd.version or (wf.version if wf else "")
    timeout_ms = cmd.timeout_ms
    if timeout_ms is None and wf is not None and wf.timeout is not None:
        timeout_ms = int(wf.timeout * 1000)
    core.emit(
        b,
        st,
        RunStarted(
            st.run_id,
            b.now,
            workflow=cmd.workflow,
            version=version,
            input=cmd.input,
            parent_run_id=cmd.parent_run_id,
            tags=dict(cmd.tags),
            reply_to=cmd.reply_to,
            request_id=cmd.request_id,
            deadline_ms=None if timeout_ms is None else b.now + timeout_ms,
            parent_seq=cmd.parent_seq,
            headers=dict(cmd.headers),
        ),
    )
    if cmd.signal is not None:  # buffered: the workflow's wait takes it
        signals.signal(ctx, b, st, _start_signal(st, cmd))
    if permit is not None:  # no code runs before the permit comes
        limits.request(b, st, permit)
        return
    core.advance(ctx, b, st)


def _start_signal(st: RunState, cmd: StartRun) -> Signal:
    assert cmd.signal is not None
    signal_id = cmd.signal_id or f"{st.run_id}/{cmd.signal}"
    data = b"null" if cmd.signal_payload is None else cmd.signal_payload
    return Signal(
        st.run_id, cmd.signal, payload=data, signal_id=signal_id, sent_at_ms=cmd.sent_at_ms
    )


def checked(ctx: Rules, workflow: str, version: str | None, data: bytes) -> WorkflowDef | None:
    """The workflow a start runs (None: a version this instance lacks, which parks the
    run), once ``data`` is a valid input for it; else Rejected."""
    wf: WorkflowDef | None
    try:
        if version:
            wf = ctx.registry.get(workflow, version)
            if wf is None:
                ctx.registry.latest(workflow)  # the workflow must exist at all
        else:
            wf = ctx.registry.latest(workflow)
        if wf is not None:
            wf.parse_input(payload.loads(data))
    except WorkflowNotFound as exc:
        raise Rejected(Reason.UNKNOWN_WORKFLOW, str(exc)) from exc
    except InvalidInput as exc:
        raise Rejected(Reason.INVALID_INPUT, str(exc)) from exc
    except ValueError as exc:  # not JSON
        what = f"input of workflow {workflow!r} is not JSON"
        raise Rejected(Reason.INVALID_INPUT, f"{what}: {exc}") from exc
    return wf


def start_successor(
    b: Batch,
    st: RunState,
    successor: str,
    data: bytes,
    tags: dict[str, str],
    parent_seq: int | None,
    headers: dict[str, str] | None = None,
) -> None:
    """Start the run that carries on from ``st`` (continue-as-new, retry as new), in
    the transaction that records why: the newest version of the same workflow. A
    continued child reports to its parent in its place (``parent_seq``). It keeps the
    run's ``headers`` (the trace goes on) unless given others."""
    b.effects.commands.append(
        StartRun(
            successor,
            st.workflow,
            input=data,
            parent_run_id=st.parent_run_id,
            tags=tags,
            sent_at_ms=b.now,
            continued_from=st.run_id,
            parent_seq=parent_seq,
            headers=dict(st.headers if headers is None else headers),
        )
    )


def resume(ctx: Rules, b: Batch, st: RunState, _work: Resume) -> None:
    """Try a parked run again (its version may be registered now, its code fixed)."""
    if st.status is Status.PARKED:
        core.advance(ctx, b, st)


def query(ctx: Rules, b: Batch, st: State, cmd: Query) -> None:
    """Answer now, or (``wait``) once the run ends: the shell keeps the question. An
    entity's id names no run: the answer is that none was found."""
    if not isinstance(st, RunState):
        st = RunState(st.run_id)
    if cmd.wait and st.exists and not st.terminal:
        p = b.partition_of(st.run_id)
        b.effects.waiters.append(Waiter(p, st.run_id, cmd.reply_to, cmd.request_id))
    else:
        b.effects.replies.append((cmd.reply_to, run_info(ctx, st, cmd.request_id)))


def run_info(ctx: Rules, st: RunView, request_id: str) -> RunInfo:
    """What a Query learns about a run; never larger than a record may be."""
    found = st.exists or st.status is Status.REJECTED
    size = len(st.input) * st.exists + len(st.output or b"")
    too_large = ctx.limits.too_large("the run's input and output together", size)
    if too_large:
        return RunInfo(
            request_id,
            st.run_id,
            found=found,
            status=st.status,
            workflow=st.workflow,
            version=st.version,
            steps=st.steps,
            reply_error=too_large,
        )
    return RunInfo(
        request_id,
        st.run_id,
        found=found,
        status=st.status if found else "",
        workflow=st.workflow,
        version=st.version,
        input=st.input if st.exists else None,
        output=st.output,
        error=st.error,
        reason=st.reason if st.paused is None else f"paused by {st.paused.by}: {st.paused.reason}",
        started_at_ms=st.started_at_ms if st.exists else None,
        ended_at_ms=st.ended_at_ms,
        steps=st.steps,
        continued_as=st.continued_as,
        code=st.code,
        parent_run_id=st.parent_run_id,
        children=children.child_ids(st)[:MAX_CHILDREN_SHOWN],
    )
