"""Limits: permits owned by the limit's entity ``~limit/...`` (docs/remote-steps.md, 4).

A run asks (`request`, sending Acquire); the entity grants at once, queues or refuses
(`acquire`, `_give`); a permit comes back on Release (`release`) and the next waiting
request is granted (`grant_waiting`, also on the entity's timer for a rate limit); the
run takes the answer (`grant`)."""

from __future__ import annotations

from dataclasses import replace

from runstream.engine import payload
from runstream.engine.rules import core
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import LimitState, RunState
from runstream.engine.work import Batch
from runstream.engine.workflow import WorkflowDef
from runstream.errors import QUEUE_FULL, Failure
from runstream.schemas.records import (
    RUN_PERMIT_SEQ,
    Acquire,
    Grant,
    LimitSet,
    PermitGranted,
    PermitQueued,
    PermitReceived,
    PermitReleased,
    PermitRequested,
    Reason,
    Release,
    RunFailed,
    limit_id,
)


def run_permit(wf: WorkflowDef, run_id: str, data: bytes) -> Acquire | None:
    """The permit a run of ``wf`` needs before it runs (its ``concurrency_key``)."""
    if wf.concurrency_key is None:
        return None
    try:
        key = wf.concurrency_key(wf.parse_input(payload.loads(data)))
    except Exception as exc:
        raise Rejected(
            Reason.INVALID_INPUT,
            f"the concurrency_key of workflow {wf.name!r} failed on this input: {exc!r}",
        ) from exc
    ent = limit_id(wf.name, str(key))
    return Acquire(ent, run_id, seq=RUN_PERMIT_SEQ, concurrency=wf.limit, max_queued=wf.max_queued)


# -- the run's side ---------------------------------------------------------------------
def request(b: Batch, st: RunState, ask: Acquire) -> None:
    """Ask the limit for a permit; the run waits at ``ask.seq`` for the Grant."""
    # Its id names it apart from every other request (the Grant and the Release name
    # it): the fact's index in the run's history, unique even for a request withdrawn
    # and asked again at the same seq within one millisecond (a time would repeat).
    request_id = f"{ask.seq}.{ask.attempt}.{st.facts}"
    asked = PermitRequested(
        st.run_id, b.now, seq=ask.seq, limit=ask.run_id, attempt=ask.attempt, request_id=request_id
    )
    core.emit(b, st, asked)
    b.effects.commands.append(replace(ask, sent_at_ms=b.now, request_id=request_id))


def grant(ctx: Rules, b: Batch, st: RunState, cmd: Grant) -> None:
    """A limit's answer. A permit nobody waits for any more (the run ended, or it
    compensates, or the grant answers an earlier request, withdrawn: a run timed out
    and retried at once asks again at the same seq) goes straight back."""
    asked = st.pending.get(cmd.seq)
    if not (
        isinstance(asked, PermitRequested)
        and asked.limit == cmd.limit
        and cmd.request_id in ("", asked.request_id)  # "": a grant by an older engine
        and (st.compensation is None or cmd.seq < 0)
    ):
        if cmd.granted:  # that request's permit only, not one the run waits for now
            b.effects.commands.append(release_of(b, st, cmd))
        return
    received = PermitReceived(
        st.run_id,
        b.now,
        seq=cmd.seq,
        limit=cmd.limit,
        attempt=asked.attempt,
        granted=cmd.granted,
        reason=cmd.reason,
        value=cmd.value,
    )
    core.emit(b, st, received)
    if not cmd.granted:  # only a run's own permit is ever refused (max_queued)
        failed = RunFailed(
            st.run_id, b.now, error=QUEUE_FULL + cmd.reason, traceback="", code=Failure.QUEUE_FULL
        )
        core.emit(b, st, failed)
        return
    core.advance(ctx, b, st)


def give_back(b: Batch, st: RunState, seq: int) -> None:
    """The attempt at ``seq`` ends: its permit, if it had one, goes back."""
    asked = st.permits.get(seq)
    if asked is not None:
        b.effects.commands.append(release_of(b, st, asked))


def release_of(
    b: Batch, st: RunState, asked: PermitRequested | Grant, value: bytes | None = None
) -> Release:
    """The Release that gives back the permit (or withdraws the request) ``asked``, or
    the one a Grant answers; ``value``: a durable entity's new state."""
    return Release(
        asked.limit,
        st.run_id,
        seq=asked.seq,
        sent_at_ms=b.now,
        request_id=asked.request_id,
        value=value,
    )


# -- the limit entity's side ------------------------------------------------------------
def acquire(ctx: Rules, b: Batch, ent: LimitState, cmd: Acquire) -> None:
    """A limit entity is asked for a permit: grant it now if the limit allows and
    nobody waits, else queue it (or refuse it, past ``max_queued``)."""
    if ent.asked(cmd.holder, cmd.seq):
        return  # asked twice (a redone transaction's command): once counts
    lim = ent.limit
    settings = (cmd.concurrency, cmd.rate, cmd.burst, cmd.max_queued)
    if lim is None or (lim.concurrency, lim.rate, lim.burst, lim.max_queued) != settings:
        limit = LimitSet(
            ent.run_id,
            b.now,
            concurrency=cmd.concurrency,
            rate=cmd.rate,
            burst=cmd.burst,
            max_queued=cmd.max_queued,
        )
        core.emit(b, ent, limit)
    if not ent.queue and ent.can_grant(b.now):
        _give(b, ent, cmd.holder, cmd.seq, cmd.fairness, cmd.request_id)
        return
    if cmd.max_queued is not None and len(ent.queue) >= cmd.max_queued:
        reason = (
            f"{len(ent.queue)} runs wait for {ent.run_id} already (max_queued={cmd.max_queued})"
        )
        refused = Grant(
            cmd.holder,
            cmd.seq,
            limit=ent.run_id,
            granted=False,
            reason=reason,
            sent_at_ms=b.now,
            request_id=cmd.request_id,
        )
        b.effects.commands.append(refused)
        return
    queued = PermitQueued(
        ent.run_id,
        b.now,
        holder=cmd.holder,
        seq=cmd.seq,
        priority=cmd.priority,
        fairness=cmd.fairness,
        request_id=cmd.request_id,
    )
    core.emit(b, ent, queued)


def release(ctx: Rules, b: Batch, ent: LimitState, cmd: Release) -> None:
    """A permit comes back (or a waiting request is withdrawn): grant the next. Only
    a Release naming the request's id (from the holder's Acquire) counts: one by
    anybody else frees nothing."""
    if ent.request_of(cmd.holder, cmd.seq) == cmd.request_id:
        # Only the holder of the permit sets a durable entity's state, never a request
        # withdrawn from the queue.
        value = cmd.value if (cmd.holder, cmd.seq) in ent.held else None
        released = PermitReleased(ent.run_id, b.now, holder=cmd.holder, seq=cmd.seq, value=value)
        core.emit(b, ent, released)
        grant_waiting(b, ent)


def grant_waiting(b: Batch, ent: LimitState) -> None:
    """Grant waiting requests while the limit allows: the highest priority first,
    then the fairness key served longest ago, then the earliest request."""
    while ent.queue and ent.can_grant(b.now):
        top = max(q.priority for q in ent.queue)
        waiting = [(ent.served.get(q.fairness, -1), i, q) for i, q in enumerate(ent.queue)]
        _, _, q = min(w for w in waiting if w[2].priority == top)
        _give(b, ent, q.holder, q.seq, q.fairness, q.request_id)


def _give(b: Batch, ent: LimitState, holder: str, seq: int, fairness: str, request_id: str) -> None:
    core.emit(
        b,
        ent,
        PermitGranted(
            ent.run_id, b.now, holder=holder, seq=seq, fairness=fairness, request_id=request_id
        ),
    )
    b.effects.commands.append(
        Grant(
            holder,
            seq,
            limit=ent.run_id,
            granted=True,
            reason="",
            sent_at_ms=b.now,
            request_id=request_id,
            value=ent.value,
        )
    )
