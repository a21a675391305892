"""Signals: one a waiting workflow takes at once, or keeps buffered for its next wait
(the wait itself is recorded by `core`; its timeout by `timers`)."""

from __future__ import annotations

from runstream.engine import payload
from runstream.engine.rules import core
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, Status
from runstream.engine.work import Batch
from runstream.schemas.records import Reason, Signal, SignalAwaited, SignalBuffered, SignalReceived


def signal(ctx: Rules, b: Batch, st: RunState, cmd: Signal) -> None:
    if not st.exists:
        raise Rejected(Reason.UNKNOWN_RUN, f"signal {cmd.name!r} for unknown run {st.run_id!r}")
    if st.terminal or cmd.signal_id in st.signal_ids:
        return  # a finished run takes no signals; a redelivered signal counts once
    if problem := payload.not_json(cmd.payload):  # recorded, it would fail the run
        raise Rejected(Reason.INVALID_INPUT, f"the payload of signal {cmd.name!r} is {problem}")
    waiting = [
        s for s, f in st.pending.items() if isinstance(f, SignalAwaited) and f.name == cmd.name
    ]
    if waiting and st.status is not Status.PARKED and st.compensation is None:
        core.emit(
            b,
            st,
            SignalReceived(
                st.run_id,
                b.now,
                seq=min(waiting),
                name=cmd.name,
                payload=cmd.payload,
                signal_id=cmd.signal_id,
            ),
        )
        core.advance(ctx, b, st)
    else:
        core.emit(
            b,
            st,
            SignalBuffered(
                st.run_id, b.now, name=cmd.name, payload=cmd.payload, signal_id=cmd.signal_id
            ),
        )
