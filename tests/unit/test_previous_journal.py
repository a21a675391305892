"""Journals written by the previous release restore and finish (issue 19: the core was split
by record family with no change on disk).

`tests/histories/previous_release.jsonl` was recorded by the core of commit 2ab05eb with
`tests/histories/record_previous.py`: runs left sleeping, waiting for a signal, for an event,
for a child, for a permit, mid-step, on a remote attempt, and in a continue-as-new chain,
beside the entities of events and limits. Today's core folds it, recovers each run as a new
owner would, and takes every run to its end.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from pathlib import Path

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.work import Recover
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    ENTITY_PREFIX,
    PublishEvent,
    StepResult,
    StepStarted,
    correlation_id,
)

from ..histories.previous_app import app
from .corehelp import Core

JOURNAL = Path(__file__).parents[1] / "histories" / "previous_release.jsonl"


def recorded() -> list:
    codec = Codec.default()
    lines = JOURNAL.read_text().splitlines()
    return [codec.decode(base64.b64decode(json.loads(line)["value"])) for line in lines]


def deliver(core: Core) -> None:
    """Route the commands the core sent to other entities, as their partitions would."""
    while core.commands:
        core.command(core.commands.pop(0))


def test_a_journal_of_the_previous_release_restores_and_every_run_finishes():
    facts = recorded()
    by_run: dict[str, list] = defaultdict(list)
    for fact in facts:
        by_run[fact.run_id].append(fact)
    core = Core(app.registry)
    core.now = max(f.at_ms for f in facts) + 1_000
    core.journal = list(facts)
    core.since = core.now  # this instance took the partition over just now
    for run_id, history in by_run.items():
        core.states[run_id] = fold(run_id, history)
    for run_id in by_run:
        if not run_id.startswith(ENTITY_PREFIX):
            core.handle(Recover(0, run_id))  # a step in flight in the old process runs again
    deliver(core)

    core.signal("saga-1", "go", "ok")  # sent before saga-1 waits: buffered
    core.signal("saga-2", "go", "ok")
    corr = correlation_id("paid", "o-1")
    core.command(
        PublishEvent(corr, "paid", event_id="e-1", payload=payload.dumps({"by": "cash"}), key="o-1")
    )
    [open_attempt] = [f for f in by_run["remote-1"] if isinstance(f, StepStarted)]
    core.command(  # the task worker answers the task the previous release sent
        StepResult(
            "remote-1",
            1,
            attempt=1,
            ok=True,
            output=payload.dumps(8),
            attempt_id=open_attempt.attempt_id,
        )
    )
    for _ in range(10):
        deliver(core)
        core.advance(60)

    outputs = {
        run_id: payload.loads(st.output) if st.output is not None else st.status
        for run_id, st in core.states.items()
        if not run_id.startswith(ENTITY_PREFIX) and not st.continued_as
    }
    assert outputs == {
        "saga-1": {"a": 2, "b": 3, "go": "ok"},
        "saga-2": {"a": 11, "b": 12, "go": "ok"},
        "wait-1": {"by": "cash"},
        "parent-1": 106,
        "parent-1/1": 6,
        "limited-1": 2,
        "limited-2": 3,
        "remote-1": 8,
        "counter-1~2": 2,
    }
    for run_id in outputs:
        assert check_run(core.facts(run_id), expect_finished=True) == [], run_id
