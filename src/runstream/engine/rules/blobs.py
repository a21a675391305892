"""Large payloads the engine records (`engine.blobs`): a step's or a run's output, a
continue-as-new or child input, an update's result. Above the threshold the bytes go to
the blobs topic in the transaction that records their reference, so a blob is visible
exactly when its reference is; each run's blobs are bounded by its budget."""

from __future__ import annotations

from runstream.engine import blobs
from runstream.engine.limits import Limits
from runstream.engine.rules.context import Rules
from runstream.engine.state import RunState
from runstream.engine.work import Batch
from runstream.errors import BLOB_BUDGET, Failure
from runstream.schemas.records import RunFailed


def keep(ctx: Rules, b: Batch, st: RunState, what: str, data: bytes) -> tuple[bytes, str | None]:
    """What to record for the payload ``data`` of the run ``st`` (the bytes, or a
    reference to them written to the blobs topic in this batch), or why it cannot be
    recorded. A reference a client or a task worker wrote is checked at intake
    (`engine.decide`) and only counted here."""
    ref = blobs.parse(data)
    if ref is None and not ctx.limits.big(len(data)):
        return data, ctx.limits.too_large(what, len(data))
    size = len(data) if ref is None else ref.size
    problem = over_budget(ctx.limits, st, what, size)
    if problem:
        return b"", problem
    if ref is None:
        ref, chunks = blobs.split(data, ctx.limits.payload, b.now)
        b.effects.blobs.append(blobs.Blob(ref, chunks))
        store = blobs.ACTIVE.get()
        if store is not None:  # the run's next activation reads it before the commit
            store.remember(ref, data)
        data = ref.encode()
    return data, None


def over_budget(limits: Limits, st: RunState, what: str, size: int) -> str | None:
    """Why ``size`` more bytes of large payloads pass the run's budget, or None."""
    total, most = st.blob_bytes + size, limits.blob_budget
    if total <= most:
        return None
    return (
        f"{BLOB_BUDGET}{what} ({size:,} bytes) would take the large payloads of run "
        f"{st.run_id!r} to {total:,} bytes; its budget is {most:,} (Settings.blob_budget_bytes)"
    )


def failed(run_id: str, now: int, problem: str) -> RunFailed:
    """The end of a run whose payload could not be recorded (its code: `failure`)."""
    return RunFailed(run_id, now, error=problem, traceback="", code=failure(problem))


def failure(problem: str) -> str:
    """The `Failure` code of a payload that could not be recorded."""
    return Failure.BLOB_BUDGET if problem.startswith(BLOB_BUDGET) else Failure.BAD_OUTPUT
