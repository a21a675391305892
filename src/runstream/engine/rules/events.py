"""Named events: the correlation entity ``~event/<name>/<key>`` keeps published events,
open waits and batches (publish, subscribe, close_batches); then the waiting run's side
(deliver_event). A run's wait is recorded by `core`, its timeout by `timers`."""

from __future__ import annotations

from runstream.engine import blobs, payload
from runstream.engine.rules import core
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import EventEntityState, RunState
from runstream.engine.work import Batch
from runstream.engine.workflow import WorkflowDef
from runstream.schemas.records import (
    BatchStarted,
    DeadLetter,
    DeliverEvent,
    EventAwaited,
    EventBatched,
    EventMatched,
    EventPublished,
    EventReceived,
    EventSubscribed,
    EventTimedOut,
    Kind,
    LifecycleEvent,
    PublishEvent,
    Reason,
    StartRun,
    Status,
    Subscribe,
    correlation_id,
)


def publish(ctx: Rules, b: Batch, corr: EventEntityState, cmd: PublishEvent) -> None:
    """An event reaches the entity of its name and key: every wait open there gets it,
    each workflow it triggers starts, and it is kept for its time to live. A retried
    publish (the same event id) counts once."""
    if cmd.event_id in corr.event_ids:
        return
    if problem := payload.not_json(cmd.payload):  # delivered, it would fail the waiting runs
        raise Rejected(Reason.INVALID_INPUT, f"the payload of event {cmd.name!r} is {problem}")
    now = b.now
    fact = EventPublished(  # its size was checked with the command's (Decider.handle)
        corr.run_id,
        now,
        name=cmd.name,
        event_id=cmd.event_id,
        payload=cmd.payload,
        key=cmd.key,
        expires_at_ms=now + cmd.ttl_ms,
    )
    core.emit(b, corr, fact)
    waiting = list(corr.subscriptions)
    for run_id, seq in waiting:
        _deliver(b, corr, run_id, seq, fact)
    started = _trigger(ctx, b, corr, cmd)
    if not (waiting or started or cmd.ttl_ms > 0):  # for analytics, not dead-lettered
        b.effects.lifecycle.append(
            LifecycleEvent(
                Kind.EVENT_UNMATCHED, corr.run_id, at_ms=now,
                reason=f"no run waited for event {cmd.name!r} (key {cmd.key!r}) and no "
                "workflow is triggered by it",
            )
        )  # fmt: skip


def _trigger(ctx: Rules, b: Batch, corr: EventEntityState, cmd: PublishEvent) -> int:
    """Start the workflows ``cmd`` triggers, once per event or per key, or add it to
    their batches; how many want it."""
    started = 0
    for wf in ctx.registry.triggered_by(cmd.name):
        if (wf.batch is not None or wf.window is not None) and blobs.parse(cmd.payload):
            # a batch's input holds its events' bytes: it takes no large payload
            why = f"a large payload cannot join a batch of workflow {wf.name!r}"
            _aside(ctx, b, f"event {cmd.name!r}: {why}", Reason.OVERSIZE)
            continue
        if wf.batch is not None or wf.window is not None:
            _batch(ctx, b, corr, wf, cmd)
            started += 1
            continue
        try:
            key = cmd.event_id if wf.event_key is None else wf.event_key(
                payload.loads(cmd.payload)
            )  # fmt: skip
        except Exception as exc:  # user code: its failure must not lose the event
            why = f"the key of workflow {wf.name!r} for event {cmd.name!r} failed: {exc!r}"
            _aside(ctx, b, why, Reason.INVALID_INPUT)
            continue
        run_id = f"{wf.name}:{key}"
        b.effects.commands.append(StartRun(run_id, wf.name, input=cmd.payload, sent_at_ms=b.now))
        started += 1
    return started


def _aside(ctx: Rules, b: Batch, why: str, code: Reason) -> None:
    """A dead letter for one delivery of an event that cannot be made (the others go on)."""
    letter = DeadLetter(
        ctx.limits.clip(why), "", partition=0, offset=-1, key=None, value=None, run_id=None,
        at_ms=b.now, code=code,
    )  # fmt: skip
    b.effects.dead_letters.append(letter)


def _batch(
    ctx: Rules, b: Batch, corr: EventEntityState, wf: WorkflowDef, cmd: PublishEvent
) -> None:
    """Add the event to the workflow's open batch here (starting the batch first if the
    event would make its input too large); start its run once it is full."""
    events = corr.batches.get(wf.name, [])
    size = sum(len(e.payload) + 1 for e in events) + len(cmd.payload) + 2
    if events and ctx.limits.too_large("a batch", size):
        _start_batch(b, corr, wf.name)
        events = []
    due = None
    if wf.window is not None:
        due = events[0].due_ms if events else b.now + int(wf.window * 1000)
    batched = EventBatched(
        corr.run_id, b.now, workflow=wf.name, event_id=cmd.event_id, payload=cmd.payload, due_ms=due
    )
    core.emit(b, corr, batched)
    if wf.batch is not None and len(corr.batches[wf.name]) >= wf.batch:
        _start_batch(b, corr, wf.name)


def close_batches(b: Batch, corr: EventEntityState) -> None:
    """The window of some batches here closed: start their runs."""
    for workflow, events in list(corr.batches.items()):
        if events and events[0].due_ms is not None and events[0].due_ms <= b.now:
            _start_batch(b, corr, workflow)


def _start_batch(b: Batch, corr: EventEntityState, workflow: str) -> None:
    events = corr.batches[workflow]
    key = corr.run_id.rsplit("/", 1)[-1]
    run_id = f"{workflow}:{key}:{events[0].event_id}"
    data = b"[" + b",".join(e.payload for e in events) + b"]"
    core.emit(b, corr, BatchStarted(corr.run_id, b.now, workflow=workflow, run=run_id))
    b.effects.commands.append(StartRun(run_id, workflow, input=data, sent_at_ms=b.now))


def subscribe(ctx: Rules, b: Batch, corr: EventEntityState, cmd: Subscribe) -> None:
    """A run waits for the next event here (or no longer does): give it the oldest
    event still within its time to live that it has not had, or keep the wait open."""
    if cmd.cancel:
        wait = (cmd.subscriber, cmd.seq)
        if wait in corr.subscriptions:
            core.emit(
                b,
                corr,
                EventMatched(
                    corr.run_id, b.now, subscriber=cmd.subscriber, seq=cmd.seq, event_id=""
                ),
            )
        # An earlier incarnation of the same wait (a retried run waits at the same seq) may
        # have been matched too: its event is on its way as well.
        if (
            not cmd.event_id
            and _kept(corr, corr.matched.get(wait), b.now)
            and all(run_id != cmd.subscriber for run_id, _ in corr.subscriptions)
        ):
            # The wait timed out with its kept event on the way: the run will give it
            # back. Undo the match now, so the run's next wait (which may subscribe
            # before the event returns) gets it rather than a later one. (An event not
            # kept, or a run with another wait open here: the give-back settles it.)
            _undo(b, corr, cmd.subscriber, cmd.seq, corr.matched[wait])
        if cmd.event_id:
            _given_back(b, corr, cmd)
        return
    wait = (cmd.subscriber, cmd.seq)
    if wait in corr.subscriptions or wait in corr.matched:
        # The same wait again (a retried run waits at the same seq): one subscription, and
        # one event, the one matched to it and on its way (or coming back) if any.
        return
    for event in corr.events:
        fresh = event.expires_at_ms > b.now
        if fresh and (cmd.subscriber, event.event_id) not in corr.delivered:
            _deliver(b, corr, cmd.subscriber, cmd.seq, event)
            return
    core.emit(b, corr, EventSubscribed(corr.run_id, b.now, subscriber=cmd.subscriber, seq=cmd.seq))


def _kept(corr: EventEntityState, event_id: str | None, now: int) -> bool:
    """``event_id`` is kept here and still within its time to live at ``now``."""
    return any(e.event_id == event_id and e.expires_at_ms > now for e in corr.events)


def _given_back(b: Batch, corr: EventEntityState, cmd: Subscribe) -> None:
    """The event matched to the run's wait at ``cmd.seq`` came back: that wait had
    timed out. The run's next wait here gets it now; with none open yet, the match
    is undone, so the next one gets it while it is within its time to live."""
    if (cmd.subscriber, cmd.seq) not in corr.matched and cmd.event_id in corr.event_ids:
        return  # undone already, when the wait's timeout came (`subscribe`)
    later = [s for run_id, s in corr.subscriptions if run_id == cmd.subscriber]
    if later:
        _deliver(b, corr, cmd.subscriber, min(later), cmd)
        return
    _undo(b, corr, cmd.subscriber, cmd.seq, cmd.event_id)


def _undo(b: Batch, corr: EventEntityState, run_id: str, seq: int, event_id: str) -> None:
    """The match of ``event_id`` to the wait ``seq`` of ``run_id`` is undone: the run's
    next wait gets the event while it is within its time to live."""
    undone = EventMatched(
        corr.run_id, b.now, subscriber=run_id, seq=seq, event_id=event_id, undone=True
    )
    core.emit(b, corr, undone)


def _deliver(
    b: Batch,
    corr: EventEntityState,
    run_id: str,
    seq: int,
    event: EventPublished | Subscribe,
) -> None:
    core.emit(
        b,
        corr,
        EventMatched(corr.run_id, b.now, subscriber=run_id, seq=seq, event_id=event.event_id),
    )
    data = event.payload or b"null"
    b.effects.commands.append(
        DeliverEvent(
            run_id,
            seq,
            name=event.name,
            event_id=event.event_id,
            payload=data,
            sent_at_ms=b.now,
            key=event.key,
        )
    )


def deliver_event(ctx: Rules, b: Batch, st: RunState, cmd: DeliverEvent) -> None:
    """The event matched to the run's wait at ``seq``. If that wait timed out first, or
    the run failed while it waited (a retry waits there again), the event goes back to
    its entity for the run's next wait: never lost."""
    waiting = st.pending.get(cmd.seq)
    if not isinstance(waiting, EventAwaited) or waiting.name != cmd.name:
        timed_out = isinstance(st.resolved.get(cmd.seq), EventTimedOut) and not st.terminal
        retryable = st.status in (Status.FAILED, Status.DEAD) and cmd.seq not in st.resolved
        if timed_out or retryable:
            corr = correlation_id(cmd.name, cmd.key)
            back = Subscribe(
                corr,
                cmd.name,
                subscriber=st.run_id,
                seq=cmd.seq,
                key=cmd.key,
                cancel=True,
                sent_at_ms=b.now,
                event_id=cmd.event_id,
                payload=cmd.payload,
            )
            b.effects.commands.append(back)
        return  # else the run ended, or it had this event already
    received = EventReceived(
        st.run_id, b.now, seq=cmd.seq, name=cmd.name, event_id=cmd.event_id, payload=cmd.payload
    )
    core.emit(b, st, received)
    core.advance(ctx, b, st)
