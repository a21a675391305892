"""`Settled`: what an earlier activation of a run's code saw settle, which decides
``is_replaying`` for the interceptors (`Context.is_replaying`). The rules compute it per
decision (`rules.context.settled`); a replay of a whole history uses `ALL_SETTLED`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Settled:
    """What an earlier activation of the run's code saw settle, so what is a replay to
    the interceptors (``is_replaying``): the workflow's operations below seq ``below``,
    and the update handlers' operations in ``handlers`` (seqs of their own). Where the
    code and a handler start, what counts is whether an earlier activation began them,
    settled anything or not: ``began`` (the run's code recorded an operation) and
    ``accepted`` (the updates whose handlers were running)."""

    below: int
    handlers: frozenset[int] = frozenset()
    everything: bool = False
    began: bool = False
    accepted: frozenset[str] = frozenset()


#: For a replay that re-runs a history (compensations, a relaunch, a query): all of it.
ALL_SETTLED = Settled(1 << 62, everything=True, began=True)
