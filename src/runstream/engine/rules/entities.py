"""Durable entities (`engine.entities`): the state an exclusive call gives back with its
lock, and the shared handlers answered on the lock's owner.

An exclusive call is a run, queued by its key's lock (a limit of one permit, `limits`);
the lock keeps the key's state. When a call's run ends (`core.emit`), `state_after` is the
state its Release gives back: the new one if the run completed, none (unchanged) if it
failed, was cancelled or timed out. A `LiveQuery` to a lock is a shared call (`shared`):
evaluated on the state as committed, answered at once, no fact. A workflow's shared read
(`ask`) is the same `LiveQuery`, sent with the promise that its answer completes (`reply`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from runstream.engine import lifecycle, payload
from runstream.engine.entities import SHOW, EntityDef, load_state
from runstream.engine.limits import headers_bytes
from runstream.engine.requests import EntityRead, recorded_op
from runstream.engine.rules import core
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import LimitState, RunState
from runstream.engine.work import Batch
from runstream.schemas.records import (
    ENTITY_WORKFLOW_PREFIX,
    RUN_PERMIT_SEQ,
    TO_RUN,
    CompletePromise,
    Fact,
    LiveQuery,
    PermitRequested,
    PromiseCompleted,
    PromiseCreated,
    QueryAnswer,
    Reason,
    RunCompleted,
    entity_lock_id,
    promise_of,
)


def state_after(st: RunState, end: Fact, asked: PermitRequested) -> bytes | None:
    """The state an entity call's run gives back with its lock as it ends with ``end``:
    what its handler left if it completed; None (the state stays) otherwise, and for
    every other permit."""
    if asked.seq != RUN_PERMIT_SEQ or not st.workflow.startswith(ENTITY_WORKFLOW_PREFIX):
        return None
    if not isinstance(end, RunCompleted) or end.continued_as is not None:
        return None
    try:
        out = payload.loads(end.output)
    except ValueError:  # not the hidden workflow's output: nothing to keep
        return None
    if not isinstance(out, dict) or not isinstance(out.get("state"), dict):
        return None
    return payload.dumps(out["state"])


def shared(ctx: Rules, b: Batch, ent: LimitState, cmd: LiveQuery) -> None:
    """A shared call (or `SHOW`) to an entity's key, answered from its lock's state."""
    try:
        value = payload.dumps(_evaluate(ctx, b, ent, cmd))
        if too_large := ctx.limits.too_large(f"the answer of {cmd.name!r}", len(value)):
            raise ValueError(too_large)
    except Exception as exc:  # the handler's error, or a call that names no entity here
        error = ctx.limits.clip(f"{type(exc).__name__}: {exc}")
        answer = QueryAnswer(cmd.request_id, cmd.run_id, found=True, error=error)
    except BaseException:  # its time budget (runtime.budget)
        why = "the shared handler ran past its time budget (activation_budget)"
        answer = QueryAnswer(cmd.request_id, cmd.run_id, found=True, error=why)
    else:
        answer = QueryAnswer(cmd.request_id, cmd.run_id, found=True, value=value)
    reply(b, cmd, answer)


def ask(ctx: Rules, b: Batch, st: RunState, read: EntityRead) -> bool:
    """A workflow reads an entity's key: record the read's promise and send the shared
    call to the key's lock in this transaction, once (a replay finds the promise and
    waits for its answer). The call waits in the log for the lock's owner, if it has
    none now (a handover): a read never fails for want of an owner. An ask too large to
    send (its argument and headers) fails the read at once: True, the workflow goes on."""
    if read.seq in st.resolved:
        return False  # asked already
    due = None if read.timeout is None else b.now + int(read.timeout * 1000)
    created = PromiseCreated(
        st.run_id, b.now, seq=read.seq, promise_id=read.promise_id, timeout_at_ms=due
    )
    core.emit(b, st, created)
    size = len(read.arg) + headers_bytes(read.headers)
    if too_large := ctx.limits.too_large(f"the ask of read {read.handler!r}", size):
        core.emit(b, st, PromiseCompleted(st.run_id, b.now, seq=read.seq, error=too_large))
        return True
    asked = LiveQuery(
        read.lock,
        read.promise_id,
        reply_to=TO_RUN,
        name=read.handler,
        arg=read.arg,
        sent_at_ms=b.now,
        headers=read.headers,
    )
    b.effects.commands.append(asked)
    why = f"waiting for the answer of {read.handler!r} of {read.lock!r}"
    b.effects.lifecycle.append(replace(lifecycle.awaiting_promise(st, read.seq, b.now), reason=why))
    return False


def reply(b: Batch, cmd: LiveQuery, answer: QueryAnswer) -> None:
    """Send a shared call's answer: to a client on its replies partition, or to a run's
    read (`ask`) as the completion of its promise."""
    if cmd.reply_to != TO_RUN:
        b.effects.replies.append((cmd.reply_to, answer))
        return
    asker = promise_of(cmd.request_id)
    if asker is None:
        why = f"a read answered to a run needs its promise id, not {cmd.request_id!r}"
        raise Rejected(Reason.INVALID_INPUT, why)
    done = CompletePromise(
        asker[0],
        cmd.request_id,
        value=answer.value,
        error=answer.error,
        sent_at_ms=b.now,
        read=True,
    )
    b.effects.commands.append(done)


def _waits(b: Batch, ent: LimitState) -> dict[str, list[str]]:
    """What each call in progress waits on (its open operations), for the calls whose
    run is on the lock's partition (a client's are: `records.entity_call_id`); a call
    from a workflow lives on another partition, and `runstream runs show` tells."""
    p, out = b.partition_of(ent.run_id), {}
    for holder, _seq in ent.held:
        st = b.load(p, holder)  # committed, read only
        if isinstance(st, RunState) and st.exists:
            out[holder] = [recorded_op(f) for _, f in sorted(st.pending.items())]
    return out


def _evaluate(ctx: Rules, b: Batch, ent: LimitState, cmd: LiveQuery) -> Any:
    asked = payload.loads(cmd.arg)
    if not isinstance(asked, dict) or not isinstance(asked.get("key"), str):
        raise ValueError("a shared call's argument is {entity, key, arg}")
    name, key = str(asked.get("entity")), asked["key"]
    edef: EntityDef | None = ctx.registry.entities.get(name)
    if edef is None or entity_lock_id(name, key) != ent.run_id:
        raise LookupError(f"no entity {name!r} with key {key!r} here ({ent.run_id!r})")
    entries = load_state(ent.value)
    if cmd.name == SHOW:
        return {
            "entity": name,
            "key": key,
            "state": entries,
            "in_progress": [holder for holder, _seq in ent.held],
            "waits_on": _waits(b, ent),
            "queue": [q.holder for q in ent.queue],
        }
    with ctx.activation(ent.run_id):
        return edef.call_shared(cmd.name, key, entries, asked.get("arg"), cmd.headers)
