"""`Decider.handle(batch, work)`: the core's one entry point. It never raises.

Each consumed record is checked in this order, and the first problem decides:

1. it decodes (else ``undecodable``) into a command (else ``not-a-command``);
2. its run id is usable (else ``bad-run-id``);
3. it arrived on the partition its run id hashes to (else it is forwarded there);
4. it fits the size limit (else ``oversize``; a start is also recorded as rejected), and
   the large payloads it references can be read (else ``blob-missing``, `engine.blobs`);
5. its id is of the kind its command is for (`kind_problem`): a run's, or a limit's, an
   event entity's (exactly its event's) or a schedule's (else ``bad-run-id``);
6. its rule accepts it (else the rule's reason: ``unknown-workflow``, ``invalid-input``,
   ``unknown-run``, ``unexpected-step-result``);
7. what it decided can be encoded (else ``unencodable``: a name or key the workflow made
   of text UTF-8 cannot carry; free texts are cleaned where facts are made, `Limits.clip`).

A refused command goes to the dead-letter topic with its code and reason (a refused
start also becomes a RunRejected fact, so ``result()`` can say why). A decision that
fails unexpectedly is undone, dead-lettered as ``internal-error`` and logged: one bad
record or run never blocks its partition. Internal work (step outcomes, due timers,
recoveries) goes through the same guard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from runstream.engine.blobs import Blobs, MemoryBlobs, active, refs_in
from runstream.engine.interceptors import kafka_headers
from runstream.engine.limits import Limits
from runstream.engine.partitioner import partition_for
from runstream.engine.reducer import apply
from runstream.engine.rules import HANDLERS, Activation, Rejected, Rules
from runstream.engine.rules.blobs import over_budget
from runstream.engine.rules.children import tell_refused_parent
from runstream.engine.rules.core import emit
from runstream.engine.rules.runs import run_info
from runstream.engine.state import Beat, RunState, RunView, State, beats_of
from runstream.engine.work import Batch, Forward, LogRecord, Waiter, Work
from runstream.engine.workflow import Registry
from runstream.errors import BlobUnavailable, DecodeError, SchemaError
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    ENTITY_PREFIX,
    Command,
    DeadLetter,
    Kind,
    LifecycleEvent,
    LiveQuery,
    PublishEvent,
    Reason,
    RunInfo,
    RunRejected,
    StartRun,
    StepResult,
    Subscribe,
    correlation_id,
    id_kind,
    redrives_of,
    run_id_problem,
)

log = logging.getLogger("runstream.engine")


class Decider:
    """Decides every command and internal work item of one App's namespace.

    Args:
        registry: the App's workflows and steps.
        partitions: the namespace's partition count (to check where commands arrive).
        journal_topic: named by the dead letter of a dead run.
        limits: record sizes (`engine.limits`).
        max_recovery_attempts: crashes charged to a run before it is dead.
        activation: brackets each run of workflow code (the shell's time budget).
    """

    def __init__(
        self,
        registry: Registry,
        *,
        partitions: int,
        journal_topic: str,
        limits: Limits | None = None,
        max_recovery_attempts: int = 3,
        activation: Activation | None = None,
        codec: Codec | None = None,
        blobs: Blobs | None = None,
    ) -> None:
        self.partitions = partitions
        # Resolves large payloads' references (the shell's reads the blobs topic).
        self.blobs = blobs or MemoryBlobs()
        self.limits = limits or Limits()
        self.codec = codec or Codec.default()
        self.rules = Rules(
            registry, self.limits, journal_topic, max_recovery_attempts, activation, partitions
        )

    def handle(self, b: Batch, work: Work) -> str | None:
        """Decide ``work`` into ``b``; the run it was about (None for a record set aside
        before it named one, or forwarded). Never raises."""
        with active(self.blobs):
            return self._handle(b, work)

    def _handle(self, b: Batch, work: Work) -> str | None:
        if isinstance(work, LogRecord):
            return self._record(b, work)
        self._decide(b, work.partition, work.run_id, lambda st: self._dispatch(b, st, work))
        return work.run_id

    # -- commands ------------------------------------------------------------------
    def _record(self, b: Batch, rec: LogRecord) -> str | None:
        b.consume(rec)
        value = rec.value or b""
        try:
            cmd = self.codec.decode(value)
        except DecodeError as exc:
            if exc.kind == "unknown-fingerprint":  # a rolling deploy: written by a newer one?
                why = (
                    f"a record of a schema this engine does not know ({exc}): written by a "
                    "newer Runstream? Upgrade every engine, then `runstream dlq redrive` it"
                )
                self._dead_letter(b, rec, Reason.UNKNOWN_SCHEMA, why)
            else:
                self._dead_letter(b, rec, Reason.UNDECODABLE, f"undecodable record ({exc})")
            return None
        if not isinstance(cmd, Command):
            self._dead_letter(b, rec, Reason.NOT_A_COMMAND, f"{cmd.AVRO} is not a command")
            return None
        run_id = cmd.run_id
        start = isinstance(cmd, StartRun)
        continued_from = cmd.continued_from if isinstance(cmd, StartRun) else None
        problem = run_id_problem(run_id, new=start, continued_from=continued_from)
        if problem:
            self._dead_letter(b, rec, Reason.BAD_RUN_ID, problem)
            return None
        merged = isinstance(cmd, StartRun | LiveQuery) and kafka_headers(rec.headers)
        if isinstance(cmd, StartRun | LiveQuery) and merged:  # a plain producer's traceparent
            cmd = replace(cmd, headers={**merged, **cmd.headers})
        home = partition_for(run_id.encode(), self.partitions)
        if home != rec.partition:  # a producer with another partitioner: route it home
            # (a command with its Kafka headers in it: forwarding keeps no Kafka headers)
            b.effects.forwards.append(
                Forward(home, rec.key, self.codec.encode(cmd) if merged else value)
            )
            return None
        size = len(value) + sum(len(k) + len(v) for k, v in rec.headers)
        too_large = self.limits.too_large(f"the {cmd.AVRO} command", size)
        refused = Rejected(Reason.OVERSIZE, too_large) if too_large else self._blob_problem(cmd)
        if refused is not None:
            reject = refused

            def refuse(_st: State) -> None:
                raise reject

            self._decide(b, rec.partition, run_id, refuse, rec, cmd)
        else:
            self._decide(b, rec.partition, run_id, lambda st: self._dispatch(b, st, cmd), rec, cmd)
        if isinstance(cmd, StartRun) and cmd.reply_to:  # whatever the start came to
            run = b.runs.get(run_id)
            after = None if run is None else run.after
            if not (isinstance(after, RunState) and after.request_id == cmd.request_id):
                # its RunStarted does not carry this request: the shell waits for the end
                b.effects.waiters.append(
                    Waiter(rec.partition, run_id, cmd.reply_to, cmd.request_id)
                )
        return run_id

    def _blob_problem(self, cmd: Command) -> Rejected | None:
        """Why the large payloads ``cmd`` references cannot be read, or None. Reading them
        here (the store keeps them) makes a foreign producer's bad reference a dead letter,
        never a failure in the middle of a run's replay."""
        try:
            for ref in refs_in(cmd):
                self.blobs.read(ref)
        except BlobUnavailable as exc:
            return Rejected(Reason.BLOB_MISSING, f"the {cmd.AVRO} command: {exc}")
        return None

    def forget(self, run_ids: Iterable[str]) -> None:
        """The shell dropped these runs' uncommitted facts: never resume ahead of them."""
        self.rules.replayer.forget(run_ids)

    def run_info(self, st: RunView, request_id: str) -> RunInfo:
        """What a Query learns about the run ``st`` (the shell answers waiting ones)."""
        return run_info(self.rules, st, request_id)

    def _dispatch(self, b: Batch, st: State, item: Command | Work) -> None:
        """Hand ``item`` to its handler (`rules.HANDLERS`), if it is for this kind of id."""
        kind, handler = HANDLERS[type(item)]
        problem = kind_problem(item, st, kind)
        if problem:
            raise Rejected(Reason.BAD_RUN_ID, problem)
        if (
            isinstance(st, RunState)
            and isinstance(item, Command)
            and not isinstance(item, StepResult)
        ):
            size = sum(ref.size for ref in refs_in(item))  # a step's output: `rules.blobs`
            if size and (over := over_budget(self.limits, st, f"the {item.AVRO} command", size)):
                raise Rejected(Reason.OVERSIZE, over)
        handler(self.rules, b, st, item)

    # -- the guard -----------------------------------------------------------------
    def _decide(
        self,
        b: Batch,
        p: int,
        run_id: str,
        decision: Callable[[State], None],
        cause: LogRecord | None = None,
        cmd: Command | None = None,
    ) -> None:
        """Run one decision; if it refuses or fails, undo its effects and dead-letter it."""
        st = b.state(p, run_id)
        mark, beats = b.effects.mark(), dict(beats_of(st))
        size = (st.facts, st.history_bytes) if isinstance(st, RunState) else None
        try:
            self._encoded(b, st, decision)
            if size is not None and isinstance(st, RunState):
                self._history_warning(b, st, *size)
        except Rejected as exc:
            if not exc.keep:
                st = self._undo(b, run_id, mark, beats)
            reason = self.limits.clip(exc.reason)
            self._dead_letter(b, cause, exc.code, reason, run_id, p)
            if isinstance(cmd, StartRun) and isinstance(st, RunState) and not st.exists:
                workflow = self.limits.clip(cmd.workflow[:1024])  # a foreign name: cleaned
                rejected = RunRejected(
                    run_id, b.now, workflow=workflow, code=exc.code, reason=reason
                )
                emit(b, st, rejected)
                tell_refused_parent(b, cmd, self.limits.clip(f"{exc.code}: {reason}"))
        except Exception as exc:  # a bug must not block the partition: set the cause aside
            log.exception("decision failed for run %s", run_id)
            self._undo(b, run_id, mark, beats)
            reason = self.limits.clip(f"internal error: {exc!r}")
            self._dead_letter(b, cause, Reason.INTERNAL, reason, run_id, p)

    def _history_warning(self, b: Batch, st: RunState, facts: int, size: int) -> None:
        """The decision took the run's history past its warning size: say so, once, on
        the lifecycle stream (at its cap the run fails: `rules.core`)."""
        over = self.limits.history_over(st.facts, st.history_bytes, warn=True)
        if over is None or self.limits.history_over(facts, size, warn=True) is not None:
            return
        b.effects.lifecycle.append(
            LifecycleEvent(
                Kind.RUN_HISTORY_LARGE, st.run_id, at_ms=b.now, workflow=st.workflow,
                version=st.version, status=st.status,
                reason=f"the run's history has {over}; at its cap the run fails: continue as new",
            )
        )  # fmt: skip

    def _encoded(self, b: Batch, st: State, decision: Callable[[State], None]) -> None:
        """Run the decision and encode what it produced (the outbox produces these bytes):
        text UTF-8 cannot carry (a lone surrogate) in it refuses it, so that what a user or
        a foreign producer sent never makes the shell fail. Free texts are cleaned before
        (`Limits.clip`); this catches the ids and names a workflow made of such text."""
        kept: Rejected | None = None
        try:
            decision(st)
        except UnicodeEncodeError as exc:  # such an id checked (its size in UTF-8, ...)
            text = f"{exc.object!r:.300}" if isinstance(exc.object, str) else "a text"
            why = f"{text} holds text UTF-8 cannot carry (a lone surrogate)"
            raise Rejected(Reason.UNENCODABLE, f"the decision cannot be recorded: {why}") from exc
        except Rejected as exc:
            if not exc.keep:
                raise
            kept = exc  # what it did stands: encoded and checked as any decision's
        try:
            size, kind = b.effects.encode(self.codec.encode)
        except SchemaError as exc:
            raise Rejected(Reason.UNENCODABLE, f"the decision cannot be recorded: {exc}") from exc
        if size > self.limits.record:  # what no rule sized: an interceptor's headers, say
            raise Rejected(
                Reason.OVERSIZE,
                f"the decision makes a {kind} record of {size:,} bytes; a record takes at "
                f"most {self.limits.record:,} (the largest Kafka record, "
                f"{self.limits.max_record:,}, less its framing)",
            )
        if kept is not None:
            raise kept

    def _undo(self, b: Batch, run_id: str, mark: tuple[int, ...], beats: dict[int, Beat]) -> State:
        """Drop the effects since ``mark``, and rebuild the working copy of the run and of
        any entity the decision wrote to (a task group's: `rules.taskgroups`) from its
        committed state and its facts before the mark (no copy on the happy path). The
        run's heartbeats are no facts: they are put back as they were before the
        decision (``beats``), the batch's earlier ones with them."""
        touched = {run_id} | {f.run_id for f in b.effects.facts[mark[0] :]}
        kept = {key: dict(beats_of(b.runs[key].after)) for key in touched} | {run_id: beats}
        b.effects.rollback(mark)
        self.rules.replayer.forget([run_id])  # its coroutine may be ahead now
        for key in touched:
            w = b.runs[key]
            w.after = w.before.copy()
            for fact in b.effects.facts:
                if fact.run_id == key:
                    apply(w.after, fact)
            if isinstance(w.after, RunState):
                w.after.beats = kept[key]
        w = b.runs[run_id]
        w.seen = w.after.copy()  # what the batch's earlier activations ran: a replay now
        return w.after

    def _dead_letter(
        self,
        b: Batch,
        rec: LogRecord | None,
        code: Reason,
        reason: str,
        run_id: str | None = None,
        p: int = -1,
    ) -> None:
        """Set ``rec`` (or, without one, the run) aside on the dead-letter topic."""
        reason = self.limits.clip(reason)
        log.warning("dead letter (%s): %s", code, reason)
        if rec is None:
            key = run_id.encode() if run_id else None
            letter = DeadLetter(
                reason,
                self.rules.journal_topic,
                partition=p,
                offset=-1,
                key=key,
                value=None,
                run_id=run_id,
                at_ms=b.now,
                code=code,
            )
        else:
            letter = dead_letter(rec, code, reason, self.limits, b.now, run_id)
        b.effects.dead_letters.append(letter)


def kind_problem(
    item: Command | Work, st: State, kind: type[State] | tuple[type[State], ...] | None
) -> str | None:
    """Why ``item`` may not go to ``st``: each command is for one kind of id (``kind``,
    from `rules.HANDLERS`: an Acquire keyed by a run would write limit facts into that
    run's journal), an event's command for exactly its name and key's entity, and a run's
    for no id the engine reserves. A Query (``kind`` None) may ask about any id: it only
    reads."""
    name, run_id = type(item).__name__, st.run_id
    if kind is not None and not isinstance(st, kind):
        return f"{name} is not for {run_id!r}, a {id_kind(run_id)} id"
    if kind is not None and isinstance(st, RunState) and run_id.startswith(ENTITY_PREFIX):
        return f"{name} is for a run, and {run_id!r} names an engine entity"
    if isinstance(item, PublishEvent | Subscribe) and run_id != correlation_id(item.name, item.key):
        what = f"{name} of event {item.name!r} (key {item.key!r})"
        return f"{what} is keyed {run_id!r}, not by its correlation id"
    return None


def dead_letter(
    rec: LogRecord,
    code: Reason,
    reason: str,
    limits: Limits,
    now: int,
    run_id: str | None = None,
) -> DeadLetter:
    """The dead letter of a consumed record: what fits of it is copied (the original
    stays on its topic at its partition and offset)."""
    key = rec.key if rec.key is None or len(rec.key) <= 1024 else None
    value = rec.value if len(rec.value or b"") <= limits.payload else None
    if value is None and rec.value:
        reason += f" (the {len(rec.value):,}-byte value is not copied here)"
    redrives = redrives_of(rec.headers)  # an operator's redrive failed again: count it
    return DeadLetter(
        reason,
        rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        key=key,
        value=value,
        run_id=run_id,
        at_ms=now,
        code=code,
        redrives=redrives,
    )
