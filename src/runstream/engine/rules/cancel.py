"""Cancel: a run ends as cancelled, at once or after compensating its completed steps,
and its children are cancelled with it (unless abandoned)."""

from __future__ import annotations

from dataclasses import replace

from runstream.engine.rules import children, core
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState
from runstream.engine.work import Batch
from runstream.schemas.records import Cancel, CompensationStarted, Reason, RunCancelled


def cancel(ctx: Rules, b: Batch, st: RunState, cmd: Cancel) -> None:
    """Cancel a run. With ``compensate``, the steps in flight are waited for first,
    then every completed step's compensation runs, newest first."""
    if not st.exists:
        raise Rejected(Reason.UNKNOWN_RUN, f"cancel of unknown run {st.run_id!r}")
    if st.continued_as:  # it carries on as another run: the cancel is for that one
        b.effects.commands.append(replace(cmd, run_id=st.continued_as))
        return
    if st.terminal or st.compensation is not None:
        return
    reason = ctx.limits.clip(cmd.reason or "cancelled")
    if not cmd.abandon_children:  # and theirs, as each child cancels its own
        for child in children.children(st):
            why = ctx.limits.clip(f"its parent {st.run_id!r} was cancelled: {reason}")
            b.effects.commands.append(
                Cancel(
                    child.child_run_id,
                    cmd.compensate,
                    reason=why,
                    sent_at_ms=b.now,
                    abandon_children=False,
                )
            )
    if cmd.compensate and (core.in_flight(st) or core.compensations(ctx, b, st)):
        core.emit(
            b, st, CompensationStarted(st.run_id, b.now, error=reason, traceback="", cancelled=True)
        )
        core.compensate(ctx, b, st)
    else:
        core.emit(b, st, RunCancelled(st.run_id, b.now, reason=reason))
