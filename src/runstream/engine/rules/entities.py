"""Durable entities (`engine.entities`): the state an exclusive call gives back with its
lock, and the shared handlers answered on the lock's owner.

An exclusive call is a run, queued by its key's lock (a limit of one permit, `limits`);
the lock keeps the key's state. When a call's run ends (`core.emit`), `state_after` is the
state its Release gives back: the new one if the run completed, none (unchanged) if it
failed, was cancelled or timed out. A `LiveQuery` to a lock is a shared call (`shared`):
evaluated on the state as committed, answered at once, no fact."""

from __future__ import annotations

from typing import Any

from runstream.engine import payload
from runstream.engine.entities import SHOW, EntityDef, load_state
from runstream.engine.replay import _op as op_name
from runstream.engine.rules.context import Rules
from runstream.engine.state import LimitState, RunState
from runstream.engine.work import Batch
from runstream.schemas.records import (
    ENTITY_WORKFLOW_PREFIX,
    RUN_PERMIT_SEQ,
    Fact,
    LiveQuery,
    PermitRequested,
    QueryAnswer,
    RunCompleted,
    entity_lock_id,
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
    b.effects.replies.append((cmd.reply_to, answer))


def _waits(b: Batch, ent: LimitState) -> dict[str, list[str]]:
    """What each call in progress waits on (its open operations), for the calls whose
    run is on the lock's partition (a client's are: `records.entity_call_id`); a call
    from a workflow lives on another partition, and `runstream runs show` tells."""
    p, out = b.partition_of(ent.run_id), {}
    for holder, _seq in ent.held:
        st = b.load(p, holder)  # committed, read only
        if isinstance(st, RunState) and st.exists:
            out[holder] = [op_name(f) for _, f in sorted(st.pending.items())]
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
        return edef.call_shared(cmd.name, key, entries, asked.get("arg"))
