"""What every rule is parameterised by (`Rules`), and how a rule refuses (`Rejected`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

from runstream.engine.limits import Limits
from runstream.engine.replay import Replayer
from runstream.engine.settled import Settled
from runstream.engine.state import RunState
from runstream.engine.work import Batch
from runstream.engine.workflow import Registry
from runstream.schemas.records import UPDATE_SEQ_BASE, Reason

Activation = Callable[[str], AbstractContextManager[None]]


class Rejected(Exception):
    """A command the engine refuses: it goes to the dead-letter topic with ``code``.
    Its decision's effects are undone, unless ``keep``: what the command did before the
    refusal stands (an update-with-start's start, when its update is refused)."""

    def __init__(self, code: Reason, reason: str, *, keep: bool = False) -> None:
        super().__init__(reason)
        self.code, self.reason, self.keep = code, reason, keep


class Rules:
    """What the rules are parameterised by: the workflows one App registered, and the
    engine's settings. Every handler takes it first; it holds no run's state."""

    def __init__(
        self,
        registry: Registry,
        limits: Limits,
        journal_topic: str,
        max_recovery_attempts: int = 3,
        activation: Activation | None = None,
        partitions: int = 1,
    ) -> None:
        self.registry = registry
        self.replayer = Replayer(registry, limits=limits)
        self.journal_topic = journal_topic  # where a dead run's dead letter points
        self.limits = limits
        self.max_recovery_attempts = max_recovery_attempts
        self.partitions = partitions  # the journal's: where each task group's pause is kept
        # Brackets each run of workflow code (the shell gives it a time budget).
        self.activation: Activation = activation or (lambda _run: contextlib.nullcontext())


def settled(b: Batch, st: RunState) -> Settled:
    """What an earlier activation of the run's code saw settle (`Settled`): what was
    settled before this batch and still is (a retry reopens failed steps), and not while
    the run was paused (its code sees that first now). "Before this batch" is before the
    batch dropped the run's coroutine, if it did (`Working.seen`): what the batch's
    earlier activations ran is a replay too."""
    w = b.runs.get(st.run_id)
    before = st if w is None else w.seen or w.before
    if not isinstance(before, RunState):
        return Settled(0)
    # An operation recorded (open or settled) means its code ran before this batch.
    began = before.top_seq is not None or bool(before.pending) or bool(before.handler_seqs)
    accepted = frozenset(before.updates)
    if before.settled_paused or before.retries != st.retries:
        # Rare (after a pause, or a retry in this batch that reopened failed steps): walk.
        seen = [s for s in before.resolved if s in st.resolved and s not in before.settled_paused]
        return Settled(
            max((s for s in seen if s < UPDATE_SEQ_BASE), default=0),
            frozenset(s for s in seen if s >= UPDATE_SEQ_BASE),
            began=began,
            accepted=accepted,
        )
    # Else all of before's settled seqs still are: what the reducer keeps, without a walk of
    # the history on every decision (quadratic in a long run's length, W9).
    top = before.top_seq
    handlers = frozenset(before.handler_seqs)
    return Settled(0 if top is None else top, handlers, began=began, accepted=accepted)
