"""Pause and unpause: an operator holds a run still, then lets it go on.

A paused run runs no workflow code (`core.advance` stops at `st.paused`). Everything
else about it goes on being recorded, by the rules that record it anyway: the steps in
flight finish (StepCompleted, or StepFailed with its retry kept for later), signals,
events, child results and promise completions are received, sleeps fire and waits
time out. On unpause the code replays and sees all of it, each once, in journal order.

What still ends a paused run: a cancel (with compensation, the compensation runs now)
and its execution timeout, which keeps running while the run is paused (a deadline is
a promise about wall-clock time; `docs/guides/pause.md`). An end clears the pause
(`reducer`): a retried run runs; a run that continued as new passes a pause on to its
successor, as a cancel does. Duplicates change nothing: a pause of a paused run, an
unpause of a run that is not paused, either of an ended run.
"""

from __future__ import annotations

from dataclasses import replace

from runstream.engine.rules import core, taskgroups
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, TaskGroupState
from runstream.engine.work import Batch
from runstream.schemas.records import Pause, Reason, RunPaused, RunUnpaused, Unpause


def pause(ctx: Rules, b: Batch, st: RunState | TaskGroupState, cmd: Pause) -> None:
    """Pause the run (a fact: who, why); its code stops at its next activation. (Or a
    task group on one partition: `taskgroups`.)"""
    if isinstance(st, TaskGroupState):
        taskgroups.pause(ctx, b, st, cmd)
        return
    if not _open(b, st, cmd) or st.paused is not None or _again(st, cmd):
        return
    reason, by = ctx.limits.clip(cmd.reason or "paused"), ctx.limits.clip(cmd.by)
    core.emit(b, st, RunPaused(st.run_id, b.now, reason=reason, by=by, pause_id=cmd.pause_id))


def unpause(ctx: Rules, b: Batch, st: RunState | TaskGroupState, cmd: Unpause) -> None:
    """Let a paused run go on: its code replays what was recorded meanwhile."""
    if isinstance(st, TaskGroupState):
        taskgroups.unpause(ctx, b, st, cmd)
        return
    if not _open(b, st, cmd) or st.paused is None or _again(st, cmd):
        return
    reason, by = ctx.limits.clip(cmd.reason or "unpaused"), ctx.limits.clip(cmd.by)
    core.emit(b, st, RunUnpaused(st.run_id, b.now, reason=reason, by=by, pause_id=cmd.pause_id))
    core.advance(ctx, b, st)


def relaunch(ctx: Rules, b: Batch, st: RunState, relaunch: frozenset[int]) -> None:
    """A paused run's steps in flight still finish: the ones a gone process left open
    (`steps.recover`) start again, and nothing else does."""
    if not relaunch:
        return
    core.relaunch_forward(ctx, b, st, relaunch)  # a forward step (compensating or not)
    if st.compensation is not None and any(s < 0 for s in relaunch):  # a compensation step
        core.compensate(ctx, b, st, relaunch)


def _open(b: Batch, st: RunState, cmd: Pause | Unpause) -> bool:
    """The command is for this run as it is now: not ended, not carried on by another
    run (the command follows it there). An unknown run is refused."""
    what = type(cmd).__name__.lower()
    if not st.exists:
        raise Rejected(Reason.UNKNOWN_RUN, f"{what} of unknown run {st.run_id!r}")
    if st.continued_as:
        b.effects.commands.append(replace(cmd, run_id=st.continued_as))
        return False
    return not st.terminal


def _again(st: RunState, cmd: Pause | Unpause) -> bool:
    """A command this run recorded already (a client's retry, a redelivery): after the
    pause it started has ended (an unpause, a timeout), the same pause must not start
    another. Commands without an id are not told apart."""
    return bool(cmd.pause_id) and cmd.pause_id in st.pause_ids
