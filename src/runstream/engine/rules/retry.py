"""Retry: a failed or dead run goes on from its last completed step, a parked one is
tried again, and an ended one may be retried as a new run with corrected input."""

from __future__ import annotations

from runstream.engine.rules import core, limits, runs
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, Status
from runstream.engine.work import Batch
from runstream.schemas.records import (
    UPDATE_SEQ_BASE,
    Reason,
    RetriedAsNew,
    Retry,
    RunRetried,
    StepCompleted,
    StepFailed,
    continuation_of,
)


def retry(ctx: Rules, b: Batch, st: RunState, cmd: Retry) -> None:
    """Let a failed or dead run go on from its last completed step: the steps after it
    that failed for good run again, under their next attempt number; a completed step
    never does. A parked run is tried again now. Any other run stays as it is.
    With ``input``, see `_retry_as_new`."""
    if not st.exists:
        raise Rejected(Reason.UNKNOWN_RUN, f"retry of unknown run {st.run_id!r}")
    if cmd.retry_id and cmd.retry_id in st.retry_ids:
        return  # a resent retry, recorded already
    if cmd.input is not None:
        _retry_as_new(ctx, b, st, cmd.input, ctx.limits.clip(cmd.reason or "retried"))
        return
    if st.status is Status.PARKED:
        core.advance(ctx, b, st)
        return
    if st.status not in (Status.FAILED, Status.DEAD):
        return  # running again already (a repeated retry), or ended for good
    if st.compensation is not None:
        raise Rejected(
            Reason.NOT_RETRYABLE,
            f"run {st.run_id!r} compensated its steps before it ended: it cannot go "
            "on; start a new run with the corrected input instead",
        )
    last_completed = max(
        (s for s, f in st.resolved.items() if isinstance(f, StepCompleted) and s < UPDATE_SEQ_BASE),
        default=0,
    )  # the workflow's own: an update handler's seqs are above them, and its update ended
    failed = sorted(
        s
        for s, f in st.resolved.items()
        if isinstance(f, StepFailed) and last_completed < s < UPDATE_SEQ_BASE
    )
    reason = ctx.limits.clip(cmd.reason or "retried")
    wf = ctx.registry.get(st.workflow, st.version)
    permit = limits.run_permit(wf, st.run_id, st.input) if wf is not None else None
    # A retried run has its whole timeout again, from the retry: its old deadline
    # may have passed (it may be why it failed), and it would fail again at once.
    deadline = None if st.timeout_ms is None else b.now + st.timeout_ms
    retried = RunRetried(
        st.run_id, b.now, seqs=failed, reason=reason, deadline_ms=deadline, retry_id=cmd.retry_id
    )
    core.emit(b, st, retried)
    if permit is not None:  # it gave its permit back when it ended: ask again
        limits.request(b, st, permit)
        return
    core.advance(ctx, b, st)


def _retry_as_new(ctx: Rules, b: Batch, st: RunState, data: bytes, reason: str) -> None:
    """An ended run is retried as a new run, ``<run_id>~<n>``, of the newest version of
    its workflow with corrected input, started in this transaction; each history links
    to the other (RetriedAsNew here, the tag ``retry_of`` there)."""
    run_id = st.run_id
    if not st.terminal or st.continued_as or st.retried_as:
        why = (
            f"it is {st.status}"
            if not st.terminal
            else f"it already carries on as {st.continued_as or st.retried_as}"
        )
        raise Rejected(
            Reason.NOT_RETRYABLE, f"run {run_id!r} can't be retried with new input: {why}"
        )
    runs.checked(ctx, st.workflow, None, data)
    tags = {**st.tags, "retry_of": run_id}
    size = len(data) + sum(len(k) + len(v) for k, v in tags.items())
    problem = ctx.limits.too_large("the new input with the run's tags", size)
    if problem:
        raise Rejected(Reason.OVERSIZE, problem)
    successor = continuation_of(run_id)
    core.emit(b, st, RetriedAsNew(run_id, b.now, new_run_id=successor, reason=reason))
    runs.start_successor(b, st, successor, data, tags, parent_seq=None)
