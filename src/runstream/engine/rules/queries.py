"""Live queries: a `LiveQuery` asks the run's owner to call one of the workflow's query
handlers (`Context.query_handler`) on the workflow replayed to the run's current state,
and answers with a `QueryAnswer` on the asker's replies partition. A query records no
fact and runs no step: its transaction only consumes the command and sends the answer."""

from __future__ import annotations

from runstream.engine import payload, replay
from runstream.engine.rules import entities
from runstream.engine.rules.context import Rules
from runstream.engine.state import LimitState, RunState, State
from runstream.engine.work import Batch
from runstream.errors import QueryFailed
from runstream.schemas.records import LiveQuery, QueryAnswer


def live_query(ctx: Rules, b: Batch, st: State, cmd: LiveQuery) -> None:
    """Answer ``cmd`` from the run as it is now (an entity's id names no run; a durable
    entity's lock answers a shared call)."""
    if isinstance(st, LimitState):
        return entities.shared(ctx, b, st, cmd)
    found = isinstance(st, RunState) and st.exists
    answer = QueryAnswer(cmd.request_id, cmd.run_id, found=found)
    if isinstance(st, RunState) and found:
        try:
            value = _evaluate(ctx, b, st, cmd)
        except QueryFailed as exc:
            answer = QueryAnswer(
                cmd.request_id, cmd.run_id, found=True, error=ctx.limits.clip(str(exc))
            )
        else:
            answer = QueryAnswer(cmd.request_id, cmd.run_id, found=True, value=value)
    b.effects.replies.append((cmd.reply_to, answer))


def _evaluate(ctx: Rules, b: Batch, st: RunState, cmd: LiveQuery) -> bytes:
    """The handler's result as JSON that fits a reply. Raises QueryFailed."""
    wf = ctx.registry.get(st.workflow, st.version)
    if wf is None:
        raise QueryFailed(
            f"workflow {st.workflow!r} version {st.version!r} is not registered on the "
            "run's owner: it cannot replay the run to answer"
        )
    try:
        arg = payload.loads(cmd.arg)
    except ValueError as exc:
        raise QueryFailed(f"the argument of query {cmd.name!r} is not JSON: {exc}") from exc
    result = replay.query(
        wf,
        st,
        ctx.registry,
        b.now,
        cmd.name,
        arg,
        lambda: ctx.activation(st.run_id),
        cmd.headers,
    )
    try:
        data = payload.dumps(result)
    except Exception as exc:  # pydantic_core.PydanticSerializationError and friends
        raise QueryFailed(f"query {cmd.name!r} returned a value that is not JSON: {exc}") from exc
    if too_large := ctx.limits.too_large(f"the answer of query {cmd.name!r}", len(data)):
        raise QueryFailed(too_large)
    return data
