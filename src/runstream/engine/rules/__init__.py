"""The engine's rules: given a run's state and what happened, the facts to record and
the work to do next.

One module per record family, each a set of small handlers; `HANDLERS` below is the one
place that says which handler decides each command and each item of internal work
(`engine.decide` looks it up). Every handler takes the `Rules` (what the rules are
parameterised by), the batch it decides into, and the working copy of its run or entity;
each new fact is applied to that copy at once by `core.emit` (the shell drops it if the
transaction aborts). A handler raises `Rejected` to refuse its command; `engine.decide`
turns that into a dead letter. No I/O, and workflow code runs only through `replay`.

- `runs`: start, resume, query        - `signals`: signal
- `steps`: step outcome, recover, hand over; `remote`: remote attempts
- `timers`: due times                 - `children`: child runs
- `events`: named events              - `limits`: permits
- `schedules`: schedules              - `retry`, `cancel`
- `core`: the loop they all end in (advance, follow, compensate, park, emit)

Who may import it: `engine.decide` (and tests); it imports only from `engine` and
`schemas`, like the rest of the core. Its modules call one another, so they import
each other as modules (``core.emit(...)``), never names, which keeps the cycles safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstream.engine.rules import (
    cancel,
    children,
    events,
    limits,
    remote,
    retry,
    runs,
    schedules,
    signals,
    steps,
    timers,
)
from runstream.engine.rules.context import Activation, Rejected, Rules
from runstream.engine.state import RunState
from runstream.engine.work import Batch, HandOver, Recover, Resume, StepOutcome, TimerDue
from runstream.schemas.records import (
    Acquire,
    Cancel,
    ChildResult,
    DeliverEvent,
    Grant,
    Heartbeat,
    PublishEvent,
    Query,
    Release,
    Retry,
    ScheduleCommand,
    Signal,
    StartRun,
    StepResult,
    Subscribe,
)

__all__ = ["HANDLERS", "Activation", "Handler", "Rejected", "Rules"]

#: A handler: (rules, batch, the working copy of the run or entity, the command or work).
Handler = Callable[[Rules, Batch, RunState, Any], None]

#: Who decides what: by command type, then by internal work type.
HANDLERS: dict[type[object], Handler] = {
    # a run's commands
    StartRun: runs.start,
    Query: runs.query,
    Signal: signals.signal,
    Cancel: cancel.cancel,
    Retry: retry.retry,
    StepResult: remote.step_result,
    Heartbeat: remote.heartbeat,
    ChildResult: children.child_result,
    DeliverEvent: events.deliver_event,
    Grant: limits.grant,
    # an entity's commands
    PublishEvent: events.publish,  # ~event/<name>/<key>
    Subscribe: events.subscribe,
    Acquire: limits.acquire,  # ~limit/...
    Release: limits.release,
    ScheduleCommand: schedules.schedule,  # ~schedule/<name>
    # internal work
    StepOutcome: steps.step_outcome,
    TimerDue: timers.timer_due,
    Recover: steps.recover,
    Resume: runs.resume,
    HandOver: steps.hand_over,
}
