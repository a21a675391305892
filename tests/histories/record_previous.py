"""Records `previous_release.jsonl` with the core of this checkout (run once, by hand:
``PYTHONPATH=.:src python -m tests.histories.record_previous``). Every run is left
open somewhere: a sleep, a signal wait, an event wait, a child, a permit, a remote attempt,
a continue-as-new chain. Each line: {"value"}, a fact's Avro bytes in
base64, as the journal holds them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from runstream.engine import payload
from runstream.schemas.records import PublishEvent, correlation_id
from tests.histories.previous_app import app
from tests.unit.corehelp import Core

OUT = Path(__file__).with_name("previous_release.jsonl")


def deliver(core: Core) -> None:
    """Route the commands the core sent to other entities, as their partitions would."""
    while core.commands:
        cmd = core.commands.pop(0)
        core.command(cmd)


def main() -> None:
    core = Core(app.registry)
    core.now = 1_700_000_000_000
    core.start("saga-2", "saga", 10)
    core.advance(11)  # saga-2 waits for its signal
    core.start("saga-1", "saga", 1)  # sleeping
    core.start("wait-1", "waiter", "o-1")  # an event wait, subscribed at its entity
    core.start("parent-1", "parent", 5)  # its child sleeps
    core.start("limited-1", "limited", 1)
    core.start("limited-2", "limited", 2)  # queued behind limited-1's permit
    core.auto_run_steps = False
    deliver(core)
    core.queued.clear()  # limited-1's step was running when the engine went away
    core.start("remote-1", "remote", 7)  # its task is out, nobody answered yet
    core.auto_run_steps = True
    core.start("counter-1", "counter", 0)
    core.advance(1.5)
    deliver(core)
    # An event for another key waits within its ttl at its entity.
    corr = correlation_id("paid", "o-2")
    core.command(
        PublishEvent(
            corr,
            "paid",
            event_id="e-2",
            payload=payload.dumps({"by": "card"}),
            key="o-2",
            ttl_ms=3_600_000,
        )
    )
    deliver(core)
    lines = [
        json.dumps({"value": base64.b64encode(core.codec.encode(f)).decode()}) for f in core.journal
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} facts written to {OUT}")


if __name__ == "__main__":
    main()
