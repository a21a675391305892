"""A tiny in-process driver of the pure core for unit tests: no Kafka, no RocksDB.

It plays the shell's part around the real `Decider`: commands go in as records on
partition 0 (encoded as any producer would), each decision's working copies become the
committed states (every "transaction" commits), step bodies run at once through the
real `runtime.steps.execute`, timers fire on a fake clock, and every fact is kept in one
list so tests can check the journal.
"""

from __future__ import annotations

from typing import Any

from runstream.engine import payload
from runstream.engine.blobs import Blob
from runstream.engine.decide import Decider
from runstream.engine.limits import Limits
from runstream.engine.reducer import fold
from runstream.engine.state import State, new_state
from runstream.engine.work import (
    Batch,
    HandOver,
    LogRecord,
    Recover,
    Resume,
    StepJob,
    TimerDue,
    Work,
)
from runstream.engine.workflow import Registry
from runstream.runtime.steps import execute
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    Cancel,
    DeadLetter,
    Fact,
    LifecycleEvent,
    Query,
    Record,
    RunInfo,
    Signal,
    StartRun,
    StepResult,
    StepTask,
)

JOURNAL = "t.journal"


class Core:
    def __init__(
        self, registry: Registry, max_recovery_attempts: int = 3, limits: Limits | None = None
    ) -> None:
        self.decider = Decider(
            registry,
            partitions=1,
            journal_topic=JOURNAL,
            limits=limits,
            max_recovery_attempts=max_recovery_attempts,
        )
        self.codec = Codec.default()
        self.now = 1_000_000
        self.states: dict[str, State] = {}
        self.journal: list[Fact] = []
        self.lifecycle: list[LifecycleEvent] = []
        self.commands: list[StartRun] = []
        self.dead: list[DeadLetter] = []
        self.replies: list[tuple[str, RunInfo]] = []
        self.queued: list[StepJob] = []
        self.tasks: list[StepTask] = []  # remote attempts sent to their task topics
        self.blobs: list[Blob] = []  # large payloads written to the blobs topic
        self.since = 0  # when "this instance" took the partition over
        self.auto_run_steps = True
        self.offset = 0
        self.parked: dict[str, str] = {}

    def state(self, run_id: str) -> State:
        return self.states.get(run_id) or new_state(run_id)

    def handle(self, *work: Work) -> Batch:
        """Decide ``work``, in one batch, and commit it, as the shell would."""
        b = Batch(
            lambda _p, run_id: self.state(run_id), self.now, self.parked, lambda _p: self.since
        )
        for item in work:
            self.decider.handle(b, item)
        for run_id, w in b.runs.items():
            self.states[run_id] = w.after
        fx = b.effects
        self.journal += fx.facts
        self.lifecycle += fx.lifecycle
        self.commands += fx.commands
        self.dead += fx.dead_letters
        self.replies += fx.replies
        self.queued += fx.steps
        self.tasks += fx.tasks
        self.blobs += fx.blobs
        while self.auto_run_steps and self.queued:
            self.run_step(self.queued.pop(0))
        return b

    def record(self, value: bytes, key: bytes | None = None, partition: int = 0) -> Batch:
        """A raw record arriving on the commands topic."""
        return self.handle(self.log_record(value, key, partition))

    def log_record(self, value: bytes, key: bytes | None = None, partition: int = 0) -> LogRecord:
        """The next record of the commands topic, not yet handled."""
        self.offset += 1
        return LogRecord("t.commands", partition, self.offset, key, value)

    def command(self, cmd: Record) -> Batch:
        return self.record(self.codec.encode(cmd), cmd.run_id.encode())  # type: ignore[attr-defined]

    def commands_in_one_batch(self, *cmds: Record) -> Batch:
        """``cmds`` consumed together, as one poll's records are."""
        recs = [self.log_record(self.codec.encode(c), c.run_id.encode()) for c in cmds]  # type: ignore[attr-defined]
        return self.handle(*recs)

    def start(
        self, run_id: str, workflow: str, value: Any = None, version: str | None = None
    ) -> Batch:
        return self.command(StartRun(run_id, workflow, input=payload.dumps(value), version=version))

    def start_raw(self, run_id: str, workflow: str, data: bytes) -> Batch:
        """A start whose input is ``data`` as sent (a blob's reference, say)."""
        return self.command(StartRun(run_id, workflow, input=data))

    def signal(self, run_id: str, name: str, value: Any, signal_id: str = "") -> Batch:
        signal_id = signal_id or f"{name}-{len(self.journal)}"
        return self.command(Signal(run_id, name, payload=payload.dumps(value), signal_id=signal_id))

    def cancel(self, run_id: str, compensate: bool = False) -> Batch:
        return self.command(Cancel(run_id, compensate, reason="by test"))

    def query(self, run_id: str) -> RunInfo:
        self.command(Query(run_id, "q", reply_to="me"))
        return self.replies[-1][1]

    def step_result(self, run_id: str, seq: int, attempt: int, attempt_id: str = "") -> Batch:
        return self.command(
            StepResult(run_id, seq, attempt=attempt, ok=True, output=b"1", attempt_id=attempt_id)
        )

    def answer(
        self, task: StepTask, value: Any = None, *, error: str | None = None, retryable: bool = True
    ) -> Batch:
        """A task worker's result for ``task``: ``value``, or failed with ``error``."""
        ok, output = error is None, payload.dumps(value) if error is None else b"null"
        result = StepResult(
            task.run_id,
            task.seq,
            attempt=task.attempt,
            ok=ok,
            output=output,
            error=error,
            traceback=None,
            attempt_id=task.attempt_id,
            retryable=retryable,
        )
        return self.command(result)

    def run_step(self, job: StepJob) -> None:
        self.handle(execute(job))

    def advance(self, seconds: float) -> None:
        """Move the fake clock and fire everything due, in due order."""
        self.now += int(seconds * 1000)
        while True:
            due = sorted(
                (d, rid, s)
                for rid, st in self.states.items()
                for d, s in st.timers()
                if d <= self.now
            )
            if not due:
                return
            _, rid, seq = due[0]
            self.handle(TimerDue(0, rid, seq))

    def recover(self, run_id: str) -> None:
        """As after a crash: rebuild the state from the journal and recover it."""
        self.states[run_id] = fold(run_id, self.facts(run_id))
        self.queued = [t for t in self.queued if t.run_id != run_id]
        self.handle(Recover(0, run_id))

    def hand_over(self, run_id: str, began: frozenset[int] = frozenset()) -> None:
        """As at a graceful stop or rebalance: the steps of ``run_id`` open here go."""
        self.queued = [t for t in self.queued if t.run_id != run_id]
        self.handle(HandOver(0, run_id, began))

    def resume(self, run_id: str) -> None:
        self.handle(Resume(0, run_id))

    def facts(self, run_id: str, name: str | None = None) -> list[Any]:
        return [f for f in self.journal if f.run_id == run_id and name in (None, type(f).__name__)]

    def names(self, run_id: str) -> list[str]:
        return [type(f).__name__ for f in self.facts(run_id)]
