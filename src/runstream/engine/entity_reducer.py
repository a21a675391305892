"""The facts of the engine's own entities (`entity_state`), folded by kind: the only
place their states change (`reducer.apply` hands them here). Pure, as the reducer."""

from __future__ import annotations

from runstream.engine.entity_state import (
    EventEntityState,
    LimitState,
    ScheduleState,
    TaskGroupState,
)
from runstream.engine.state import UnknownFactError
from runstream.schemas.records import (
    BatchStarted,
    EventBatched,
    EventMatched,
    EventPublished,
    EventSubscribed,
    Fact,
    GroupPaused,
    GroupUnpaused,
    LimitSet,
    PermitGranted,
    PermitQueued,
    PermitReleased,
    ScheduleChanged,
    ScheduleFired,
    ScheduleSet,
    TaskHeld,
)

EntityState = EventEntityState | ScheduleState | LimitState | TaskGroupState


def apply_to_entity(state: EntityState, fact: Fact) -> None:
    """Fold ``fact`` into the entity ``state`` (in place)."""
    if isinstance(state, EventEntityState):
        _event_entity(state, fact)
    elif isinstance(state, LimitState):
        _limit(state, fact)
    elif isinstance(state, TaskGroupState):
        _task_group(state, fact)
    else:
        _schedule(state, fact)


def _event_entity(state: EventEntityState, fact: Fact) -> None:
    match fact:
        case EventPublished() | EventSubscribed() | EventMatched():
            _correlate(state, fact)
        case EventBatched():
            state.batches.setdefault(fact.workflow, []).append(fact)
        case BatchStarted():
            state.batches.pop(fact.workflow, None)
        case _:
            raise UnknownFactError(f"{type(fact).__name__} on event entity {state.run_id!r}")


def _task_group(state: TaskGroupState, fact: Fact) -> None:
    match fact:
        case GroupPaused():
            state.paused = fact
            state.pause_ids.add(fact.pause_id)
        case GroupUnpaused():  # its runs are sent their ReleaseTask with it
            state.paused, state.held = None, []
            state.pause_ids.add(fact.pause_id)
        case TaskHeld():
            state.held.append((fact.holder, fact.seq))
        case _:
            raise UnknownFactError(f"{type(fact).__name__} on task group {state.run_id!r}")


def _limit(state: LimitState, fact: Fact) -> None:
    match fact:
        case LimitSet():
            state.limit = fact
        case PermitQueued():
            state.queue.append(fact)
        case PermitGranted():
            _take_from_queue(state, fact.holder, fact.seq)
            state.held[fact.holder, fact.seq] = fact
            state.served[fact.fairness] = state.grants
            state.grants += 1
            if state.limit is not None and state.limit.rate:
                state.tat_ms = max(state.tat_ms, fact.at_ms) + 1000 / state.limit.rate
        case PermitReleased():
            if state.held.pop((fact.holder, fact.seq), None) is None:
                _take_from_queue(state, fact.holder, fact.seq)
            if fact.value is not None:  # a durable entity's call ended with this state
                state.value = fact.value
        case _:
            raise UnknownFactError(f"{type(fact).__name__} on limit entity {state.run_id!r}")


def _schedule(state: ScheduleState, fact: Fact) -> None:
    match fact:
        case ScheduleSet():
            state.schedule, state.paused, state.next_fire_ms = fact, False, fact.next_fire_ms
        case ScheduleFired():
            state.next_fire_ms = fact.next_fire_ms
        case ScheduleChanged():
            state.paused, state.next_fire_ms = fact.op == "paused", fact.next_fire_ms
            if fact.op == "deleted":
                state.schedule = None
        case _:
            raise UnknownFactError(f"{type(fact).__name__} on schedule entity {state.run_id!r}")


def _take_from_queue(state: LimitState, holder: str, seq: int) -> None:
    state.queue = [q for q in state.queue if (q.holder, q.seq) != (holder, seq)]


#: How many recent event ids a correlation entity remembers to count a retried publish once.
EVENT_IDS_KEPT = 1000


def _correlate(
    state: EventEntityState, fact: EventPublished | EventSubscribed | EventMatched
) -> None:
    """A correlation entity's events and waits. Only facts' own times are used, so the
    fold stays pure: an event is dropped once a later fact is past its time to live."""
    match fact:
        case EventPublished():
            state.events = [e for e in state.events if e.expires_at_ms > fact.at_ms]
            if fact.expires_at_ms > fact.at_ms:
                state.events.append(fact)
            state.event_ids = [*state.event_ids[-(EVENT_IDS_KEPT - 1) :], fact.event_id]
            kept = {e.event_id for e in state.events}
            state.delivered = {d for d in state.delivered if d[1] in kept}
            if len(state.matched) > EVENT_IDS_KEPT:  # bounded by the ids remembered
                known = set(state.event_ids)
                state.matched = {k: e for k, e in state.matched.items() if e in known}
        case EventSubscribed():
            state.subscriptions.append((fact.subscriber, fact.seq))
        case EventMatched(undone=True):  # given back: a later wait of the run may have it
            state.delivered.discard((fact.subscriber, fact.event_id))
            state.matched.pop((fact.subscriber, fact.seq), None)
        case EventMatched():
            if (fact.subscriber, fact.seq) in state.subscriptions:
                state.subscriptions.remove((fact.subscriber, fact.seq))
            if fact.event_id:
                state.delivered.add((fact.subscriber, fact.event_id))
                state.matched[fact.subscriber, fact.seq] = fact.event_id
