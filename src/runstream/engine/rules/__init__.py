"""The engine's rules: given a run's state and what happened, the facts to record and
the work to do next.

One module per record family, each a set of small handlers; `HANDLERS` below is the one
place that says which handler decides each command and each item of internal work, and
for which kind of state (`engine.state`: a run, or an event, limit or schedule entity);
`engine.decide` looks it up. Every handler takes the `Rules` (what the rules are
parameterised by), the batch it decides into, and the working copy of its run or entity;
each new fact is applied to that copy at once by `core.emit` (the shell drops it if the
transaction aborts). A handler raises `Rejected` to refuse its command; `engine.decide`
turns that into a dead letter. No I/O, and workflow code runs only through `replay`.

- `runs`: start, resume, query        - `signals`: signal
- `steps`: step outcome, recover, hand over; `remote`: remote attempts
- `timers`: due times                 - `children`: child runs
- `events`: named events              - `limits`: permits
- `schedules`: schedules              - `retry`, `cancel`
- `promises`: durable promises        - `queries`: live queries
- `pause`: pause, unpause             - `updates`: validated updates
- `taskgroups`: a task group's pause (remote steps held)
- `core`: the loop they all end in (advance, follow, compensate, park, emit)

Who may import it: `engine.decide` (and tests); it imports only from `engine` and
`schemas`, like the rest of the core. Its modules call one another, so they import
each other as modules (``core.emit(...)``), never names, which keeps the cycles safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from runstream.engine.rules import (
    cancel,
    children,
    events,
    limits,
    pause,
    promises,
    queries,
    remote,
    retry,
    runs,
    schedules,
    signals,
    steps,
    taskgroups,
    timers,
    updates,
)
from runstream.engine.rules.context import Activation, Rejected, Rules
from runstream.engine.state import (
    EventEntityState,
    LimitState,
    RunState,
    ScheduleState,
    State,
    TaskGroupState,
)
from runstream.engine.work import Batch, HandOver, Recover, Resume, StepOutcome, TimerDue
from runstream.schemas.records import (
    Acquire,
    Cancel,
    ChildResult,
    CompletePromise,
    DeliverEvent,
    Grant,
    Heartbeat,
    LiveQuery,
    Pause,
    PublishEvent,
    Query,
    Release,
    ReleaseTask,
    Retry,
    ScheduleCommand,
    Signal,
    StartRun,
    StepResult,
    Subscribe,
    Unpause,
    Update,
)

__all__ = ["HANDLERS", "Activation", "Entry", "Handler", "Rejected", "Rules"]

#: A handler: (rules, batch, the working copy of the run or entity, the command or work).
Handler = Callable[[Rules, Batch, Any, Any], None]


class Entry(NamedTuple):
    """What decides a record: the kind of state it is for (None: any), and its handler."""

    state: type[State] | tuple[type[State], ...] | None
    handler: Handler


#: Who decides what: by command type, then by internal work type. A command for another
#: kind of id than its entry's is refused (`engine.decide`).
HANDLERS: dict[type[object], Entry] = {
    # a run's commands
    StartRun: Entry(RunState, runs.start),
    Signal: Entry(RunState, signals.signal),
    Cancel: Entry(RunState, cancel.cancel),
    Retry: Entry(RunState, retry.retry),
    StepResult: Entry(RunState, remote.step_result),
    Heartbeat: Entry(RunState, remote.heartbeat),
    ChildResult: Entry(RunState, children.child_result),
    DeliverEvent: Entry(RunState, events.deliver_event),
    Grant: Entry(RunState, limits.grant),
    CompletePromise: Entry(RunState, promises.complete),
    Update: Entry(RunState, updates.update),
    Query: Entry(None, runs.query),  # any id: an entity's is a run not found
    LiveQuery: Entry(None, queries.live_query),  # likewise
    Pause: Entry((RunState, TaskGroupState), pause.pause),  # a run, or a task group
    Unpause: Entry((RunState, TaskGroupState), pause.unpause),
    ReleaseTask: Entry(RunState, taskgroups.release),
    # an entity's commands
    PublishEvent: Entry(EventEntityState, events.publish),
    Subscribe: Entry(EventEntityState, events.subscribe),
    Acquire: Entry(LimitState, limits.acquire),
    Release: Entry(LimitState, limits.release),
    ScheduleCommand: Entry(ScheduleState, schedules.schedule),
    # internal work
    StepOutcome: Entry(RunState, steps.step_outcome),
    TimerDue: Entry(None, timers.timer_due),  # a run's or an entity's own
    Recover: Entry(RunState, steps.recover),
    Resume: Entry(RunState, runs.resume),
    HandOver: Entry(RunState, steps.hand_over),
}
