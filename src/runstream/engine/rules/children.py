"""Child runs: a parent starts one (`start_child`), an awaited one's end settles the
parent's seq (`child_result`), and a run's end tells its parent and applies each of its
children's ``parent_close`` (`ended`, from `core.emit`)."""

from __future__ import annotations

from runstream.engine.limits import headers_bytes
from runstream.engine.requests import ChildCall
from runstream.engine.rules import blobs, core, runs
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, RunView, Status
from runstream.engine.work import Batch
from runstream.schemas.records import (
    Cancel,
    ChildEnded,
    ChildResult,
    ChildStarted,
    Fact,
    Reason,
    RunCancelled,
    RunCompleted,
    StartRun,
    continues,
    run_id_problem,
)


def start_child(ctx: Rules, b: Batch, st: RunState, call: ChildCall) -> bool:
    """Record the child's start and produce its StartRun in this transaction (or, if
    it cannot start, its end at once); True when the workflow goes on now."""
    if call.seq in st.pending:
        return False  # started; its end has not come
    run_id, now = st.run_id, b.now
    try:
        problem = run_id_problem(call.child_run_id, new=True)
        if problem:
            raise Rejected(Reason.BAD_RUN_ID, f"child run id: {problem}")
        if runs.checked(ctx, call.workflow, None, call.input) is None:
            raise Rejected(Reason.UNKNOWN_WORKFLOW, f"no workflow {call.workflow!r}")
        data, too_large = blobs.keep(ctx, b, st, "the child's input", call.input)
        size = len(data) + headers_bytes(call.headers)
        too_large = too_large or ctx.limits.too_large(
            "the child's start (its input and headers)", size
        )
        if too_large:
            raise Rejected(Reason.OVERSIZE, too_large)
    except Rejected as exc:
        ended = ChildEnded(
            run_id,
            now,
            seq=call.seq,
            name=call.workflow,
            child_run_id=call.child_run_id,
            status="rejected",
            output=None,
            error=ctx.limits.clip(f"{exc.code}: {exc.reason}"),
        )
        core.emit(b, st, ended)
        return True
    started = ChildStarted(
        run_id,
        now,
        seq=call.seq,
        name=call.workflow,
        child_run_id=call.child_run_id,
        awaited=call.awaited,
        parent_close=call.parent_close,
    )
    core.emit(b, st, started)
    b.effects.commands.append(
        StartRun(
            call.child_run_id,
            call.workflow,
            input=data,
            parent_run_id=run_id,
            sent_at_ms=now,
            parent_seq=call.seq if call.awaited else None,
            headers=dict(call.headers),
        )
    )
    return not call.awaited


def child_result(ctx: Rules, b: Batch, st: RunState, cmd: ChildResult) -> None:
    """An awaited child ended: settle the parent's seq and go on."""
    started = st.pending.get(cmd.seq)
    # A child that continued as new answers under its new id (``<child>~<n>``).
    if not (
        isinstance(started, ChildStarted) and continues(cmd.child_run_id, started.child_run_id)
    ):
        told = st.resolved.get(cmd.seq)
        again = isinstance(told, ChildEnded) and continues(cmd.child_run_id, told.child_run_id)
        if st.terminal or again:
            return  # the parent ended first, or it was told already
        raise Rejected(
            Reason.UNEXPECTED_RESULT,
            f"run {st.run_id!r} awaits no child {cmd.child_run_id!r} at seq {cmd.seq}",
        )
    ended = ChildEnded(
        st.run_id,
        b.now,
        seq=cmd.seq,
        name=started.name,
        child_run_id=started.child_run_id,
        status=cmd.status,
        output=cmd.output,
        error=cmd.error,
    )
    core.emit(b, st, ended)
    core.advance(ctx, b, st)


def tell_refused_parent(b: Batch, cmd: StartRun, reason: str) -> None:
    """A child's start was refused here: its awaiting parent hears of it in the same
    transaction (as ChildFailed, status ``rejected``), else it would wait for ever."""
    if cmd.parent_run_id and cmd.parent_seq is not None:
        b.effects.commands.append(
            ChildResult(
                cmd.parent_run_id,
                cmd.parent_seq,
                child_run_id=cmd.run_id,
                status=Status.REJECTED.value,
                output=None,
                error=reason,
                sent_at_ms=b.now,
            )
        )


def children(st: RunView) -> list[ChildStarted]:
    """The child runs ``st`` started that may still run (awaited ones not ended, and
    every fire-and-forget one: the parent is not told of their end)."""
    facts = [*st.pending.values(), *st.resolved.values()]
    return [f for f in facts if isinstance(f, ChildStarted)]


def ended(b: Batch, st: RunView, fact: Fact, kids: list[ChildStarted]) -> None:
    """The run ended: tell the parent awaiting it, in this transaction, and apply the
    ``parent_close`` of each of its ``kids`` (`children`, taken before the end; a cancel
    has cancelled them already, or abandoned)."""
    continued = isinstance(fact, RunCompleted) and fact.continued_as
    if st.parent_run_id and st.parent_seq is not None and not continued:
        output = fact.output if isinstance(fact, RunCompleted) else None
        error = None if isinstance(fact, RunCompleted) else (st.error or st.reason or "")
        b.effects.commands.append(
            ChildResult(
                st.parent_run_id,
                st.parent_seq,
                child_run_id=st.run_id,
                status=st.status.value,
                output=output,
                error=error,
                sent_at_ms=b.now,
            )
        )
    if isinstance(fact, RunCancelled):
        return
    for child in kids:
        if child.parent_close == "abandon":
            continue
        why = f"its parent {st.run_id!r} ended ({st.status.value}) first"
        compensate = child.parent_close == "request_cancel"
        b.effects.commands.append(
            Cancel(
                child.child_run_id, compensate, reason=why, sent_at_ms=b.now, abandon_children=False
            )
        )


def child_ids(st: RunView) -> list[str]:
    """The child runs ``st`` started (running or ended), in the order it started them."""
    facts = sorted({**st.resolved, **st.pending}.items())
    return [
        f.child_run_id
        for _, f in facts
        if isinstance(f, ChildStarted) or (isinstance(f, ChildEnded) and f.status != "rejected")
    ]
