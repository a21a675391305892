"""Test workflows in-process: the engine's own core, no broker, a clock that skips time.

    from runstream.testing import WorkflowTester

    t = WorkflowTester(app, steps={"charge": fake_charge})   # fakes by step name or function
    run = t.start("checkout", {"amount": 10}, run_id="o-1")  # runs until it ends or waits
    t.signal("o-1", "approve", {"by": "ann"})
    t.resolve(run.promises[0], {"ok": True})                 # a durable promise's id
    t.query("o-1", "status"); run.events["stage"]            # @ctx.query_handler, set_event
    assert t.update("o-1", "add", {"sku": 7}) == {"items": 1}  # a validated update
    t.run_until_idle()            # jumps to each next timer: a 30-day sleep takes no time
    assert run.result() == {...}

Commands go through the engine's `Decider` as Avro records, exactly as they come from
Kafka, so the rules are the production ones: replay, non-determinism (the run is parked,
with the reason), retries with backoff, compensation, signals buffered until awaited,
dead letters. The tester plays the shell around the core in the simplest way: every
batch commits, step bodies (or their fakes) run at once in the test's thread (a remote
step's too, its arguments through JSON as a task worker gets them), and the clock moves
only when the test says so. Each activation replays the workflow from the
start, as after a restart, so code that no longer fits its history shows at once.

Not played here: Kafka itself, crashes and rebalances, the activation time budget (a
breakpoint in workflow code must not park the run). Integration tests use the
``runstream_kafka`` fixture of the pytest plugin (`runstream.pytest_plugin`).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from runstream.engine import blobs, payload
from runstream.engine.decide import Decider
from runstream.engine.interceptors import ended, tell_ended
from runstream.engine.partitioner import task_group_id
from runstream.engine.replay import Replayer
from runstream.engine.state import RunState, State, Status, new_state
from runstream.engine.work import Batch, LogRecord, StepJob, StepOutcome, Work
from runstream.engine.workflow import seconds, step_def
from runstream.errors import (
    QueryFailed,
    RunCancelled,
    RunNotFound,
    RunRejected,
    RunstreamError,
    UpdateFailed,
    run_failed,
)
from runstream.runtime.steps import execute
from runstream.runtime.timers import TimerQueue
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    END_FACTS,
    Cancel,
    Command,
    CompletePromise,
    DeadLetter,
    Fact,
    LiveQuery,
    Pause,
    PromiseCreated,
    PublishEvent,
    QueryAnswer,
    Reason,
    RunEventSet,
    ScheduleCommand,
    Signal,
    StartRun,
    StepResult,
    StepTask,
    Unpause,
    Update,
    UpdateReply,
    UpdateStage,
    correlation_id,
    promise_of,
    schedule_id,
)
from runstream.taskworker import _Served
from runstream.topics.spec import Topics

if TYPE_CHECKING:
    from runstream.app import App
    from runstream.entity_client import TestEntity

__all__ = [
    "EndlessTimers",
    "Run",
    "RunNotFinished",
    "StepAttempt",
    "TestUpdate",
    "WorkflowTester",
]

PARTITION = 0  # the tester is one engine instance owning the namespace's only partition
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)  # the fake clock's default start: tests repeat

Duration = float | int | str | timedelta


class RunNotFinished(RunstreamError):
    """`Run.result()` of a run that has not ended (it waits, or it is parked)."""


class EndlessTimers(RunstreamError):
    """`WorkflowTester.run_until_idle` fired its limit of timers and more keep coming."""


@dataclass(frozen=True, slots=True)
class StepAttempt:
    """One step body the tester ran (a fake's call included)."""

    run_id: str
    name: str
    args: tuple[Any, ...]
    attempt: int
    seq: int  # the step's sequence number; -n is the compensation of step n
    ok: bool
    output: Any  # what it returned, as JSON (None when it failed)
    error: str | None

    @property
    def compensation(self) -> bool:
        return self.seq < 0


class Run:
    """A run the tester knows, read live: each property shows the run as it is now."""

    def __init__(self, tester: WorkflowTester, run_id: str) -> None:
        self._tester, self.run_id = tester, run_id

    def __repr__(self) -> str:
        return f"<Run {self.run_id!r} {self.status}>"

    @property
    def state(self) -> RunState:
        """The engine's state of the run (as its projection holds it)."""
        return self._tester._state(self.run_id)

    @property
    def status(self) -> str:
        """running, compensating, parked, completed, failed, cancelled, dead or rejected."""
        return str(self.state.status)

    def result(self) -> Any:
        """The run's output, following continue-as-new, as `Client.result` gives it.
        Raises RunFailed, RunCancelled, RunRejected, or RunNotFinished."""
        st = self.state
        while st.status is Status.COMPLETED and st.continued_as:
            st = self._tester._state(st.continued_as)
        match st.status:
            case Status.COMPLETED:
                return self._tester._loads(st.output or b"null")
            case Status.CANCELLED:
                raise RunCancelled(st.run_id, st.reason or "")
            case Status.REJECTED:
                raise RunRejected(st.run_id, st.code or "", st.reason or "")
            case Status.FAILED | Status.DEAD:
                raise run_failed(st.run_id, st.error or st.reason or "", st.status, st.code)
        why = f": {st.reason}" if st.reason else ""
        raise RunNotFinished(f"run {st.run_id!r} has not finished, it is {st.status}{why}")

    @property
    def error(self) -> str | None:
        """A failed run's error."""
        return self.state.error

    @property
    def reason(self) -> str | None:
        """Why the run is parked, cancelled, dead or rejected."""
        return self.state.reason

    @property
    def history(self) -> list[Fact]:
        """The run's journal facts, in order."""
        return [f for f in self._tester.journal if f.run_id == self.run_id]

    @property
    def promises(self) -> list[str]:
        """The ids of the durable promises the run created (`Context.promise`), in order."""
        return [f.promise_id for f in self.history if isinstance(f, PromiseCreated)]

    @property
    def events(self) -> dict[str, Any]:
        """The newest value of each key the run set (``ctx.set_event``), following the runs
        that carry it on, as `Client.get_event` reads them."""
        out: dict[str, Any] = {}
        st: RunState | None = self.state
        while st is not None:
            for f in self._tester.journal:
                if f.run_id == st.run_id and isinstance(f, RunEventSet):
                    out[f.key] = payload.loads(f.value)
            nxt = st.continued_as or st.retried_as
            st = self._tester._state(nxt) if nxt else None
        return out

    @property
    def steps(self) -> list[StepAttempt]:
        """The step bodies run for this run, in order (retries and compensations too)."""
        return [s for s in self._tester.steps_run if s.run_id == self.run_id]


class WorkflowTester:
    """Runs an App's workflows in-process, on a fake clock.

    Args:
        app: the App whose workflows and steps to run.
        steps: fakes, by step name or step function: called instead of the step's body,
            with its arguments; the step keeps its name, retry policy and output type.
        now: where the fake clock starts (2025-01-01 UTC by default).
    """

    def __init__(
        self,
        app: App,
        steps: Mapping[str | Callable[..., Any], Callable[..., Any]] | None = None,
        *,
        now: datetime = EPOCH,
    ) -> None:
        self.app = app
        registry = app.registry
        self._decider = Decider(
            registry,
            partitions=1,
            journal_topic=Topics(app.namespace).journal,  # named by dead letters
            max_recovery_attempts=app.max_recovery_attempts,
        )
        # No coroutine cache: every activation replays from the start (see the module doc).
        self._decider.rules.replayer = Replayer(registry, size=0)
        self._fakes = {
            key if isinstance(key, str) else _step_name(app, key): fake
            for key, fake in (steps or {}).items()
        }
        self._codec = Codec.default()
        self._commands = Topics(app.namespace).commands
        self._now = int(now.timestamp() * 1000)
        self._states: dict[str, State] = {}  # runs' and entities'
        self._timers = TimerQueue()
        self._work: deque[Work] = deque()
        self._offset = 0
        self._run_ids = 0
        self._signal_ids = 0
        self.journal: list[Fact] = []
        self.steps_run: list[StepAttempt] = []
        self.dead_letters: list[DeadLetter] = []
        self._answers: dict[str, QueryAnswer] = {}  # live queries' answers, by request id
        self._updates: dict[str, UpdateReply] = {}  # the latest answer, by update id

    def _loads(self, data: bytes) -> Any:
        """A payload's value: a large one (`engine.blobs`) from the engine's blob store."""
        with blobs.active(self._decider.blobs):
            return payload.loads(data)

    # -- what tests do ---------------------------------------------------------------
    @property
    def now(self) -> datetime:
        """The fake clock."""
        return datetime.fromtimestamp(self._now / 1000, UTC)

    def start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        run_id: str | None = None,
        version: str | None = None,
        tags: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Run:
        """Start a run (by workflow name or function) and run it until it ends or waits.
        A start the engine refuses gives a run whose status is ``rejected``. ``headers``
        go to the App's interceptors (`runstream.interceptors`), which run here too."""
        name = self.app.registry.workflow_name(workflow)
        if run_id is None:
            self._run_ids += 1
            run_id = f"{name}-{self._run_ids}"
        self._send(
            StartRun(
                run_id,
                name,
                input=payload.dumps(input),
                version=version,
                tags=dict(tags or {}),
                headers=dict(headers or {}),
            )
        )
        return Run(self, run_id)

    def run(self, run_id: str) -> Run:
        """The run ``run_id``. Raises RunNotFound."""
        st = self._state(run_id)
        if not (st.exists or st.status is Status.REJECTED):
            raise RunNotFound(f"no run {run_id!r} was started in this tester")
        return Run(self, run_id)

    def signal(self, run_id: str, name: str, value: Any = None, signal_id: str = "") -> None:
        """Send signal ``name`` to a run and let it go on. Raises RunNotFound."""
        if not signal_id:
            self._signal_ids += 1
            signal_id = f"test-signal-{self._signal_ids}"
        self._send(Signal(run_id, name, payload=payload.dumps(value), signal_id=signal_id))

    def resolve(self, promise_id: str, value: Any = None) -> None:
        """Resolve a run's durable promise (see `Client.resolve`) and let the run go on.
        A completion the engine refuses (completed already, unknown, the run ended) is a
        dead letter in `dead_letters`, as on ``<ns>.dlq``. Raises RunNotFound."""
        self._send(self._completion(promise_id, value=payload.dumps(value)))

    def reject(self, promise_id: str, error: str) -> None:
        """Reject a run's durable promise (see `Client.reject`): its await raises
        `PromiseRejected`. Refused as `resolve` is."""
        self._send(self._completion(promise_id, error=error))

    @staticmethod
    def _completion(
        promise_id: str, *, value: bytes | None = None, error: str | None = None
    ) -> CompletePromise:
        parsed = promise_of(promise_id)
        if parsed is None:
            raise ValueError(f"{promise_id!r} is not a promise id (<run_id>/promise/<seq>)")
        return CompletePromise(parsed[0], promise_id, value=value, error=error)

    def publish(
        self, name: str, value: Any = None, *, key: str = "", ttl: Duration = 0, event_id: str = ""
    ) -> str:
        """Publish event ``name`` with correlation ``key`` (see `Client.publish`): the runs
        waiting for it go on, the workflows it triggers start. Returns its event id."""
        if not event_id:
            self._signal_ids += 1
            event_id = f"test-event-{self._signal_ids}"
        corr = correlation_id(name, key)
        self._send(
            PublishEvent(
                corr,
                name,
                event_id=event_id,
                payload=payload.dumps(value),
                key=key,
                ttl_ms=_ms(ttl),
            )
        )
        return event_id

    def schedule(
        self, name: str, workflow: str, input: Any = None, *, cron: str, tz: str = "UTC"
    ) -> None:
        """Create or replace schedule ``name`` (see `Client.schedule`); its fires come as
        the fake clock moves."""
        data = payload.dumps(input)
        self._send(
            ScheduleCommand(
                schedule_id(name), "set", workflow=workflow, input=data, cron=cron, tz=tz
            )
        )

    def query(
        self,
        run_id: str,
        name: str,
        arg: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """What the run's query handler ``name`` returns for ``arg`` (see `Client.query`);
        the run does not change. Raises RunNotFound, or QueryFailed."""
        request_id = f"test-query-{len(self._answers) + 1}"
        cmd = LiveQuery(
            run_id,
            request_id,
            reply_to="tester",
            name=name,
            arg=payload.dumps(arg),
            headers=dict(headers or {}),
        )
        self._send(cmd)
        answer = self._answers[request_id]
        if not answer.found:
            raise RunNotFound(f"no run {run_id!r} was started in this tester")
        if answer.error is not None:
            raise QueryFailed(answer.error)
        return payload.loads(answer.value or b"null")

    def cancel(self, run_id: str, *, compensate: bool = False, reason: str = "") -> None:
        """Cancel a run (see `Client.cancel`). Raises RunNotFound."""
        self._send(Cancel(run_id, compensate, reason=reason))

    def pause(self, run_id: str, reason: str = "") -> None:
        """Pause a run (see `Client.pause`): no workflow code of it runs until `unpause`;
        signals, events, promise completions and timers due meanwhile are recorded and
        reach its code then. Raises RunNotFound."""
        self._send(Pause(run_id, reason, by="WorkflowTester"))

    def unpause(self, run_id: str, reason: str = "") -> None:
        """Let a paused run go on from what was recorded while it was paused."""
        self._send(Unpause(run_id, reason, by="WorkflowTester"))

    def pause_group(self, group: str, reason: str = "") -> None:
        """Pause task group ``group`` (see `Client.pause_group`): its remote steps due
        meanwhile are held, and served on `unpause_group`."""
        self._send(Pause(task_group_id(group, PARTITION, 1), reason, by="WorkflowTester"))

    def unpause_group(self, group: str, reason: str = "") -> None:
        """Let task group ``group`` go on: the steps it held are served now."""
        self._send(Unpause(task_group_id(group, PARTITION, 1), reason, by="WorkflowTester"))

    def update(
        self, run_id: str, name: str, arg: Any = None, *, update_id: str | None = None
    ) -> Any:
        """Send update ``name`` (see `Client.update`) and return its handler's result.
        Raises `UpdateFailed` (rejected, or its handler failed), or `RunNotFinished` if
        the handler still waits (a sleep: `advance`, then `TestUpdate.result`)."""
        return self.start_update(run_id, name, arg, update_id=update_id).result()

    def start_update(
        self, run_id: str, name: str, arg: Any = None, *, update_id: str | None = None
    ) -> TestUpdate:
        """Send update ``name`` and let the run go on: the update as far as it got."""
        cmd = Update(
            run_id, name, update_id=update_id or self._next_id("update"),
            arg=payload.dumps(arg), reply_to="tester",
        )  # fmt: skip
        self._send(cmd)
        return TestUpdate(self, cmd.run_id, cmd.update_id)

    def update_with_start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        run_id: str,
        update: str,
        arg: Any = None,
        update_id: str | None = None,
    ) -> TestUpdate:
        """Update run ``run_id``, starting it first if it does not exist, in one command
        (see `Client.update_with_start`)."""
        cmd = Update(
            run_id,
            update,
            update_id=update_id or self._next_id("update"),
            arg=payload.dumps(arg),
            reply_to="tester",
            start_workflow=self.app.registry.workflow_name(workflow),
            start_input=payload.dumps(input),
        )
        self._send(cmd)
        return TestUpdate(self, cmd.run_id, cmd.update_id)

    def entity(self, name: str, key: str) -> TestEntity:
        """Key ``key`` of durable entity ``name`` (see `Client.entity`):
        ``t.entity("cart", "ann").call("add", item)``, ``.read(...)``, ``.show()``."""
        from runstream.entity_client import TestEntity

        return TestEntity(self, name, key)

    def _next_id(self, what: str) -> str:
        self._signal_ids += 1
        return f"test-{what}-{self._signal_ids}"

    def advance(self, duration: Duration) -> None:
        """Let ``duration`` of fake time pass (seconds, "10m", "1d", a timedelta): the
        sleeps, step retries and signal timeouts due meanwhile fire at their due times,
        in order, and the runs go on from each."""
        until = self._now + _ms(duration)
        while (due := self._timers.next_due()) is not None and due <= until:
            self._fire_next(due)
        self._now = until

    def run_until_idle(self, max_timers: int = 100_000) -> None:
        """Let time run until no timer is left: every run has ended or waits for a
        signal or a promise (or is parked). Raises EndlessTimers past ``max_timers`` timers."""
        for _ in range(max_timers):
            due = self._timers.next_due()
            if due is None:
                return
            self._fire_next(due)
        if self._timers.next_due() is not None:
            raise EndlessTimers(f"{max_timers} timers fired and more keep coming")

    # -- the shell around the core -----------------------------------------------------
    def _state(self, run_id: str) -> RunState:
        """The run's state (an entity's id names no run: an empty one)."""
        st = self._states.get(run_id)
        return st if isinstance(st, RunState) else RunState(run_id)

    def _send(self, cmd: Command) -> None:
        """``cmd`` arrives on the commands topic, as any producer's would; then everything
        it makes runnable runs."""
        dead = len(self.dead_letters)
        self._queue_command(cmd)
        self._drain()
        for letter in self.dead_letters[dead:]:
            if letter.run_id == cmd.run_id and letter.code == Reason.UNKNOWN_RUN:
                raise RunNotFound(letter.reason)

    def _queue_command(self, cmd: Command) -> None:
        self._offset += 1
        key = cmd.run_id.encode()
        value = self._codec.encode(cmd)
        self._work.append(LogRecord(self._commands, PARTITION, self._offset, key, value))

    def _fire_next(self, due: int) -> None:
        self._now = max(self._now, due)
        self._work.extend(self._timers.pop_due(self._now, 1))
        self._drain()

    def _drain(self) -> None:
        """Decide the queued work one item at a time, each a committed batch, until
        nothing is left: step bodies run as soon as their start is recorded."""
        while self._work:
            b = Batch(lambda _p, run_id: self._states.get(run_id) or new_state(run_id), self._now)
            self._decider.handle(b, self._work.popleft())
            self._commit(b)

    def _commit(self, b: Batch) -> None:
        fx = b.effects
        for fact in fx.facts:
            self._codec.encode(fact)  # what cannot be journaled fails here, as in the engine
        for run_id, w in b.runs.items():
            self._states[run_id] = w.after
            if w.after.facts != w.before.facts:  # as the engine: a timer that did nothing
                self._timers.update(PARTITION, run_id, w.before.timers(), w.after.timers())
        for fact in fx.facts:  # as the engine tells them, once committed
            st = self._states.get(fact.run_id)
            if type(fact) in END_FACTS and isinstance(st, RunState):
                tell_ended(self.app.registry.interceptors, ended(st, self._now))
        self.journal += fx.facts
        self.dead_letters += fx.dead_letters
        self._answers |= {a.request_id: a for _, a in fx.replies if isinstance(a, QueryAnswer)}
        for _, answer in fx.replies:
            if isinstance(answer, UpdateReply):
                known = self._updates.get(answer.update_id)
                if known is None or known.stage == UpdateStage.ACCEPTED:
                    self._updates[answer.update_id] = answer
        for cmd in fx.commands:  # to other runs: continue-as-new, children and their ends
            self._queue_command(cmd)
        for job in fx.steps:
            self._work.append(self._execute(job))
        for task in fx.tasks:  # remote steps: served at once, as by a task worker
            self._queue_command(self._serve(task))

    def _serve(self, task: StepTask) -> StepResult:
        """A remote step's task run inline: its arguments rebuilt from JSON by the step's
        type hints (`taskworker`), its result sent back as a StepResult command."""
        step = self.app.registry.step_by_name(task.name)
        try:
            args = _Served.of(step).arguments(payload.loads(task.args))
        except (ValueError, ValidationError) as exc:
            why = f"arguments of step {task.name!r} are invalid: {exc}"
            o = StepOutcome(
                PARTITION, task.run_id, task.seq, task.attempt, False, error=why, retryable=False
            )
        else:
            job = StepJob(PARTITION, task.run_id, task.seq, task.attempt, step, args)
            o = self._execute(replace(job, headers=task.headers))
        output = o.output if o.ok else b"null"
        return StepResult(
            task.run_id,
            task.seq,
            attempt=task.attempt,
            ok=o.ok,
            output=output,
            error=o.error,
            traceback=o.traceback,
            attempt_id=task.attempt_id,
            retryable=o.retryable,
            duration_ms=o.duration_ms,
            worker="tester",
        )

    def _execute(self, job: StepJob) -> StepOutcome:
        fake = self._fakes.get(job.step.name)
        if fake is not None:
            is_async = inspect.iscoroutinefunction(inspect.unwrap(fake))
            job = replace(job, step=replace(job.step, fn=fake, is_async=is_async))
        outcome = execute(job, None, self.app.registry.interceptors)
        output = payload.loads(outcome.output) if outcome.ok else None
        self.steps_run.append(
            StepAttempt(
                job.run_id,
                job.step.name,
                job.args,
                job.attempt,
                job.seq,
                outcome.ok,
                output,
                outcome.error,
            )
        )
        return outcome


class TestUpdate:
    """An update sent by `WorkflowTester.start_update`, read live."""

    __test__ = False  # not a pytest test class

    def __init__(self, tester: WorkflowTester, run_id: str, update_id: str) -> None:
        self._tester, self.run_id, self.update_id = tester, run_id, update_id

    def __repr__(self) -> str:
        return f"<TestUpdate {self.update_id!r} of {self.run_id!r}: {self.stage}>"

    @property
    def stage(self) -> str:
        """accepted, completed or rejected."""
        return self._tester._updates[self.update_id].stage

    def result(self) -> Any:
        """The handler's result. Raises `UpdateFailed` or `RunNotFinished` (it waits)."""
        answer = self._tester._updates[self.update_id]
        if answer.error is not None:
            rejected = answer.stage == UpdateStage.REJECTED
            raise UpdateFailed(self.run_id, self.update_id, answer.code, answer.error, rejected)
        if answer.stage != UpdateStage.COMPLETED:
            raise RunNotFinished(f"update {self.update_id!r} is {answer.stage}: its handler waits")
        return self._tester._loads(answer.output or b"null")


def _step_name(app: App, fn: Callable[..., Any]) -> str:
    """The name ``fn`` runs under as a step (registered or not)."""
    sd = app.registry.steps.get(fn)
    return sd.name if sd is not None else step_def(fn).name


def _ms(duration: Duration) -> int:
    secs = duration.total_seconds() if isinstance(duration, timedelta) else seconds(duration)
    return int(secs * 1000)
