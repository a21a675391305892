"""The engine's rules: given a run's state and what happened, the facts to record and
the work to do next.

Every rule takes the batch it decides into and the run's working copy; each new fact is
applied to that copy at once (the shell drops it if the transaction aborts). A rule
raises `Rejected` to refuse its command; `engine.decide` turns that into a dead letter.
No I/O, and workflow code runs only through `replay`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from runstream.engine import cron, lifecycle, payload
from runstream.engine.limits import Limits
from runstream.engine.reducer import apply
from runstream.engine.replay import (
    Blocked,
    ChildCall,
    Completed,
    ContinuedAsNew,
    EventWait,
    Failed,
    NonDeterministic,
    Overran,
    Replay,
    Replayer,
    SignalWait,
    SleepCall,
    StepCall,
    replay,
)
from runstream.engine.state import BATCH_SEQ, RunState, Status
from runstream.engine.work import Batch, StepJob, StepOutcome, Waiter
from runstream.engine.workflow import Registry, StepDef, WorkflowDef
from runstream.errors import STEP_TIMED_OUT, TIMED_OUT, InvalidInput, WorkflowNotFound
from runstream.schemas.records import (
    END_FACTS,
    RUN_PERMIT_SEQ,
    Acquire,
    BatchStarted,
    Cancel,
    ChildEnded,
    ChildResult,
    ChildStarted,
    CompensationStarted,
    DeadLetter,
    DeliverEvent,
    EventAwaited,
    EventBatched,
    EventMatched,
    EventPublished,
    EventReceived,
    EventSubscribed,
    EventTimedOut,
    Fact,
    Grant,
    Heartbeat,
    Kind,
    LifecycleEvent,
    LimitSet,
    PermitGranted,
    PermitQueued,
    PermitReceived,
    PermitReleased,
    PermitRequested,
    PublishEvent,
    Query,
    Reason,
    Release,
    RetriedAsNew,
    Retry,
    RunCancelled,
    RunCompleted,
    RunDead,
    RunFailed,
    RunInfo,
    RunParked,
    RunRecovered,
    RunRetried,
    RunStarted,
    ScheduleChanged,
    ScheduleCommand,
    ScheduleFired,
    ScheduleSet,
    Signal,
    SignalAwaited,
    SignalBuffered,
    SignalReceived,
    SignalTimedOut,
    StartRun,
    StepCompleted,
    StepFailed,
    StepHandedOver,
    StepResult,
    StepStarted,
    StepTask,
    Subscribe,
    TimerFired,
    TimerScheduled,
    continuation_of,
    correlation_id,
    limit_id,
    run_id_problem,
    schedule_id,
)

Activation = Callable[[str], AbstractContextManager[None]]
#: A run's answer names this many of its children at most (the record has a size limit).
MAX_CHILDREN_SHOWN = 1000

OVERRAN = (
    "workflow code ran past its time budget (Settings.activation_budget) and was "
    "stopped: a loop or a blocking call in workflow code? Do I/O in steps"
)


class Rejected(Exception):
    """A command the engine refuses: it goes to the dead-letter topic with ``code``."""

    def __init__(self, code: Reason, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class Rules:
    """The rules, parameterised by the workflows one App registered."""

    def __init__(
        self,
        registry: Registry,
        limits: Limits,
        journal_topic: str,
        max_recovery_attempts: int = 3,
        activation: Activation | None = None,
    ) -> None:
        self.registry = registry
        self.replayer = Replayer(registry)
        self.journal_topic = journal_topic  # where a dead run's dead letter points
        self.limits = limits
        self.max_recovery_attempts = max_recovery_attempts
        # Brackets each run of workflow code (the shell gives it a time budget).
        self.activation: Activation = activation or (lambda _run: contextlib.nullcontext())

    # -- commands ------------------------------------------------------------------
    def start(self, b: Batch, st: RunState, cmd: StartRun) -> None:
        """StartRun: idempotent by run id. With ``signal`` (signal-with-start), the signal
        is delivered whether this starts the run or it exists already, once per id."""
        if st.exists:
            if cmd.signal is not None:
                self.signal(b, st, self._start_signal(st, cmd))
            return
        wf = self._checked(cmd.workflow, cmd.version, cmd.input)
        permit = self._run_permit(wf, cmd.run_id, cmd.input) if wf is not None else None
        version = cmd.version or (wf.version if wf else "")
        timeout_ms = cmd.timeout_ms
        if timeout_ms is None and wf is not None and wf.timeout is not None:
            timeout_ms = int(wf.timeout * 1000)
        self.emit(
            b,
            st,
            RunStarted(
                st.run_id,
                b.now,
                cmd.workflow,
                version,
                cmd.input,
                cmd.parent_run_id,
                dict(cmd.tags),
                cmd.reply_to,
                cmd.request_id,
                None if timeout_ms is None else b.now + timeout_ms,
                cmd.parent_seq,
            ),
        )
        if cmd.signal is not None:  # buffered: the workflow's wait takes it
            self.signal(b, st, self._start_signal(st, cmd))
        if permit is not None:  # no code runs before the permit comes
            self._request(b, st, permit)
            return
        self._advance(b, st)

    def _run_permit(self, wf: WorkflowDef, run_id: str, data: bytes) -> Acquire | None:
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
        return Acquire(ent, run_id, RUN_PERMIT_SEQ, concurrency=wf.limit, max_queued=wf.max_queued)

    @staticmethod
    def _start_signal(st: RunState, cmd: StartRun) -> Signal:
        assert cmd.signal is not None
        signal_id = cmd.signal_id or f"{st.run_id}/{cmd.signal}"
        data = b"null" if cmd.signal_payload is None else cmd.signal_payload
        return Signal(st.run_id, cmd.signal, data, signal_id, cmd.sent_at_ms)

    def _checked(self, workflow: str, version: str | None, data: bytes) -> WorkflowDef | None:
        """The workflow a start runs (None: a version this instance lacks, which parks the
        run), once ``data`` is a valid input for it; else Rejected."""
        wf: WorkflowDef | None
        try:
            if version:
                wf = self.registry.get(workflow, version)
                if wf is None:
                    self.registry.latest(workflow)  # the workflow must exist at all
            else:
                wf = self.registry.latest(workflow)
            if wf is not None:
                wf.parse_input(payload.loads(data))
        except WorkflowNotFound as exc:
            raise Rejected(Reason.UNKNOWN_WORKFLOW, str(exc)) from exc
        except InvalidInput as exc:
            raise Rejected(Reason.INVALID_INPUT, str(exc)) from exc
        except ValueError as exc:  # not JSON
            what = f"input of workflow {workflow!r} is not JSON"
            raise Rejected(Reason.INVALID_INPUT, f"{what}: {exc}") from exc
        return wf

    def signal(self, b: Batch, st: RunState, cmd: Signal) -> None:
        if not st.exists:
            raise Rejected(Reason.UNKNOWN_RUN, f"signal {cmd.name!r} for unknown run {st.run_id!r}")
        if st.terminal or cmd.signal_id in st.signal_ids:
            return  # a finished run takes no signals; a redelivered signal counts once
        waiting = [
            s for s, f in st.pending.items() if isinstance(f, SignalAwaited) and f.name == cmd.name
        ]
        if waiting and st.status is not Status.PARKED and st.compensation is None:
            self.emit(
                b,
                st,
                SignalReceived(
                    st.run_id, b.now, min(waiting), cmd.name, cmd.payload, cmd.signal_id
                ),
            )
            self._advance(b, st)
        else:
            self.emit(b, st, SignalBuffered(st.run_id, b.now, cmd.name, cmd.payload, cmd.signal_id))

    def cancel(self, b: Batch, st: RunState, cmd: Cancel) -> None:
        """Cancel a run. With ``compensate``, the steps in flight are waited for first,
        then every completed step's compensation runs, newest first."""
        if not st.exists:
            raise Rejected(Reason.UNKNOWN_RUN, f"cancel of unknown run {st.run_id!r}")
        if st.terminal or st.compensation is not None:
            return
        reason = self.limits.clip(cmd.reason or "cancelled")
        if not cmd.abandon_children:  # and theirs, as each child cancels its own
            for child in self._children(st):
                why = self.limits.clip(f"its parent {st.run_id!r} was cancelled: {reason}")
                b.effects.commands.append(
                    Cancel(child.child_run_id, cmd.compensate, why, b.now, False)
                )
        if cmd.compensate and (self._in_flight(st) or self._compensations(b, st)):
            self.emit(b, st, CompensationStarted(st.run_id, b.now, reason, "", True))
            self._compensate(b, st)
        else:
            self.emit(b, st, RunCancelled(st.run_id, b.now, reason))

    def retry(self, b: Batch, st: RunState, cmd: Retry) -> None:
        """Let a failed or dead run go on from its last completed step: the steps after it
        that failed for good run again, under their next attempt number; a completed step
        never does. A parked run is tried again now. Any other run stays as it is.
        With ``input``, see `_retry_as_new`."""
        if not st.exists:
            raise Rejected(Reason.UNKNOWN_RUN, f"retry of unknown run {st.run_id!r}")
        if cmd.input is not None:
            self._retry_as_new(b, st, cmd.input, self.limits.clip(cmd.reason or "retried"))
            return
        if st.status is Status.PARKED:
            self._advance(b, st)
            return
        if st.status not in (Status.FAILED, Status.DEAD):
            return  # running again already (a repeated retry), or ended for good
        if st.compensation is not None:
            raise Rejected(
                Reason.NOT_RETRYABLE,
                f"run {st.run_id!r} compensated its steps before it ended: it cannot go "
                "on; start a new run with the corrected input instead",
            )
        last_completed = max(
            (s for s, f in st.resolved.items() if isinstance(f, StepCompleted)), default=0
        )
        failed = sorted(
            s for s, f in st.resolved.items() if isinstance(f, StepFailed) and s > last_completed
        )
        reason = self.limits.clip(cmd.reason or "retried")
        wf = self.registry.get(st.workflow, st.version)
        permit = self._run_permit(wf, st.run_id, st.input) if wf is not None else None
        # A retried run has its whole timeout again, from the retry: its old deadline
        # may have passed (it may be why it failed), and it would fail again at once.
        deadline = None if st.timeout_ms is None else b.now + st.timeout_ms
        self.emit(b, st, RunRetried(st.run_id, b.now, failed, reason, deadline))
        if permit is not None:  # it gave its permit back when it ended: ask again
            self._request(b, st, permit)
            return
        self._advance(b, st)

    def _retry_as_new(self, b: Batch, st: RunState, data: bytes, reason: str) -> None:
        """An ended run is retried as a new run, ``<run_id>~<n>``, of the newest version of
        its workflow with corrected input, started in this transaction; each history links
        to the other (RetriedAsNew here, the tag ``retry_of`` there)."""
        run_id = st.run_id
        if not st.terminal or st.continued_as or st.retried_as:
            why = (
                f"it is {st.status}"
                if not st.terminal
                else f"it already carries on as {st.continued_as or st.retried_as}"
            )
            raise Rejected(
                Reason.NOT_RETRYABLE, f"run {run_id!r} can't be retried with new input: {why}"
            )
        self._checked(st.workflow, None, data)
        tags = {**st.tags, "retry_of": run_id}
        size = len(data) + sum(len(k) + len(v) for k, v in tags.items())
        problem = self.limits.too_large("the new input with the run's tags", size)
        if problem:
            raise Rejected(Reason.OVERSIZE, problem)
        successor = continuation_of(run_id)
        self.emit(b, st, RetriedAsNew(run_id, b.now, successor, reason))
        self._start_successor(b, st, successor, data, tags, parent_seq=None)

    # -- schedules: an entity ~schedule/<name> per schedule ---------------------------------
    def schedule(self, b: Batch, ent: RunState, cmd: ScheduleCommand) -> None:
        """Set (create or replace), pause, resume or delete a schedule."""
        name = ent.run_id.removeprefix(schedule_id(""))
        now = b.now
        match cmd.op:
            case "set":
                problem = cron.problem(cmd.cron, cmd.tz)
                if problem:
                    raise Rejected(Reason.INVALID_INPUT, f"schedule {name!r}: {problem}")
                data = b"null" if cmd.input is None else cmd.input
                self._checked(cmd.workflow, None, data)
                first = cron.next_fire(cmd.cron, cmd.tz, now)
                fact = ScheduleSet(
                    ent.run_id, now, name, cmd.workflow, data, cmd.cron, cmd.tz, first
                )
                self.emit(b, ent, fact)
            case "pause" | "resume" | "delete" if ent.schedule is None:
                raise Rejected(Reason.UNKNOWN_RUN, f"no schedule {name!r}")
            case "pause" if not ent.paused:
                self.emit(b, ent, ScheduleChanged(ent.run_id, now, "paused", None))
            case "resume" if ent.paused:
                assert ent.schedule is not None
                nxt = cron.next_fire(ent.schedule.cron, ent.schedule.tz, now)  # skip the missed
                self.emit(b, ent, ScheduleChanged(ent.run_id, now, "resumed", nxt))
            case "delete":
                self.emit(b, ent, ScheduleChanged(ent.run_id, now, "deleted", None))
            case "pause" | "resume":
                pass  # already so
            case _:
                raise Rejected(Reason.INVALID_INPUT, f"no schedule operation {cmd.op!r}")

    def _fire(self, b: Batch, ent: RunState) -> None:
        """The schedule's next fire time came: start its workflow once, for the latest fire
        time due (fires missed while no engine ran are caught up once, not each), with a
        run id derived from that time, and arm the next."""
        s, due = ent.schedule, ent.next_fire_ms
        if s is None or ent.paused or due is None or due > b.now:
            return
        fire = max(due, cron.latest_fire(s.cron, s.tz, b.now))
        run_id = f"{s.name}@{cron.iso(fire)}"
        nxt = cron.next_fire(s.cron, s.tz, max(fire, b.now))
        self.emit(b, ent, ScheduleFired(ent.run_id, b.now, fire, run_id, nxt))
        start = StartRun(run_id, s.workflow, s.input, tags={"schedule": s.name}, sent_at_ms=b.now)
        b.effects.commands.append(start)

    # -- named events: the correlation entity's side, then the waiting run's -------------
    def publish(self, b: Batch, corr: RunState, cmd: PublishEvent) -> None:
        """An event reaches the entity of its name and key: every wait open there gets it,
        each workflow it triggers starts, and it is kept for its time to live. A retried
        publish (the same event id) counts once."""
        if cmd.event_id in corr.event_ids:
            return
        now = b.now
        fact = EventPublished(  # its size was checked with the command's (Decider.handle)
            corr.run_id, now, cmd.name, cmd.event_id, cmd.payload, cmd.key, now + cmd.ttl_ms
        )
        self.emit(b, corr, fact)
        waiting = list(corr.subscriptions)
        for run_id, seq in waiting:
            self._deliver(b, corr, run_id, seq, fact)
        started = self._trigger(b, corr, cmd)
        if not (waiting or started or cmd.ttl_ms > 0):  # for analytics, not dead-lettered
            b.effects.lifecycle.append(
                LifecycleEvent(
                    Kind.EVENT_UNMATCHED, corr.run_id, now,
                    reason=f"no run waited for event {cmd.name!r} (key {cmd.key!r}) and no "
                    "workflow is triggered by it",
                )
            )  # fmt: skip

    def _trigger(self, b: Batch, corr: RunState, cmd: PublishEvent) -> int:
        """Start the workflows ``cmd`` triggers, once per event or per key, or add it to
        their batches; how many want it."""
        started = 0
        for wf in self.registry.triggered_by(cmd.name):
            if wf.batch is not None or wf.window is not None:
                self._batch(b, corr, wf, cmd)
                started += 1
                continue
            try:
                key = cmd.event_id if wf.event_key is None else wf.event_key(
                    payload.loads(cmd.payload)
                )  # fmt: skip
            except Exception as exc:  # user code: its failure must not lose the event
                reason = self.limits.clip(
                    f"the key of workflow {wf.name!r} for event {cmd.name!r} failed: {exc!r}"
                )
                b.effects.dead_letters.append(
                    DeadLetter(reason, "", 0, -1, None, None, None, b.now, Reason.INVALID_INPUT)
                )
                continue
            run_id = f"{wf.name}:{key}"
            b.effects.commands.append(StartRun(run_id, wf.name, cmd.payload, sent_at_ms=b.now))
            started += 1
        return started

    def _batch(self, b: Batch, corr: RunState, wf: WorkflowDef, cmd: PublishEvent) -> None:
        """Add the event to the workflow's open batch here (starting the batch first if the
        event would make its input too large); start its run once it is full."""
        events = corr.batches.get(wf.name, [])
        size = sum(len(e.payload) + 1 for e in events) + len(cmd.payload) + 2
        if events and self.limits.too_large("a batch", size):
            self._start_batch(b, corr, wf.name)
            events = []
        due = None
        if wf.window is not None:
            due = events[0].due_ms if events else b.now + int(wf.window * 1000)
        batched = EventBatched(corr.run_id, b.now, wf.name, cmd.event_id, cmd.payload, due)
        self.emit(b, corr, batched)
        if wf.batch is not None and len(corr.batches[wf.name]) >= wf.batch:
            self._start_batch(b, corr, wf.name)

    def close_batches(self, b: Batch, corr: RunState) -> None:
        """The window of some batches here closed: start their runs."""
        for workflow, events in list(corr.batches.items()):
            if events and events[0].due_ms is not None and events[0].due_ms <= b.now:
                self._start_batch(b, corr, workflow)

    def _start_batch(self, b: Batch, corr: RunState, workflow: str) -> None:
        events = corr.batches[workflow]
        key = corr.run_id.rsplit("/", 1)[-1]
        run_id = f"{workflow}:{key}:{events[0].event_id}"
        data = b"[" + b",".join(e.payload for e in events) + b"]"
        self.emit(b, corr, BatchStarted(corr.run_id, b.now, workflow, run_id))
        b.effects.commands.append(StartRun(run_id, workflow, data, sent_at_ms=b.now))

    def subscribe(self, b: Batch, corr: RunState, cmd: Subscribe) -> None:
        """A run waits for the next event here (or no longer does): give it the oldest
        event still within its time to live that it has not had, or keep the wait open."""
        if cmd.cancel:
            if (cmd.subscriber, cmd.seq) in corr.subscriptions:
                self.emit(b, corr, EventMatched(corr.run_id, b.now, cmd.subscriber, cmd.seq, ""))
            if cmd.event_id:
                self._given_back(b, corr, cmd)
            return
        for event in corr.events:
            fresh = event.expires_at_ms > b.now
            if fresh and (cmd.subscriber, event.event_id) not in corr.delivered:
                self._deliver(b, corr, cmd.subscriber, cmd.seq, event)
                return
        self.emit(b, corr, EventSubscribed(corr.run_id, b.now, cmd.subscriber, cmd.seq))

    def _given_back(self, b: Batch, corr: RunState, cmd: Subscribe) -> None:
        """The event matched to the run's wait at ``cmd.seq`` came back: that wait had
        timed out. The run's next wait here gets it now; with none open yet, the match
        is undone, so the next one gets it while it is within its time to live."""
        later = [s for run_id, s in corr.subscriptions if run_id == cmd.subscriber]
        if later:
            self._deliver(b, corr, cmd.subscriber, min(later), cmd)
            return
        undone = EventMatched(corr.run_id, b.now, cmd.subscriber, cmd.seq, cmd.event_id, True)
        self.emit(b, corr, undone)

    def _deliver(
        self, b: Batch, corr: RunState, run_id: str, seq: int, event: EventPublished | Subscribe
    ) -> None:
        self.emit(b, corr, EventMatched(corr.run_id, b.now, run_id, seq, event.event_id))
        data = event.payload or b"null"
        b.effects.commands.append(
            DeliverEvent(run_id, seq, event.name, event.event_id, data, b.now, event.key)
        )

    def deliver_event(self, b: Batch, st: RunState, cmd: DeliverEvent) -> None:
        """The event matched to the run's wait at ``seq``. If that wait timed out first,
        the event goes back to its entity for the run's next wait: never lost."""
        waiting = st.pending.get(cmd.seq)
        if not isinstance(waiting, EventAwaited) or waiting.name != cmd.name:
            if isinstance(st.resolved.get(cmd.seq), EventTimedOut) and not st.terminal:
                corr = correlation_id(cmd.name, cmd.key)
                back = Subscribe(
                    corr, cmd.name, st.run_id, cmd.seq, cmd.key, True, b.now, cmd.event_id,
                    cmd.payload,
                )  # fmt: skip
                b.effects.commands.append(back)
            return  # else the run ended, or it had this event already
        received = EventReceived(st.run_id, b.now, cmd.seq, cmd.name, cmd.event_id, cmd.payload)
        self.emit(b, st, received)
        self._advance(b, st)

    def child_result(self, b: Batch, st: RunState, cmd: ChildResult) -> None:
        """An awaited child ended: settle the parent's seq and go on."""
        started = st.pending.get(cmd.seq)
        if not (isinstance(started, ChildStarted) and started.child_run_id == cmd.child_run_id):
            told = st.resolved.get(cmd.seq)
            again = isinstance(told, ChildEnded) and told.child_run_id == cmd.child_run_id
            if st.terminal or again:
                return  # the parent ended first, or it was told already
            raise Rejected(
                Reason.UNEXPECTED_RESULT,
                f"run {st.run_id!r} awaits no child {cmd.child_run_id!r} at seq {cmd.seq}",
            )
        ended = ChildEnded(
            st.run_id, b.now, cmd.seq, started.name, cmd.child_run_id, cmd.status, cmd.output,
            cmd.error,
        )  # fmt: skip
        self.emit(b, st, ended)
        self._advance(b, st)

    def step_result(self, b: Batch, st: RunState, cmd: StepResult) -> None:
        """A remote step's result: it settles the attempt only if that attempt is still
        open. Any other (late, duplicated, from a worker presumed dead) changes nothing
        and is told on the lifecycle stream; a result for no run is dead-lettered."""
        started = st.pending.get(cmd.seq)
        if not (
            isinstance(started, StepStarted)
            and started.remote
            and started.attempt_id == cmd.attempt_id
            and started.attempt == cmd.attempt
        ):
            if not st.exists:
                raise Rejected(
                    Reason.UNKNOWN_RUN,
                    f"a result of step {cmd.seq} (attempt id {cmd.attempt_id!r}) for run "
                    f"{st.run_id!r}, which does not exist",
                )
            self._ignore_result(b, st, cmd, started)
            return
        self.step_outcome(
            b,
            st,
            StepOutcome(
                b.partition_of(st.run_id),
                st.run_id,
                cmd.seq,
                cmd.attempt,
                cmd.ok,
                cmd.output,
                cmd.error,
                cmd.traceback,
                cmd.retryable,
                cmd.duration_ms,
            ),
        )

    def _ignore_result(
        self, b: Batch, st: RunState, cmd: StepResult, open_fact: object | None
    ) -> None:
        if isinstance(open_fact, StepStarted) and open_fact.remote:
            why = f"attempt {open_fact.attempt_id!r} is the open one"
        elif st.terminal:
            why = f"the run is {st.status}"
        elif cmd.seq in st.resolved:
            why = "the step is settled already"
        else:
            why = "no remote attempt of that step is open"
        reason = f"result of attempt {cmd.attempt_id!r} ignored: {why}"
        b.effects.lifecycle.append(
            LifecycleEvent(
                Kind.STEP_RESULT_IGNORED,
                st.run_id,
                b.now,
                st.workflow,
                st.version,
                st.status,
                seq=cmd.seq,
                attempt=cmd.attempt,
                reason=reason,
            )
        )

    def heartbeat(self, b: Batch, st: RunState, cmd: Heartbeat) -> None:
        """A remote attempt is alive: its liveness counts from now. Not a fact (the
        projection keeps it); a heartbeat for an attempt no longer open is dropped."""
        started = st.pending.get(cmd.seq)
        if isinstance(started, StepStarted) and started.attempt_id == cmd.attempt_id:
            st.beats[cmd.seq] = (b.now, cmd.details)

    # -- limits: permits owned by the limit's entity (docs/remote-steps.md, 4) ------------
    def _request(self, b: Batch, st: RunState, ask: Acquire) -> None:
        """Ask the limit for a permit; the run waits at ``ask.seq`` for the Grant."""
        # Its id names it apart from every other request (the Grant and the Release name
        # it): the fact's index in the run's history, unique even for a request withdrawn
        # and asked again at the same seq within one millisecond.
        request_id = f"{ask.seq}.{ask.attempt}.{st.facts}"
        asked = PermitRequested(st.run_id, b.now, ask.seq, ask.run_id, ask.attempt, request_id)
        self.emit(b, st, asked)
        b.effects.commands.append(replace(ask, sent_at_ms=b.now, request_id=request_id))

    def grant(self, b: Batch, st: RunState, cmd: Grant) -> None:
        """A limit's answer. A permit nobody waits for any more (the run ended, or it
        compensates, or the grant answers an earlier request, withdrawn: a run timed out
        and retried at once asks again at the same seq) goes straight back."""
        asked = st.pending.get(cmd.seq)
        if not (
            isinstance(asked, PermitRequested)
            and asked.limit == cmd.limit
            and asked.request_id == cmd.request_id
            and (st.compensation is None or cmd.seq < 0)
        ):
            if cmd.granted:  # that request's permit only, not one the run waits for now
                back = Release(cmd.limit, st.run_id, cmd.seq, b.now, cmd.request_id)
                b.effects.commands.append(back)
            return
        received = PermitReceived(
            st.run_id, b.now, cmd.seq, cmd.limit, asked.attempt, cmd.granted, cmd.reason
        )
        self.emit(b, st, received)
        if not cmd.granted:  # only a run's own permit is ever refused (max_queued)
            self.emit(b, st, RunFailed(st.run_id, b.now, f"QueueFull: {cmd.reason}", ""))
            return
        self._advance(b, st)

    def acquire(self, b: Batch, ent: RunState, cmd: Acquire) -> None:
        """A limit entity is asked for a permit: grant it now if the limit allows and
        nobody waits, else queue it (or refuse it, past ``max_queued``)."""
        if ent.asked(cmd.holder, cmd.seq):
            return  # asked twice (a redone transaction's command): once counts
        lim = ent.limit
        settings = (cmd.concurrency, cmd.rate, cmd.burst, cmd.max_queued)
        if lim is None or (lim.concurrency, lim.rate, lim.burst, lim.max_queued) != settings:
            self.emit(b, ent, LimitSet(ent.run_id, b.now, *settings))
        if not ent.queue and ent.can_grant(b.now):
            self._give(b, ent, cmd.holder, cmd.seq, cmd.fairness, cmd.request_id)
            return
        if cmd.max_queued is not None and len(ent.queue) >= cmd.max_queued:
            reason = (
                f"{len(ent.queue)} runs wait for {ent.run_id} already (max_queued={cmd.max_queued})"
            )
            refused = Grant(cmd.holder, cmd.seq, ent.run_id, False, reason, b.now, cmd.request_id)
            b.effects.commands.append(refused)
            return
        queued = PermitQueued(
            ent.run_id, b.now, cmd.holder, cmd.seq, cmd.priority, cmd.fairness, cmd.request_id
        )
        self.emit(b, ent, queued)

    def release(self, b: Batch, ent: RunState, cmd: Release) -> None:
        """A permit comes back (or a waiting request is withdrawn): grant the next. Only
        a Release naming the request's id (from the holder's Acquire) counts: one by
        anybody else frees nothing."""
        if ent.request_of(cmd.holder, cmd.seq) == cmd.request_id:
            self.emit(b, ent, PermitReleased(ent.run_id, b.now, cmd.holder, cmd.seq))
            self._grant_waiting(b, ent)

    def _grant_waiting(self, b: Batch, ent: RunState) -> None:
        """Grant waiting requests while the limit allows: the highest priority first,
        then the fairness key served longest ago, then the earliest request."""
        while ent.queue and ent.can_grant(b.now):
            top = max(q.priority for q in ent.queue)
            waiting = [(ent.served.get(q.fairness, -1), i, q) for i, q in enumerate(ent.queue)]
            _, _, q = min(w for w in waiting if w[2].priority == top)
            self._give(b, ent, q.holder, q.seq, q.fairness, q.request_id)

    def _give(
        self, b: Batch, ent: RunState, holder: str, seq: int, fairness: str, request_id: str
    ) -> None:
        self.emit(b, ent, PermitGranted(ent.run_id, b.now, holder, seq, fairness, request_id))
        b.effects.commands.append(Grant(holder, seq, ent.run_id, True, "", b.now, request_id))

    @staticmethod
    def _give_back(b: Batch, st: RunState, seq: int) -> None:
        """The attempt at ``seq`` ends: its permit, if it had one, goes back."""
        asked = st.permits.get(seq)
        if asked is not None:
            release = Release(asked.limit, st.run_id, seq, b.now, asked.request_id)
            b.effects.commands.append(release)

    def query(self, b: Batch, st: RunState, cmd: Query) -> None:
        """Answer now, or (``wait``) once the run ends: the shell keeps the question."""
        if cmd.wait and st.exists and not st.terminal:
            p = b.partition_of(st.run_id)
            b.effects.waiters.append(Waiter(p, st.run_id, cmd.reply_to, cmd.request_id))
        else:
            b.effects.replies.append((cmd.reply_to, self.run_info(st, cmd.request_id)))

    def run_info(self, st: RunState, request_id: str) -> RunInfo:
        """What a Query learns about a run; never larger than a record may be."""
        found = st.exists or st.status is Status.REJECTED
        size = len(st.input) * st.exists + len(st.output or b"")
        too_large = self.limits.too_large("the run's input and output together", size)
        if too_large:
            return RunInfo(
                request_id,
                st.run_id,
                found,
                st.status,
                st.workflow,
                st.version,
                steps=st.steps,
                reply_error=too_large,
            )
        return RunInfo(
            request_id,
            st.run_id,
            found,
            st.status if found else "",
            st.workflow,
            st.version,
            st.input if st.exists else None,
            st.output,
            st.error,
            st.reason,
            st.started_at_ms if st.exists else None,
            st.ended_at_ms,
            st.steps,
            st.continued_as,
            code=st.code,
            parent_run_id=st.parent_run_id,
            children=_child_ids(st)[:MAX_CHILDREN_SHOWN],
        )

    # -- internal work ---------------------------------------------------------------
    def step_outcome(self, b: Batch, st: RunState, o: StepOutcome) -> None:
        """A step attempt ended. Stale outcomes (an older attempt, a finished run) are dropped."""
        started = st.pending.get(o.seq)
        if not isinstance(started, StepStarted) or started.attempt != o.attempt:
            return
        clip = self.limits.clip
        self._give_back(b, st, o.seq)
        too_large = self.limits.too_large("the step's output", len(o.output)) if o.ok else None
        if o.ok and not too_large:
            self.emit(
                b,
                st,
                StepCompleted(
                    st.run_id, b.now, o.seq, started.name, o.output, o.attempt, o.duration_ms
                ),
            )
        else:
            policy = self.registry.step_by_name(started.name).policy
            # While compensating, a failed step is not retried (a compensation is).
            retry = (
                not too_large
                and o.retryable
                and o.attempt <= policy.retries
                and (o.seq < 0 or st.compensation is None)
            )
            retry_at = b.now + int(policy.delay(o.attempt) * 1000) if retry else None
            error = too_large or o.error or ""
            self.emit(
                b,
                st,
                StepFailed(
                    st.run_id,
                    b.now,
                    o.seq,
                    started.name,
                    o.attempt,
                    clip(error),
                    clip(o.traceback or ""),
                    retry_at,
                ),
            )
            if retry:
                return
        self._advance(b, st)

    def timer_due(self, b: Batch, st: RunState, seq: int) -> None:
        """A due time of ``seq`` passed: fire the timer, retry the step, time the wait out,
        or (seq 0) time the run out."""
        if seq == BATCH_SEQ and st.batches:  # an event entity's batch window
            self.close_batches(b, st)
            return
        if seq == 0:  # the run's own deadline, a schedule's next fire, a limit's next grant
            if st.limit is not None:
                self._grant_waiting(b, st)
            elif st.schedule is not None:
                self._fire(b, st)
            else:
                self._time_out(b, st)
            return
        fact = st.pending.get(seq)
        if fact is None or st.status is Status.PARKED:
            return
        match fact:
            case TimerScheduled(due_ms=due) if due <= b.now:
                self.emit(b, st, TimerFired(st.run_id, b.now, seq))
            case SignalAwaited(timeout_at_ms=int(due), name=name) if due <= b.now:
                self.emit(b, st, SignalTimedOut(st.run_id, b.now, seq, name))
            case StepFailed(retry_at_ms=int(due)) if due <= b.now:
                pass  # _advance starts the next attempt
            case StepStarted() if fact.remote:
                self._check_liveness(b, st, seq, fact)
                return
            case EventAwaited(timeout_at_ms=int(due), name=name, key=key) if due <= b.now:
                self.emit(b, st, EventTimedOut(st.run_id, b.now, seq, name))
                corr = correlation_id(name, key)  # the event may come: not for this wait
                b.effects.commands.append(Subscribe(corr, name, st.run_id, seq, key, True, b.now))
            case _:
                return
        self._advance(b, st)

    def _check_liveness(self, b: Batch, st: RunState, seq: int, started: StepStarted) -> None:
        """A remote attempt's time may be up: no result by its deadline, or no heartbeat
        for its interval. Then it fails as timed out, and is retried by its policy."""
        p = b.partition_of(st.run_id)
        due = st.liveness_due(seq, started, since=b.since(p))
        if due is None or due > b.now:
            if due is not None and due != st.liveness_due(seq, started):
                # Its heartbeats before this instance took over were not seen here: it
                # gets one full interval from the takeover (this re-arms its timer).
                st.beats[seq] = (b.since(p), st.beats.get(seq, (0, None))[1])
            return
        if started.deadline_ms is not None and started.deadline_ms <= b.now:
            took = (started.deadline_ms - started.at_ms) / 1000
            error = f"sent no result within its timeout of {took:g}s"
        else:
            assert started.heartbeat_ms is not None
            error = f"sent no heartbeat for {started.heartbeat_ms / 1000:g}s"
        beat = st.beats.get(seq)
        if beat is not None and beat[1] is not None:
            error += f" (last heartbeat: {beat[1].decode(errors='replace')})"
        error = (
            f"{STEP_TIMED_OUT}remote step {started.name!r} (task group {started.group!r}) {error}"
        )
        self.step_outcome(
            b, st, StepOutcome(p, st.run_id, seq, started.attempt, False, error=error)
        )

    def _time_out(self, b: Batch, st: RunState) -> None:
        """The run passed its execution timeout: it fails with RunTimedOut, after waiting
        for its steps in flight and compensating what completed, like any failure."""
        due = st.deadline_ms
        if due is None or due > b.now or st.terminal or st.compensation is not None:
            return  # not yet, or already ending
        took = (st.timeout_ms or due - st.started_at_ms) / 1000
        error = f"{TIMED_OUT}run {st.run_id!r} did not end within its timeout of {took:g}s"
        if self._in_flight(st) or self._compensations(b, st):
            self.emit(b, st, CompensationStarted(st.run_id, b.now, error, "", False))
            self._compensate(b, st)
        else:
            self.emit(b, st, RunFailed(st.run_id, b.now, error, ""))

    def recover(self, b: Batch, st: RunState) -> None:
        """After a restore: start again the steps that were open in a process that is gone.

        A step a graceful handover let go (StepHandedOver) starts again at once, under the
        same attempt number: a stop or a rebalance charges nothing.

        A step started but never finished ran in a process that crashed. Those run again
        one at a time, alone in the process (``isolated``). A crash while a step ran alone
        is the run's own doing and is charged to it; past ``max_recovery_attempts`` the run
        is dead. A crash that took down a step running beside others charges nobody, so a
        poison step never takes its co-runners along.
        """
        seqs, handed = st.running_steps(), st.handed_over_steps()
        if not (seqs or handed) or st.terminal:
            return
        if self.registry.get(st.workflow, st.version) is None:
            self._advance(b, st)  # parks it; recovered once its code is back
            return
        charged = any(isinstance(f := st.pending[s], StepStarted) and f.isolated for s in seqs)
        recoveries = st.recoveries + charged
        if recoveries > self.max_recovery_attempts:
            names = ", ".join(sorted({st.pending[s].name for s in seqs}))  # type: ignore[union-attr]
            reason = (
                f"step {names} was running alone when its engine process died, "
                f"{recoveries} times; max_recovery_attempts={self.max_recovery_attempts}"
            )
            self.emit(b, st, RunDead(st.run_id, b.now, reason))
            b.effects.dead_letters.append(
                DeadLetter(
                    f"run dead: {reason}",
                    self.journal_topic,
                    b.partition_of(st.run_id),
                    -1,
                    st.run_id.encode(),
                    None,
                    st.run_id,
                    b.now,
                    Reason.RUN_DEAD,
                )
            )
            return
        for seq in seqs:
            started = st.pending[seq]
            assert isinstance(started, StepStarted)
            self.emit(b, st, RunRecovered(st.run_id, b.now, seq, recoveries))
            self.emit(
                b,
                st,
                StepStarted(
                    st.run_id, b.now, seq, started.name, started.attempt + 1, isolated=True
                ),
            )
        for seq in handed:
            let_go = st.pending[seq]
            assert isinstance(let_go, StepHandedOver)
            self.emit(b, st, StepStarted(st.run_id, b.now, seq, let_go.name, let_go.attempt))
        self._advance(b, st, relaunch=frozenset(seqs + handed))

    def hand_over(self, b: Batch, st: RunState, began: frozenset[int]) -> None:
        """The instance lets the run's partition go: its steps still open here are handed
        over to the next owner (see `recover`). ``began``: the seqs whose body had begun."""
        if st.terminal:
            return
        for seq in st.running_steps():
            started = st.pending[seq]
            assert isinstance(started, StepStarted)
            let_go = StepHandedOver(
                st.run_id, b.now, seq, started.name, started.attempt, seq in began
            )
            self.emit(b, st, let_go)

    def resume(self, b: Batch, st: RunState) -> None:
        """Try a parked run again (its version may be registered now, its code fixed)."""
        if st.status is Status.PARKED:
            self._advance(b, st)

    # -- the core loop ---------------------------------------------------------------
    def _advance(self, b: Batch, st: RunState, relaunch: frozenset[int] = frozenset()) -> None:
        """Replay the workflow and record what it does next, until it waits or ends."""
        if isinstance(st.pending.get(RUN_PERMIT_SEQ), PermitRequested):
            return  # no code runs before the run's permit comes
        while not st.terminal:
            if st.compensation is not None:
                self._relaunch_forward(b, st, relaunch)
                self._compensate(b, st, relaunch)
                return
            wf = self.registry.get(st.workflow, st.version)
            if wf is None:
                self._park(
                    b,
                    st,
                    f"workflow {st.workflow!r} version {st.version!r} is not "
                    "registered on this instance",
                )
                return
            if st.run_id in b.parked:
                self._park(b, st, b.parked[st.run_id])
                return
            result = self._replay(wf, st, b.now)
            for fact in result.new_facts:
                self.emit(b, st, fact)
            if not self._follow(b, st, result, relaunch):
                return

    def _replay(self, wf: WorkflowDef, st: RunState, now: int) -> Replay:
        return self.replayer.replay(wf, st, now, self.activation(st.run_id))

    def _follow(self, b: Batch, st: RunState, result: Replay, relaunch: frozenset[int]) -> bool:
        """Record the consequence of one replay; True when the workflow can go further now."""
        run_id, now = st.run_id, b.now
        match result.outcome:
            case Completed(value):
                output, problem = self._dumps("the run's output", value)
                if problem:
                    self.emit(b, st, RunFailed(run_id, now, problem, ""))
                else:
                    self.emit(b, st, RunCompleted(run_id, now, output))
            case ContinuedAsNew(value):
                data, problem = self._dumps("the continue-as-new input", value)
                if problem:
                    self.emit(b, st, RunFailed(run_id, now, problem, ""))
                    return False
                successor = continuation_of(run_id)
                self.emit(b, st, RunCompleted(run_id, now, b"null", successor))
                self._start_successor(b, st, successor, data, dict(st.tags), st.parent_seq)
            case Failed(error, tb):
                error, tb = self.limits.clip(error), self.limits.clip(tb)
                if result.compensations:
                    self.emit(b, st, CompensationStarted(run_id, now, error, tb, False))
                    return True  # _advance compensates
                self.emit(b, st, RunFailed(run_id, now, error, tb))
            case NonDeterministic(err):
                self._park(b, st, f"non-determinism: {err}")
            case Overran():
                self._park(b, st, OVERRAN)
            case Blocked(StepCall(seq, step, args, priority, fairness)):
                self._run_step(b, st, seq, step, args, relaunch, priority, fairness)
            case Blocked(SleepCall(seq, secs)):
                if seq not in st.pending:
                    self.emit(b, st, TimerScheduled(run_id, now, seq, now + int(secs * 1000)))
            case Blocked(SignalWait(seq, name, timeout)):
                if seq in st.pending:
                    return False
                buffered = next((s for s in st.signals if s.name == name), None)
                if buffered is not None:
                    self.emit(
                        b,
                        st,
                        SignalReceived(
                            run_id, now, seq, name, buffered.payload, buffered.signal_id
                        ),
                    )
                    return True
                timeout_at = None if timeout is None else now + int(timeout * 1000)
                self.emit(b, st, SignalAwaited(run_id, now, seq, name, timeout_at))
            case Blocked(ChildCall() as call):
                return self._start_child(b, st, call)
            case Blocked(EventWait(seq, name, key, timeout)):
                if seq not in st.pending:
                    timeout_at = None if timeout is None else now + int(timeout * 1000)
                    self.emit(b, st, EventAwaited(run_id, now, seq, name, key, timeout_at))
                    corr = correlation_id(name, key)
                    b.effects.commands.append(Subscribe(corr, name, run_id, seq, key, False, now))
        return False

    def _start_child(self, b: Batch, st: RunState, call: ChildCall) -> bool:
        """Record the child's start and produce its StartRun in this transaction (or, if
        it cannot start, its end at once); True when the workflow goes on now."""
        if call.seq in st.pending:
            return False  # started; its end has not come
        run_id, now = st.run_id, b.now
        try:
            problem = run_id_problem(call.child_run_id, new=True)
            if problem:
                raise Rejected(Reason.BAD_RUN_ID, f"child run id: {problem}")
            if self._checked(call.workflow, None, call.input) is None:
                raise Rejected(Reason.UNKNOWN_WORKFLOW, f"no workflow {call.workflow!r}")
            too_large = self.limits.too_large("the child's input", len(call.input))
            if too_large:
                raise Rejected(Reason.OVERSIZE, too_large)
        except Rejected as exc:
            ended = ChildEnded(
                run_id, now, call.seq, call.workflow, call.child_run_id, "rejected", None,
                self.limits.clip(f"{exc.code}: {exc.reason}"),
            )  # fmt: skip
            self.emit(b, st, ended)
            return True
        started = ChildStarted(
            run_id, now, call.seq, call.workflow, call.child_run_id, call.awaited,
            call.parent_close,
        )  # fmt: skip
        self.emit(b, st, started)
        b.effects.commands.append(
            StartRun(
                call.child_run_id,
                call.workflow,
                call.input,
                parent_run_id=run_id,
                sent_at_ms=now,
                parent_seq=call.seq if call.awaited else None,
            )
        )
        return not call.awaited

    def _run_step(
        self,
        b: Batch,
        st: RunState,
        seq: int,
        step: StepDef,
        args: tuple[Any, ...],
        relaunch: frozenset[int],
        priority: int = 0,
        fairness: str = "",
    ) -> None:
        fact = st.pending.get(seq)
        p = b.partition_of(st.run_id)
        match fact:
            case None:
                attempt = 1
            case StepFailed(retry_at_ms=int(due), attempt=prev) if due <= b.now:
                attempt = prev + 1
            case StepStarted(attempt=running, isolated=isolated) if seq in relaunch:
                b.effects.steps.append(StepJob(p, st.run_id, seq, running, step, args, isolated))
                return
            case PermitReceived(attempt=attempt, granted=True):
                pass  # it has its permit
            case _:
                return  # running, waiting for its retry time or for a permit
        limit = None if isinstance(fact, PermitReceived) else self.registry.limit_of(step)
        if limit is not None:
            ent = limit_id(limit.name)
            ask = Acquire(
                ent, st.run_id, seq, attempt, priority, fairness, limit.concurrency, limit.rate,
                limit.burst,
            )  # fmt: skip
            self._request(b, st, ask)
            return
        if step.remote:
            self._dispatch(b, st, seq, step, args, attempt)
            return
        self.emit(b, st, StepStarted(st.run_id, b.now, seq, step.name, attempt))
        b.effects.steps.append(StepJob(p, st.run_id, seq, attempt, step, args))

    def _dispatch(
        self, b: Batch, st: RunState, seq: int, step: StepDef, args: tuple[Any, ...], attempt: int
    ) -> None:
        """Start a remote attempt: record it and send its task to its group, in one
        transaction. Its id (seq, attempt, time) names it apart from every other attempt,
        a retried dead run's included."""
        policy, p = step.policy, b.partition_of(st.run_id)
        assert policy.group is not None
        attempt_id = f"{seq}.{attempt}.{b.now:x}"
        deadline = None if policy.timeout is None else b.now + int(policy.timeout * 1000)
        beat = None if policy.heartbeat is None else int(policy.heartbeat * 1000)
        started = StepStarted(
            st.run_id, b.now, seq, step.name, attempt, attempt_id, False, policy.group,
            deadline, beat,
        )  # fmt: skip
        self.emit(b, st, started)
        try:
            data = payload.dumps(list(args))
            error = self.limits.too_large(f"the arguments of step {step.name!r}", len(data))
        except Exception as exc:  # not JSON: the task cannot be sent, now or later
            error = f"the arguments of remote step {step.name!r} are not JSON: {exc}"
        if error:  # fails for good: no attempt can do better
            outcome = StepOutcome(p, st.run_id, seq, attempt, False, error=error, retryable=False)
            self.step_outcome(b, st, outcome)
            return
        task = StepTask(
            st.run_id, seq, attempt, step.name, data, deadline, attempt_id, policy.group, beat,
            b.now,
        )  # fmt: skip
        b.effects.tasks.append(task)

    @staticmethod
    def _start_successor(
        b: Batch,
        st: RunState,
        successor: str,
        data: bytes,
        tags: dict[str, str],
        parent_seq: int | None,
    ) -> None:
        """Start the run that carries on from ``st`` (continue-as-new, retry as new), in
        the transaction that records why: the newest version of the same workflow. A
        continued child reports to its parent in its place (``parent_seq``)."""
        b.effects.commands.append(
            StartRun(
                successor,
                st.workflow,
                data,
                parent_run_id=st.parent_run_id,
                tags=tags,
                sent_at_ms=b.now,
                continued_from=st.run_id,
                parent_seq=parent_seq,
            )
        )

    def _relaunch_forward(self, b: Batch, st: RunState, relaunch: frozenset[int]) -> None:
        """A forward step recovered while the run compensates (a cancel came between its
        process going away and the recovery): run it again, as the compensation waits for
        it. Its call (step and arguments) is where the workflow's replay blocks."""
        wf = self.registry.get(st.workflow, st.version)
        if wf is None or not any(s > 0 for s in relaunch):
            return
        outcome = replay(wf, st, self.registry, b.now, self.activation(st.run_id)).outcome
        match outcome:
            case Blocked(StepCall(seq, step, args)) if seq in relaunch:
                self._run_step(b, st, seq, step, args, relaunch)

    def _compensate(self, b: Batch, st: RunState, relaunch: frozenset[int] = frozenset()) -> None:
        """Wait for the steps in flight; then undo every completed step that registered a
        compensation, newest first, one at a time: the undo of step ``s`` is step ``-s``.
        Then end the run (cancelled or failed, with any compensation's failure)."""
        if self._in_flight(st):
            return
        for c in sorted(self._compensations(b, st), key=lambda c: c.seq, reverse=True):
            if -c.seq not in st.resolved:
                self._run_step(b, st, -c.seq, c.step, c.args, relaunch)
                return
        failures = [
            f"compensation {f.name!r} failed: {f.error}"
            for s, f in sorted(st.resolved.items(), reverse=True)
            if s < 0 and isinstance(f, StepFailed)
        ]
        c = st.compensation
        assert c is not None
        text = self.limits.clip("; ".join([c.error, *failures]))
        if c.cancelled:
            self.emit(b, st, RunCancelled(st.run_id, b.now, text))
        else:
            self.emit(b, st, RunFailed(st.run_id, b.now, text, c.traceback))

    def _compensations(self, b: Batch, st: RunState) -> list[Any]:
        wf = self.registry.get(st.workflow, st.version)
        guard = self.activation(st.run_id)
        return replay(wf, st, self.registry, b.now, guard).compensations if wf else []

    @staticmethod
    def _in_flight(st: RunState) -> bool:
        """A forward step (positive seq) is running, or handed over to run again."""
        return any(s > 0 for s in st.running_steps() + st.remote_steps() + st.handed_over_steps())

    def _park(self, b: Batch, st: RunState, reason: str) -> None:
        reason = self.limits.clip(reason)
        if not (st.status is Status.PARKED and st.reason == reason):
            self.emit(b, st, RunParked(st.run_id, b.now, reason))

    def _dumps(self, what: str, value: Any) -> tuple[bytes, str | None]:
        """JSON bytes of a workflow's value, or why it cannot be recorded."""
        try:
            data = payload.dumps(value)
        except Exception as exc:  # pydantic_core.PydanticSerializationError and friends
            return b"", self.limits.clip(f"{what} is not JSON-serialisable: {exc}")
        return data, self.limits.too_large(what, len(data))

    @staticmethod
    def emit(b: Batch, st: RunState, fact: Fact) -> None:
        ending = type(fact) in END_FACTS
        children = Rules._children(st) if ending else []  # before the end clears pending
        permits = dict(st.permits) if ending else {}
        apply(st, fact)
        b.effects.facts.append(fact)
        ev = lifecycle.event(fact, st)
        if ev is not None:
            b.effects.lifecycle.append(ev)
        if ending:
            for seq, asked in permits.items():  # the run's permits and requests go back
                release = Release(asked.limit, st.run_id, seq, b.now, asked.request_id)
                b.effects.commands.append(release)
            Rules._ended(b, st, fact, children)

    @staticmethod
    def _children(st: RunState) -> list[ChildStarted]:
        """The child runs ``st`` started that may still run (awaited ones not ended, and
        every fire-and-forget one: the parent is not told of their end)."""
        facts = [*st.pending.values(), *st.resolved.values()]
        return [f for f in facts if isinstance(f, ChildStarted)]

    @staticmethod
    def _ended(b: Batch, st: RunState, fact: Fact, children: list[ChildStarted]) -> None:
        """The run ended: tell the parent awaiting it, in this transaction, and apply each
        child's ``parent_close`` (a cancel has cancelled them already, or abandoned)."""
        continued = isinstance(fact, RunCompleted) and fact.continued_as
        if st.parent_run_id and st.parent_seq is not None and not continued:
            output = fact.output if isinstance(fact, RunCompleted) else None
            error = None if isinstance(fact, RunCompleted) else (st.error or st.reason or "")
            b.effects.commands.append(
                ChildResult(
                    st.parent_run_id, st.parent_seq, st.run_id, st.status.value, output, error,
                    b.now,
                )
            )  # fmt: skip
        if isinstance(fact, RunCancelled):
            return
        for child in children:
            if child.parent_close == "abandon":
                continue
            why = f"its parent {st.run_id!r} ended ({st.status.value}) first"
            compensate = child.parent_close == "request_cancel"
            b.effects.commands.append(Cancel(child.child_run_id, compensate, why, b.now, False))


def _child_ids(st: RunState) -> list[str]:
    """The child runs ``st`` started (running or ended), in the order it started them."""
    facts = sorted({**st.resolved, **st.pending}.items())
    return [
        f.child_run_id
        for _, f in facts
        if isinstance(f, ChildStarted) or (isinstance(f, ChildEnded) and f.status != "rejected")
    ]
