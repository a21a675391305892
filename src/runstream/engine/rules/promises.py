"""Durable promises: a run creates one (`Context.promise`, recorded by `core` as its
code runs), anyone completes it once with a `CompletePromise` command, and its timeout
(`timers`) completes it if nobody did. The outcome is a fact, kept until the workflow
awaits it; a completion that comes too late is refused, never a second outcome."""

from __future__ import annotations

from datetime import UTC, datetime

from runstream.engine import payload
from runstream.engine.rules import core
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, Status
from runstream.engine.work import Batch
from runstream.schemas.records import (
    CompletePromise,
    PromiseCompleted,
    PromiseCreated,
    Reason,
    promise_of,
)


def complete(ctx: Rules, b: Batch, st: RunState, cmd: CompletePromise) -> None:
    """Resolve or reject the run's promise ``cmd.promise_id``, once; refused (a dead
    letter saying why) for a promise the run does not have, one completed already, or
    a run that ended."""
    pid = cmd.promise_id
    if cmd.read and _late(st, pid):
        return  # an entity's answer to a read nothing waits for any more
    if not st.exists:
        raise Rejected(Reason.UNKNOWN_RUN, f"promise {pid!r} of unknown run {st.run_id!r}")
    seq = _seq_of(st, pid)
    fact = st.resolved.get(seq)
    if isinstance(fact, PromiseCompleted):
        raise Rejected(Reason.PROMISE_COMPLETED, f"promise {pid!r} {_outcome(fact)} already")
    if st.terminal and not cmd.read:  # a read's answer is kept for a retry of the run
        raise Rejected(Reason.RUN_ENDED, f"promise {pid!r}: {_ended(st)}")
    value, error = cmd.value, cmd.error
    if error is None:
        try:
            payload.loads(value or b"null")
        except ValueError as exc:
            why = f"the value for {pid!r} is not JSON: {exc}"
            raise Rejected(Reason.INVALID_INPUT, why) from exc
    else:
        value, error = None, ctx.limits.clip(error)
    core.emit(b, st, PromiseCompleted(st.run_id, b.now, seq=seq, value=value, error=error))
    _go_on(ctx, b, st)


def time_out(ctx: Rules, b: Batch, st: RunState, created: PromiseCreated) -> None:
    """The open promise's timeout passed with nobody completing it: it times out."""
    due = created.timeout_at_ms
    if due is None or due > b.now or st.terminal:
        return
    at = datetime.fromtimestamp(due / 1000, UTC).isoformat(timespec="milliseconds")
    why = f"promise {created.promise_id!r} was not completed by its timeout ({at})"
    core.emit(b, st, PromiseCompleted(st.run_id, b.now, seq=created.seq, error=why, timed_out=True))
    _go_on(ctx, b, st)


def _go_on(ctx: Rules, b: Batch, st: RunState) -> None:
    """The workflow may be awaiting the promise: it goes on (a parked or compensating
    run does not; the outcome is kept for it)."""
    if st.status is not Status.PARKED and st.compensation is None:
        core.advance(ctx, b, st)


def _late(st: RunState, pid: str) -> bool:
    """A read's answer comes after its run ended for good (cancelled, completed,
    continued as new: a failed run may be retried and replay the read), or a second time."""
    parsed = promise_of(pid)
    if not st.exists or parsed is None:
        return False  # refused below, saying why
    if st.terminal and st.status not in (Status.FAILED, Status.DEAD):
        return True
    return isinstance(st.resolved.get(parsed[1]), PromiseCompleted)


def _seq_of(st: RunState, pid: str) -> int:
    """The seq of the run's promise ``pid``; refused if the run created no such one."""
    parsed = promise_of(pid)
    if parsed is None:
        raise Rejected(
            Reason.UNKNOWN_PROMISE, f"{pid!r} is not a promise id (<run_id>/promise/<seq>)"
        )
    run_id, seq = parsed
    if run_id != st.run_id:
        raise Rejected(
            Reason.UNKNOWN_PROMISE,
            f"promise {pid!r} is of run {run_id!r}, not {st.run_id!r}: send it keyed by its run",
        )
    if not isinstance(st.resolved.get(seq), PromiseCreated | PromiseCompleted):
        raise Rejected(Reason.UNKNOWN_PROMISE, f"run {st.run_id!r} has no promise {pid!r}")
    return seq


def _outcome(fact: PromiseCompleted) -> str:
    if fact.timed_out:
        return "timed out"
    return "was resolved" if fact.error is None else "was rejected"


def _ended(st: RunState) -> str:
    if st.continued_as:
        return f"run {st.run_id!r} continued as {st.continued_as!r}; its promises ended with it"
    if st.status in (Status.FAILED, Status.DEAD):
        return (
            f"run {st.run_id!r} is {st.status}: retry it (`runstream runs retry`), then "
            "complete the promise again (`runstream dlq redrive` sends this record again)"
        )
    return f"run {st.run_id!r} is {st.status}: nothing awaits the promise any more"
