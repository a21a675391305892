"""A model of the shell around the real `Decider`, for the stateful test tier.

Unlike `corehelp.Core` (every command delivered at once, step bodies run at once), the
`Shell` here lets a test choose when each thing happens, as Kafka and threads would:

- commands (client ones and the ones runs send each other) wait in one queue per
  partition and are delivered in order per partition, when a test says so: one to a
  batch, or several of one or more partitions in one batch with internal work that is
  ready after them (`poll`), as the shell's poll loop decides them;
- a batch that decides nothing (`Batch.empty`) is dropped, as `worker._process` drops it,
  unless it changed a state with no fact (`Batch.changed`): that change is kept;
- local step bodies wait in `jobs` and their outcome is chosen by the test; remote
  attempts wait in `tasks` and their results (ok, failed, late, duplicated) are commands;
- timers are armed as the shell arms them: from the difference of a run's
  ``timers()`` before and after each committed batch, and from every state at a
  restore (`TimerQueue`, the shell's own heap); a clock moves only when told;
- the faults: a restore of a partition by a new owner (states folded from the journal,
  the coroutine cache dropped, crashed runs recovered), a graceful handover, an aborted
  transaction redone, a command delivered twice, a cache miss.

Every committed fact is kept in `journal`, in commit order, and every command consumed
in `log`, with the batch it was decided in and its own share of that batch (`Share`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from runstream.engine import blobs, payload
from runstream.engine.blobs import Ref, split
from runstream.engine.decide import Decider
from runstream.engine.limits import Limits
from runstream.engine.partitioner import partition_for
from runstream.engine.reducer import fold
from runstream.engine.state import RunState, State, new_state
from runstream.engine.work import (
    Batch,
    HandOver,
    LogRecord,
    Recover,
    Resume,
    StepJob,
    StepOutcome,
    Work,
)
from runstream.engine.workflow import Registry
from runstream.errors import BlobUnavailable
from runstream.runtime.timers import TimerQueue
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    Command,
    DeadLetter,
    Fact,
    IdKind,
    QueryAnswer,
    RunInfo,
    StepResult,
    StepTask,
    UpdateReply,
    id_kind,
)

JOURNAL = "m.journal"


@dataclass
class Share:
    """What deciding one work item added to its batch (the batch's other items aside; a
    decision that was refused or failed keeps only its dead letter, `Decider._undo`),
    and the state of its run (or entity) in the batch just before it was decided."""

    facts: list[Fact]
    dead_letters: list[DeadLetter]
    replies: list[tuple[str, RunInfo | QueryAnswer | UpdateReply]]
    before: State


@dataclass
class Delivered:
    """What delivering one command did."""

    cmd: Command
    internal: bool  # sent by a run or an entity (else by a client or a task worker)
    batch: Batch | None  # the batch it was decided in (None: dropped as empty)
    share: Share  # its own part of that batch, which may have decided other work too


class TopicBlobs:
    """The blobs topic as the model's Kafka holds it (what committed batches wrote), and
    what the batch being decided wrote (the engine's store remembers it until then). A
    new owner's cold cache is this too: nothing is read from a previous owner's memory."""

    def __init__(self) -> None:
        self.committed: dict[str, bytes] = {}
        self.pending: dict[str, bytes] = {}

    def read(self, ref: Ref) -> bytes:
        data = self.committed.get(ref.sha256, self.pending.get(ref.sha256))
        if data is None:
            raise BlobUnavailable(f"blob {ref.sha256[:16]}... is not on the topic")
        return ref.verify(data)

    def remember(self, ref: Ref, data: bytes) -> None:
        self.pending[ref.sha256] = data


#: Payloads above this many bytes go by reference in the model: its step outputs (`padded`)
#: and some run outputs.
BLOB_THRESHOLD = 8


class Shell:
    """The real Decider, and what the shell and Kafka would do around it."""

    def __init__(self, registry: Registry, partitions: int = 3) -> None:
        self.registry = registry
        self.partitions = partitions
        self.blobs = TopicBlobs()
        self.decider = self._decider()
        self.codec = Codec.default()
        self.now = 1_000_000
        self.states: dict[str, State] = {}
        self.journal: list[Fact] = []
        self.by_run: dict[str, list[Fact]] = {}  # the journal, run by run
        self.touched: set[str] = set()  # runs whose state changed since `checked`
        self.dead: list[DeadLetter] = []
        # Per partition: (command, sent by a run or entity rather than a client).
        self.queues: list[deque[tuple[Command, bool]]] = [deque() for _ in range(partitions)]
        self.jobs: list[StepJob] = []  # local step bodies, started, outcome not decided yet
        self.tasks: list[StepTask] = []  # every remote attempt dispatched
        self.answered: set[str] = set()  # attempt ids a result was sent for
        self.timers = TimerQueue()
        self.since = [0] * partitions  # when the current owner took each partition over
        self.offsets = [0] * partitions
        self.last: Delivered | None = None  # the latest command delivered
        self.log: list[Delivered] = []  # every command consumed, duplicates too, in order
        # (run, seq, run attempt) of each step an outbound interceptor saw settle live
        # (not replaying), and (run, "execute" or "update <id>", run attempt) of each start
        # of a run's code or of a handler an inbound one saw live: while deciding a batch,
        # then once it commits.
        self.seen: list[tuple[str, int | str, int]] = []
        self.settled: list[tuple[str, int | str, int]] = []

    def _decider(self) -> Decider:
        return Decider(
            self.registry,
            partitions=self.partitions,
            journal_topic=JOURNAL,
            limits=Limits(blob_threshold=BLOB_THRESHOLD),
            blobs=self.blobs,
        )

    # -- where things live ---------------------------------------------------------
    def partition(self, run_id: str) -> int:
        return partition_for(run_id.encode(), self.partitions)

    def state(self, run_id: str) -> State:
        return self.states.get(run_id) or new_state(run_id)

    def run_state(self, run_id: str) -> RunState:
        """The state of the run ``run_id`` (not an entity)."""
        st = self.state(run_id)
        assert isinstance(st, RunState), run_id
        return st

    def value(self, data: bytes | None) -> Any:
        """A payload's value, read from the model's blobs topic if it is a reference."""
        with blobs.active(self.blobs):
            return payload.loads(data)

    def facts(self, run_id: str) -> list[Fact]:
        return self.by_run.get(run_id, [])

    def runs(self) -> list[str]:
        """The run ids (not entities) with a journal."""
        return sorted(r for r in self.by_run if id_kind(r) is IdKind.RUN)

    def entities(self) -> list[str]:
        return sorted(r for r in self.by_run if id_kind(r) is not IdKind.RUN)

    def checked(self) -> set[str]:
        """The runs touched since the last call (for invariants checked incrementally)."""
        touched, self.touched = self.touched, set()
        return touched

    def pending(self) -> int:
        return sum(len(q) for q in self.queues)

    # -- deciding and committing ---------------------------------------------------
    def batch(self) -> Batch:
        return Batch(lambda _p, run_id: self.state(run_id), self.now, {}, lambda p: self.since[p])

    def decide(self, work: Iterable[Work]) -> Batch:
        """Decide ``work`` into one batch, without committing it."""
        return self.decide_each(work)[0]

    def decide_each(self, work: Iterable[Work]) -> tuple[Batch, list[Share]]:
        """Decide ``work`` into one batch, without committing it; and each item's share."""
        self.seen = []  # what the interceptors saw deciding it (kept if it commits)
        self.blobs.pending.clear()  # an aborted batch's blobs never reached the topic
        b = self.batch()
        fx = b.effects
        shares = []
        for item in work:
            # A record is keyed by its run id (`record`); the work items carry it.
            key = item.key if isinstance(item, LogRecord) else item.run_id.encode()
            run_id = (key or b"").decode()
            w = b.runs.get(run_id)
            before = self.state(run_id) if w is None else w.after.copy()
            facts, letters, replies = len(fx.facts), len(fx.dead_letters), len(fx.replies)
            self.decider.handle(b, item)
            # Later decisions only append, or roll back to their own mark: this stays.
            shares.append(
                Share(fx.facts[facts:], fx.dead_letters[letters:], fx.replies[replies:], before)
            )
        return b, shares

    def commit(self, b: Batch) -> Batch | None:
        """Commit ``b`` as the shell would; None if dropped. An empty batch is dropped, but
        a state change in it with no fact (`Batch.changed`) is kept and its timers armed."""
        if b.empty and not b.changed:
            return None
        self.touched.update(b.runs)
        for run_id, w in b.runs.items():
            self.states[run_id] = w.after
            self.timers.update(w.partition, run_id, w.before.timers(), w.after.timers())
        if b.empty:
            return None
        self.settled += self.seen
        fx = b.effects
        self.journal += fx.facts
        for fact in fx.facts:
            self.by_run.setdefault(fact.run_id, []).append(fact)
        self.dead += fx.dead_letters
        for blob in fx.blobs:  # in the transaction of the facts that reference them
            self.blobs.committed[blob.ref.sha256] = b"".join(blob.chunks)
        for cmd in fx.commands:
            self.send(cmd, internal=True)
        self.jobs += fx.steps
        self.tasks += fx.tasks
        return b

    def run(self, *work: Work) -> Batch | None:
        return self.commit(self.decide(work))

    # -- commands ------------------------------------------------------------------
    def send(self, cmd: Command, internal: bool = False) -> None:
        """Produce ``cmd`` to the commands topic (keyed by its run id)."""
        self.queues[self.partition(cmd.run_id)].append((cmd, internal))

    def record(self, cmd: Command) -> LogRecord:
        p = self.partition(cmd.run_id)
        self.offsets[p] += 1
        key = cmd.run_id.encode()
        return LogRecord("m.commands", p, self.offsets[p], key, self.codec.encode(cmd))

    def deliver(self, p: int) -> Delivered:
        """Consume the next command of partition ``p``, alone in its batch."""
        cmd, internal = self.queues[p].popleft()
        b, shares = self.decide_each([self.record(cmd)])
        return self.consumed(cmd, internal, self.commit(b), shares[0])

    def take(self, order: Iterable[int]) -> list[tuple[Command, bool]]:
        """What a poll returns: for each partition in ``order``, the next command queued
        there (the next partition's if none is: each partition's stay in order), till
        every queue is empty. Each is (command, sent by a run or an entity)."""
        out = []
        for p in order:
            if not self.pending():
                break
            while not self.queues[p % self.partitions]:
                p += 1
            out.append(self.queues[p % self.partitions].popleft())
        return out

    def poll(
        self,
        cmds: Sequence[tuple[Command, bool]],
        work: Sequence[Work] = (),
        redo: bool = False,
        refused: Collection[int] = (),
    ) -> Batch | None:
        """Consume ``cmds`` (each: a command, sent by a run or an entity) and decide them
        in one batch with the internal ``work`` after them, as the shell's loop decides a
        poll; commit it once (the batch, or None if dropped). ``redo``: its transaction
        aborts first, and it is decided again uncached (`Decider.forget`): it must decide
        the same facts. ``refused``: the indexes in ``cmds`` of commands that must be
        refused without a trace: the batch decides what it decides without them (by a
        decider of its own, `reference`), and a dead letter for each."""
        records = [self.record(cmd) for cmd, _ in cmds]
        items = [*records, *work]
        without = [item for i, item in enumerate(items) if i not in refused]
        ref = self.reference(without) if refused else None
        b, shares = self.decide_each(items)
        if redo:
            self.forget(b.runs)
            again, shares = self.decide_each(items)
            assert b.effects.facts == again.effects.facts, (
                "the redone batch decides other facts than the aborted one:\n"
                f"  first:  {b.effects.facts}\n  second: {again.effects.facts}"
            )
            b = again
        for rec in records:  # a refused record too: its bytes never block the partition
            first, last = b.consumed.get(rec.partition, (rec.offset + 1, rec.offset))
            assert first <= rec.offset <= last, f"record {rec.offset} of {rec.partition} kept"
        if ref is not None:
            gone = {(records[i].partition, records[i].offset) for i in refused}
            assert not (diff := differences(ref, b, gone)), (
                "the batch decides otherwise with commands in it that it refused:\n"
                + "\n".join(diff)
            )
        done = self.commit(b)
        for (cmd, internal), share in zip(cmds, shares[: len(cmds)], strict=True):
            self.consumed(cmd, internal, done, share)
        return done

    def reference(self, work: Iterable[Work]) -> Batch:
        """``work`` decided into a batch by a decider of its own (no coroutine cached;
        none left in this one's cache), to compare: neither committed nor seen."""
        seen, self.seen = self.seen, []
        b = self.batch()
        decider = self._decider()
        for item in work:
            decider.handle(b, item)
        self.seen = seen
        return b

    def ready(self, jobs: Sequence[StepJob], how: Sequence[str], timers: bool) -> list[Work]:
        """The internal work a poll decides after its commands: the outcomes (``how``) of
        the bodies ``jobs`` (no longer waiting in `jobs` then), and with ``timers`` every
        timer due by `now`, earliest first."""
        work: list[Work] = []
        for job, h in zip(jobs, how, strict=True):
            self.jobs.remove(job)
            work.append(ended(job, h))
        if timers:
            work += self.timers.pop_due(self.now, len(self.timers) + 1)
        return work

    def consumed(
        self,
        cmd: Command,
        internal: bool,
        batch: Batch | None,
        share: Share,
        again: bool = False,
    ) -> Delivered:
        """Log what consuming ``cmd`` did; unless ``again`` (a producer's duplicate), it
        is the `last` command delivered."""
        done = Delivered(cmd, internal, batch, share)
        self.log.append(done)
        if not again:
            self.last = done
        return done

    # -- step bodies and task workers ----------------------------------------------
    def outcome(self, job: StepJob, how: str) -> Batch | None:
        """The body of ``job`` ended: ``ok``, ``retryable`` failure or ``terminal`` one."""
        self.jobs.remove(job)
        return self.run(ended(job, how))

    def written(self, data: bytes) -> bytes:
        """What a task worker sends for ``data``: its reference once it is on the topic."""
        ref, chunks = split(data, Limits().payload, self.now)
        self.blobs.committed[ref.sha256] = b"".join(chunks)
        return ref.encode()

    def answer(self, task: StepTask, how: str) -> None:
        """A task worker sends the result of ``task`` (to the queue: it may come late)."""
        ok = how == "ok"
        self.answered.add(task.attempt_id)
        self.send(
            StepResult(
                task.run_id,
                task.seq,
                attempt=task.attempt,
                ok=ok,
                output=self.written(padded(task.seq)) if ok else b"null",
                error=None if ok else f"{how} failure",
                traceback=None,
                attempt_id=task.attempt_id,
                retryable=how == "retryable",
            )
        )

    # -- time ----------------------------------------------------------------------
    def fire_due(self) -> None:
        """Fire every armed timer due by ``now``, one batch each, earliest first."""
        while True:
            due = self.timers.pop_due(self.now, 1)
            if not due:
                return
            self.run(due[0])

    def next_due(self) -> int | None:
        return self.timers.next_due()

    # -- faults --------------------------------------------------------------------
    def restore(self, p: int) -> None:
        """A new owner takes partition ``p`` over after a crash or a handover: states are
        folded from the journal, the coroutine cache is empty, the local step bodies of
        the old owner are gone, timers are armed from the states, and runs with a step
        open are recovered (parked ones resumed)."""
        mine = sorted(r for r in self.by_run if self.partition(r) == p)
        self.decider.forget(mine)
        self.jobs = [j for j in self.jobs if j.partition != p]
        self.since[p] = self.now
        self.timers.drop({p})
        self.touched.update(mine)
        for run_id in mine:
            st = self.states[run_id] = fold(run_id, self.facts(run_id))
            for due, seq in st.timers():
                self.timers.add(p, run_id, seq, due)
        for run_id in mine:  # one at a time, as the inbox does
            st = self.states[run_id]
            if not isinstance(st, RunState):
                continue
            if st.running_steps() or st.handed_over_steps():
                self.run(Recover(p, run_id))
            elif st.status == "parked":
                self.run(Resume(p, run_id))

    def hand_over(self, p: int, began: frozenset[tuple[str, int]]) -> None:
        """The owner of ``p`` lets it go gracefully: the steps still open there are handed
        over in one batch (``began``: those whose body had begun), then a new owner
        restores it."""
        runs = [r for r, st in sorted(self.states.items()) if self.partition(r) == p]
        self.jobs = [j for j in self.jobs if j.partition != p]
        self.run(
            *(
                HandOver(p, r, frozenset(s for rr, s in began if rr == r))
                for r in runs
                if isinstance(st := self.states[r], RunState) and st.running_steps()
            )
        )
        self.restore(p)

    def forget(self, run_ids: Iterable[str]) -> None:
        """A cache miss: the coroutines of these runs are dropped."""
        self.decider.forget(run_ids)


def differences(want: Batch, got: Batch, refused: Collection[tuple[int, int]]) -> list[str]:
    """What ``got`` decided otherwise than ``want``, the same work less the records at
    ``refused`` (partition, offset), whose dead letters ``got`` adds: its effects, or
    the states it leaves."""
    a, b = want.effects, got.effects
    out = []
    letters = [d for d in b.dead_letters if (d.partition, d.offset) not in refused]
    pairs = [
        ("facts", a.facts, b.facts),
        ("commands", a.commands, b.commands),
        ("replies", a.replies, b.replies),
        ("steps", a.steps, b.steps),
        ("tasks", a.tasks, b.tasks),
        ("dead letters", a.dead_letters, letters),
    ]
    for what, x, y in pairs:
        if x != y:
            out.append(f"  {what}: without them {x}\n  {' ' * len(what)}  with them    {y}")
    for run_id, w in sorted(want.runs.items()):  # heartbeats too: they are no facts
        if w.after != (after := got.runs[run_id].after):
            out.append(f"  {run_id}, without them / with them: {changed(w.after, after)}")
    return out


def changed(x: Any, y: Any) -> str:
    """The fields of two states (dataclasses) that differ, each as x's / y's."""
    if not (is_dataclass(x) and type(x) is type(y)):
        return f"{x!r} / {y!r}"
    return ", ".join(
        f"{f.name} {getattr(x, f.name)!r} / {getattr(y, f.name)!r}"
        for f in fields(x)
        if getattr(x, f.name) != getattr(y, f.name)
    )


def padded(value: Any) -> bytes:
    """The JSON of ``value`` with leading blanks: the same value, past `BLOB_THRESHOLD`,
    so step outputs go by reference through every interleaving."""
    return b" " * BLOB_THRESHOLD + payload.dumps(value)


def ended(job: StepJob, how: str) -> StepOutcome:
    """The outcome of ``job``'s body: ``ok``, a ``retryable`` failure or a ``terminal`` one."""
    ok = how == "ok"
    return StepOutcome(
        job.partition,
        job.run_id,
        job.seq,
        job.attempt,
        ok,
        padded(job.args[0] if job.args else None) if ok else b"null",
        None if ok else f"{how} failure",
        retryable=how == "retryable",
        isolated=job.isolated,
    )


def without_beats(st: State) -> State:
    """``st`` without its heartbeats: they are not facts (the projection keeps them
    beside the facts, and a new owner starts them afresh)."""
    return replace(st.copy(), beats={}) if isinstance(st, RunState) else st


def describe(x: Any) -> str:
    return type(x).__name__
