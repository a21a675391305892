"""The journal's invariants, run by run, one fact at a time (pure: no Kafka).

Per run (ARCHITECTURE.md section 7):

- the first fact is RunStarted (after any RunRejected of earlier refused starts), and
  there is exactly one;
- the positive sequence numbers used are 1..k with no gap; a negative one, -s, is the
  compensation of step s and needs a completed step s;
- each (run, seq) is settled at most once (StepCompleted, a final StepFailed,
  TimerFired, SignalReceived, SignalTimedOut, ValueRecorded), and nothing starts it
  again once settled: a completed step never runs again;
- a StepCompleted or StepFailed answers the open StepStarted of that seq and attempt;
  a step starts again while running only after a RunRecovered; a StepHandedOver lets
  the open attempt go, and the next StepStarted of that seq repeats its attempt number;
- a finished run has exactly one terminal fact (RunCompleted, RunFailed, RunCancelled,
  RunDead) and nothing after it, unless a RunRetried lets a failed or dead run go on:
  then the final failures it names are open again, as retries, and nothing else is; an
  ended run may also name, once, the new run it was retried as (RetriedAsNew);
- an awaited child (ChildStarted) stays open until its ChildEnded; a fire-and-forget one,
  and a child that could not start (ChildEnded ``rejected``), settle their seq at once;
- a PermitReceived answers the run's PermitRequested of that seq, and a run waiting for
  a permit is suspended for it;
- a PromiseCreated settles its seq (as a RunEventSet does); a PromiseCompleted completes
  an open promise of the run, once, and a run with an open promise may be suspended for it;
- a limit entity (``~limit/...``) never holds more permits than its concurrency, grants
  each request once, and takes back only permits it granted or requests it queued;
- every dead run has a ``run-dead`` record on the dlq;
- a run that has not finished is suspended for a reason: a step in flight, a retry
  scheduled, an open timer, an open signal wait, or parked (or it was only rejected).
  With ``expect_finished`` an unfinished run is a violation too.

`RunCheck` keeps a few small dicts per run, so a journal of millions of facts is read in
one pass; `check_run` applies it to a list of facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from runstream.schemas.records import (
    END_FACTS,
    ENTITY_PREFIX,
    UPDATE_SEQ_BASE,
    ChildEnded,
    ChildStarted,
    CompensationStarted,
    EventAwaited,
    EventReceived,
    EventTimedOut,
    Fact,
    LimitSet,
    PermitGranted,
    PermitReceived,
    PermitReleased,
    PermitRequested,
    PromiseCompleted,
    PromiseCreated,
    RetriedAsNew,
    RunEventSet,
    RunParked,
    RunPaused,
    RunRecovered,
    RunRejected,
    RunRetried,
    RunStarted,
    RunUnpaused,
    SignalAwaited,
    SignalBuffered,
    SignalReceived,
    SignalTimedOut,
    StepCompleted,
    StepFailed,
    StepHandedOver,
    StepHeld,
    StepStarted,
    TimerFired,
    TimerScheduled,
    UpdateAccepted,
    UpdateCompleted,
    ValueRecorded,
)

# Why an unfinished run may legitimately wait, by the kind of its open operation.
_WAITS = {
    "StepStarted": "step in flight",
    "StepFailed": "retry scheduled",
    "StepHandedOver": "step in flight",
    "StepHeld": "task group paused",
    "TimerScheduled": "open timer",
    "SignalAwaited": "open signal wait",
    "ChildStarted": "child running",
    "EventAwaited": "open event wait",
}
_PERMIT_WAIT = "waiting for a permit"
_PROMISE_WAIT = "open promise"
_WAIT_ORDER = (
    "step in flight",
    "retry scheduled",
    "task group paused",
    "open timer",
    "open signal wait",
    "open event wait",
    "child running",
    _PERMIT_WAIT,
    _PROMISE_WAIT,
)
# What a settling fact may settle, and which ones need it open.
_OPENED_BY = {
    "TimerFired": ("TimerScheduled",),
    "SignalTimedOut": ("SignalAwaited",),
    "SignalReceived": ("SignalAwaited",),
    "ValueRecorded": (),
    "PromiseCreated": (),
    "RunEventSet": (),
    "EventReceived": ("EventAwaited",),
    "EventTimedOut": ("EventAwaited",),
}
_NEEDS_OPEN = frozenset({"TimerFired", "SignalTimedOut", "EventReceived", "EventTimedOut"})


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: where (run, partition, offsets) and what."""

    run_id: str
    partition: int | None
    offsets: tuple[int, ...]
    message: str

    def __str__(self) -> str:
        where = "" if self.partition is None else f"p{self.partition} "
        at = ",".join(map(str, self.offsets))
        return f"run {self.run_id!r} [{where}@{at}]: {self.message}"


def settles(fact: Fact) -> bool:
    """The fact settles its sequence number for good."""
    if isinstance(fact, StepFailed):
        return fact.retry_at_ms is None
    if isinstance(fact, ChildStarted):
        return not fact.awaited  # a fire-and-forget child settles its seq at once
    return isinstance(
        fact,
        StepCompleted
        | TimerFired
        | SignalReceived
        | SignalTimedOut
        | ValueRecorded
        | ChildEnded
        | EventReceived
        | EventTimedOut
        | PromiseCreated
        | RunEventSet,
    )


class RunCheck:
    """The journal rules for one run, fed its facts in journal order by :meth:`add`.

    ``pos`` is where a fact was read (its offset, or its index in a list); each problem
    is recorded as ``(message, positions)``. Call :meth:`finish` once, after the last fact.
    """

    __slots__ = (
        "after_end",
        "completed",
        "dead_lettered",
        "entity",
        "facts",
        "failed_attempt",
        "first",
        "held",
        "key",
        "limit",
        "open",
        "parked",
        "partition",
        "paused",
        "permits",
        "problems",
        "promises",
        "recovering",
        "retried_as",
        "run_id",
        "seqs",
        "settled",
        "starts",
        "status",
        "terminal_at",
        "updates",
    )

    def __init__(self, run_id: str, partition: int | None = None) -> None:
        self.run_id = run_id
        self.key = run_id.encode()
        self.partition = partition  # where every record of the run must be
        self.facts = 0
        self.first: str | None = None
        self.starts = 0
        self.status: str | None = None  # completed/failed/cancelled/dead once terminal
        self.terminal_at = -1
        self.after_end: list[tuple[str, int]] = []
        self.parked = False
        self.paused = False  # between RunPaused and RunUnpaused (or a cancel's compensation)
        self.dead_lettered = False
        self.problems: list[tuple[str, tuple[int, ...]]] = []
        # seq -> (kind of open fact, its attempt, its position): what the run waits for
        self.open: dict[int, tuple[str, int, int]] = {}
        self.settled: dict[int, tuple[str, int]] = {}  # seq -> (fact, position)
        self.completed: set[int] = set()  # steps with a StepCompleted
        self.seqs: set[int] = set()
        self.recovering: set[int] = set()  # seqs with a RunRecovered, not yet restarted
        self.failed_attempt: dict[int, int] = {}  # seq -> attempt of its final StepFailed
        self.entity = run_id.startswith(ENTITY_PREFIX)  # ~event/...: not a run
        self.retried_as = False  # a RetriedAsNew was seen
        self.permits: dict[int, int] = {}  # seq -> position of its open PermitRequested
        self.promises: set[int] = set()  # seqs of promises created and not completed
        # a limit entity: its concurrency, and the permits it holds out (holder, seq)
        self.limit: int | None = None
        self.held: set[tuple[str, int]] = set()
        self.updates: dict[str, bool] = {}  # accepted update id -> completed

    def _bad(self, message: str, *positions: int) -> None:
        self.problems.append((message, positions))

    def add(self, fact: Fact, pos: int) -> None:
        """Check one fact against what the run's earlier facts allow."""
        name = type(fact).__name__
        self.facts += 1
        if self.entity:  # an event, schedule or limit entity: no run, none of the run rules
            self.first = self.first or name
            self._limit(fact, pos)
            return
        if self.first is None or (self.first == "RunRejected" and self.starts == 0):
            self.first = name
            if not isinstance(fact, RunStarted | RunRejected):
                self._bad(f"first fact is {name}, not RunStarted", pos)
        seq = getattr(fact, "seq", None)
        if isinstance(fact, RunRetried):
            self._retried(fact, pos)
            return
        if isinstance(fact, RetriedAsNew):
            if self.status is None:
                self._bad("RetriedAsNew of a run that has not ended", pos)
            elif self.retried_as:
                self._bad("a second RetriedAsNew", pos)
            self.retried_as = True
            return
        if self.status is not None:  # nothing may follow the end
            self.after_end.append((name, pos))
            if settles(fact) and seq is not None:
                self._settled_twice(name, seq, pos)
            return
        if self.parked and not isinstance(fact, RunParked | SignalBuffered | PromiseCompleted):
            self.parked = False
        if self.paused and seq is not None and seq not in self.seqs:  # its code ran
            self._bad(f"{name} seq {seq} is a new operation while the run is paused", pos)
        if seq is not None:
            self.seqs.add(seq)
        match fact:
            case StepStarted():
                self._step_started(fact, pos)
            case StepCompleted() | StepFailed():
                self._step_ended(fact, pos)
            case (
                TimerFired()
                | SignalReceived()
                | SignalTimedOut()
                | ValueRecorded()
                | EventReceived()
                | EventTimedOut()
                | PromiseCreated()
                | RunEventSet()
            ):
                if self._settled_twice(name, fact.seq, pos):
                    return
                if isinstance(fact, PromiseCreated):
                    self.promises.add(fact.seq)
                prev = self.open.pop(fact.seq, None)
                need = _OPENED_BY[name]
                if prev is not None and prev[0] not in need:
                    self._bad(f"{name} seq {fact.seq} settles an open {prev[0]}", prev[2], pos)
                elif prev is None and name in _NEEDS_OPEN:
                    self._bad(f"{name} seq {fact.seq} with no open {' or '.join(need)}", pos)
                self.settled[fact.seq] = (name, pos)
            case ChildStarted() | ChildEnded():
                self._child(fact, pos)
            case PromiseCompleted():
                if fact.seq not in self.promises:
                    self._bad(f"PromiseCompleted seq {fact.seq} completes no open promise", pos)
                self.promises.discard(fact.seq)
            case TimerScheduled() | SignalAwaited() | EventAwaited():
                if fact.seq in self.settled or fact.seq in self.open:
                    at = (self.settled.get(fact.seq) or self.open[fact.seq])[-1]
                    self._bad(f"{name} seq {fact.seq} reuses a sequence number", at, pos)
                self.open[fact.seq] = (name, 0, pos)
            case StepHeld():  # its task group is paused: the attempt starts on unpause
                prev = self.open.get(fact.seq)
                if prev is not None and prev[0] not in ("StepFailed", "StepHeld"):
                    self._bad(f"StepHeld seq {fact.seq} while {prev[0]} is open on it", pos)
                self.open[fact.seq] = ("StepHeld", fact.attempt, pos)
            case StepHandedOver():
                prev = self.open.get(fact.seq)
                if prev is None or prev[:2] != ("StepStarted", fact.attempt):
                    self._bad(
                        f"StepHandedOver seq {fact.seq} attempt {fact.attempt} but no such "
                        "attempt is running",
                        pos,
                    )
                self.open[fact.seq] = ("StepHandedOver", fact.attempt, pos)
            case RunRecovered():
                prev = self.open.get(fact.seq)
                if prev is None or prev[0] != "StepStarted":
                    self._bad(
                        f"RunRecovered seq {fact.seq} but no step of that seq is running", pos
                    )
                self.recovering.add(fact.seq)
            case UpdateAccepted(update_id=uid):
                if uid in self.updates:
                    self._bad(f"a second UpdateAccepted of update {uid!r}", pos)
                self.updates[uid] = False
            case UpdateCompleted(update_id=uid):
                if self.updates.get(uid) is not False:
                    how = "completed already" if uid in self.updates else "never accepted"
                    self._bad(f"UpdateCompleted of update {uid!r}, {how}", pos)
                self.updates[uid] = True
            case RunStarted():
                self.starts += 1
                if self.starts > 1:
                    self._bad("a second RunStarted", pos)
            case RunRejected():
                if self.starts:
                    self._bad("RunRejected after the run started", pos)
            case RunParked():
                self.parked = True
            case RunPaused() | RunUnpaused() | CompensationStarted():
                self.paused = isinstance(fact, RunPaused)
            case PermitRequested():
                if fact.seq in self.permits:
                    self._bad(f"a second PermitRequested at seq {fact.seq}", pos)
                self.permits[fact.seq] = pos
            case PermitReceived():
                if self.permits.pop(fact.seq, None) is None:
                    self._bad(f"PermitReceived at seq {fact.seq} with no PermitRequested", pos)
            case _ if type(fact) in END_FACTS:  # an end also ends a pause
                self.status, self.terminal_at, self.paused = END_FACTS[type(fact)], pos, False
                self._close()

    def _step_started(self, fact: StepStarted, pos: int) -> None:
        seq, attempt = fact.seq, fact.attempt
        if seq in self.settled:
            settled_by, at = self.settled[seq]
            self._bad(
                f"StepStarted seq {seq} attempt {attempt} after {settled_by} settled it: "
                "a settled step ran again",
                at,
                pos,
            )
            return
        if seq < 0 and -seq not in self.completed:
            self._bad(f"compensation seq {seq} but step {-seq} never completed", pos)
        prev = self.open.get(seq)
        if prev is None:
            if attempt != 1:
                self._bad(f"StepStarted seq {seq} opens with attempt {attempt}, not 1", pos)
        else:
            kind, prev_attempt, at = prev
            if kind == "StepStarted" and seq not in self.recovering:
                self._bad(
                    f"StepStarted seq {seq} attempt {attempt} while attempt "
                    f"{prev_attempt} runs, with no RunRecovered",
                    at,
                    pos,
                )
            elif kind not in ("StepStarted", "StepFailed", "StepHandedOver", "StepHeld"):
                self._bad(f"StepStarted seq {seq} while {kind} is open on it", at, pos)
            if attempt != prev_attempt + (kind not in ("StepHandedOver", "StepHeld")):
                self._bad(
                    f"StepStarted seq {seq} attempt {attempt} follows attempt {prev_attempt}",
                    at,
                    pos,
                )
        self.recovering.discard(seq)
        self.open[seq] = ("StepStarted", attempt, pos)

    def _step_ended(self, fact: StepCompleted | StepFailed, pos: int) -> None:
        name, seq, attempt = type(fact).__name__, fact.seq, fact.attempt
        if self._settled_twice(name, seq, pos):
            return
        prev = self.open.get(seq)
        if prev is None or prev[0] != "StepStarted" or prev[1] != attempt:
            what = "nothing" if prev is None else f"{prev[0]} attempt {prev[1]}"
            self._bad(
                f"{name} seq {seq} attempt {attempt} answers no StepStarted of that "
                f"attempt (open: {what})",
                *([prev[2]] if prev else []),
                pos,
            )
        if isinstance(fact, StepFailed) and fact.retry_at_ms is not None:
            self.open[seq] = ("StepFailed", attempt, pos)  # a retry is scheduled
        else:
            self.open.pop(seq, None)
            self.settled[seq] = (name, pos)
            if isinstance(fact, StepCompleted):
                self.completed.add(seq)
            else:
                self.failed_attempt[seq] = attempt

    def _retried(self, fact: RunRetried, pos: int) -> None:
        if self.status not in ("failed", "dead") or self.after_end:
            self._bad(f"RunRetried of a run that is {self.status or 'not finished'}", pos)
            return
        self.status, self.terminal_at = None, -1
        for seq in fact.seqs:
            if self.settled.get(seq, ("",))[0] != "StepFailed" or seq in self.completed:
                self._bad(f"RunRetried reopens seq {seq}, which did not fail for good", pos)
                continue
            del self.settled[seq]
            self.open[seq] = ("StepFailed", self.failed_attempt[seq], pos)

    def _child(self, fact: ChildStarted | ChildEnded, pos: int) -> None:
        """An awaited child is open until its ChildEnded; a fire-and-forget one, and a
        child that could not start (ChildEnded ``rejected``), settle their seq at once."""
        name, seq = type(fact).__name__, fact.seq
        if self._settled_twice(name, seq, pos):
            return
        prev = self.open.get(seq)
        if isinstance(fact, ChildStarted):
            if prev is not None:
                self._bad(f"ChildStarted seq {seq} reuses a sequence number", prev[2], pos)
            if fact.awaited:
                self.open[seq] = (name, 0, pos)
                return
        elif prev is None and fact.status != "rejected":
            self._bad(f"ChildEnded seq {seq} with no open ChildStarted", pos)
        elif prev is not None and prev[0] != "ChildStarted":
            self._bad(f"ChildEnded seq {seq} settles an open {prev[0]}", prev[2], pos)
        self.open.pop(seq, None)
        self.settled[seq] = (name, pos)

    def _settled_twice(self, name: str, seq: int, pos: int) -> bool:
        earlier = self.settled.get(seq)
        if earlier is None:
            return False
        self._bad(
            f"{name} seq {seq} settles it a second time (first: {earlier[0]})", earlier[1], pos
        )
        return True

    def _limit(self, fact: Fact, pos: int) -> None:
        """The permits of a limit entity (`engine.rules`: acquire, release)."""
        match fact:
            case LimitSet(concurrency=concurrency):
                self.limit = concurrency
            case PermitGranted(holder=holder, seq=seq):
                if (holder, seq) in self.held:
                    self._bad(f"permit of {holder!r} seq {seq} granted twice", pos)
                self.held.add((holder, seq))
                if self.limit is not None and len(self.held) > self.limit:
                    self._bad(
                        f"{len(self.held)} permits held, over its concurrency {self.limit}", pos
                    )
            case PermitReleased(holder=holder, seq=seq):
                self.held.discard((holder, seq))  # or a waiting request withdrawn

    def _close(self) -> None:
        """Check the sequence numbers, then drop what only an open run needs."""
        used = [s for s in self.seqs if 0 < s < UPDATE_SEQ_BASE]  # handlers' seqs: their own
        if used and max(used) != len(used):  # 1..k with no gap, each seq counted once
            missing = sorted(set(range(1, max(used) + 1)) - set(used))[:5]
            self._bad(f"sequence numbers skip {missing} (highest used: {max(used)})")
        if 0 in self.seqs:
            self._bad("sequence number 0 is used")
        if self.status is not None:  # a finished run keeps only what spots a duplicate
            self.open.clear()
            self.recovering.clear()
            self.permits.clear()  # its end withdrew its requests (a retry asks again)
            if self.status not in ("failed", "dead"):  # those may be retried
                self.promises.clear()
                self.seqs.clear()
                self.completed.clear()
                self.failed_attempt.clear()

    def waiting_for(self) -> str | None:
        """Why an unfinished run may wait (None: it waits for nothing, it is stuck)."""
        if self.parked:
            return "parked"
        if self.paused:  # an operator holds it still
            return "paused"
        if self.starts == 0 and self.first == "RunRejected":
            return "rejected"
        kinds = {_WAITS[kind] for kind, _, _ in self.open.values()}
        if self.permits:
            kinds.add(_PERMIT_WAIT)
        if self.promises:
            kinds.add(_PROMISE_WAIT)
        return next((w for w in _WAIT_ORDER if w in kinds), None)

    def finish(self, expect_finished: bool = False) -> str:
        """The end-of-journal checks; returns the run's status for the report:
        its terminal status, ``suspended: <why>``, ``rejected`` or ``stuck``."""
        if self.first is None:
            return "empty"
        if self.entity:
            return "entity"
        if self.after_end:
            shown = ", ".join(f"{n}@{p}" for n, p in self.after_end[:5])
            more = f" and {len(self.after_end) - 5} more" if len(self.after_end) > 5 else ""
            self._bad(
                f"{len(self.after_end)} facts after the terminal one: {shown}{more}",
                self.terminal_at,
                *(p for _, p in self.after_end[:5]),
            )
        if self.status is None:
            self._close()
        if self.status == "dead" and not self.dead_lettered:
            self._bad("the run is dead but the dlq has no run-dead record of it", self.terminal_at)
        if self.status is not None:
            return self.status
        why = self.waiting_for()
        if why == "rejected":
            return why
        if why is None:
            self._bad("the run has not finished and waits for nothing (stuck)")
            return "stuck"
        if expect_finished:
            self._bad(f"the run has not finished ({why})")
        return f"suspended: {why}"


def check_run(
    facts: Iterable[Fact], *, expect_finished: bool = False, dead_lettered: bool = False
) -> list[str]:
    """The rule violations of one run's facts, in journal order (no broker needed).

    Positions in the messages are indexes into ``facts``.
    """
    check: RunCheck | None = None
    for i, fact in enumerate(facts):
        if check is None:
            check = RunCheck(fact.run_id)
        check.add(fact, i)
    if check is None:
        return []
    check.dead_lettered = dead_lettered
    check.finish(expect_finished)
    return [f"{msg} @{','.join(map(str, at))}" if at else msg for msg, at in check.problems]
