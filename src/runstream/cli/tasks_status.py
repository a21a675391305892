"""`runstream tasks status`: the health of a namespace's task groups, per group.

Two sources, each the truth for its half:

- Kafka's view of the task topic ``<ns>.tasks.<group>`` and of the task workers'
  consumer group of the same name (`topics.groups`): the live workers (the group's
  members), the lag and the oldest task not done yet;
- the journal ``<ns>.journal``, read from its start: the remote attempts the engine
  dispatched and has not settled (in flight), and the attempts it failed as timed out.

The journal and not the runs read model: the read model folds ``<ns>.lifecycle``, whose
events name no task group and expire after a week, while an attempt may stay in flight
for longer; the journal holds every attempt with its group, kept forever, and the
engine decides from exactly these facts. The price is one pass over the journal per
call (a journal-fed cached model, like the runs one, is the way on if that grows slow).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from runstream.cli import exits, options
from runstream.engine.workflow import seconds
from runstream.errors import STEP_TIMED_OUT, DecodeError
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    GroupPaused,
    GroupUnpaused,
    Record,
    RunCancelled,
    RunCompleted,
    RunDead,
    RunFailed,
    SeqFact,
    StepFailed,
    StepHeld,
    StepStarted,
    task_group_of,
)
from runstream.settings import Settings
from runstream.topics.admin import client_config
from runstream.topics.groups import GroupStatus, group_status, topics_with_prefix
from runstream.topics.spec import Topics


class TaskGroupNotFound(exits.NotFound):
    """``--group`` names no task topic of the namespace."""


@dataclass
class RemoteAttempts:
    """What the journal tells about one task group's attempts, and its pause."""

    in_flight: int = 0
    timeouts: int = 0  # since the window's start
    latest_timeout: StepFailed | None = None
    held: int = 0  # steps due while the group is paused (StepHeld), not sent
    paused: list[GroupPaused] = field(default_factory=list)  # one per partition paused


def remote_attempts(facts: Iterable[Record], since_ms: int) -> dict[str, RemoteAttempts]:
    """Task group -> its attempts, from a journal's facts in order.

    An attempt is open from its remote ``StepStarted`` until the next fact at its run
    and seq (its outcome, a handover, a new attempt) or the run's end, as the engine's
    reducer keeps ``pending``. Timeouts are ``StepFailed`` facts from ``since_ms`` on
    whose error says the engine timed the attempt out. A group is paused on each partition
    whose ``GroupPaused`` no ``GroupUnpaused`` followed; a step is held from its
    ``StepHeld`` until the next fact at its seq or the run's end.
    """
    open_: dict[str, dict[int, StepStarted]] = {}  # run -> seq -> its open remote attempt
    held: dict[str, dict[int, str]] = {}  # run -> seq -> the group holding it
    pauses: dict[str, GroupPaused] = {}  # by the group's entity id (one per partition)
    out: dict[str, RemoteAttempts] = {}
    for fact in facts:
        if isinstance(fact, GroupPaused):
            pauses[fact.run_id] = fact
        elif isinstance(fact, GroupUnpaused):
            pauses.pop(fact.run_id, None)
        elif isinstance(fact, StepStarted) and fact.group is not None:
            held.get(fact.run_id, {}).pop(fact.seq, None)
            open_.setdefault(fact.run_id, {})[fact.seq] = fact
        elif isinstance(fact, RunCompleted | RunFailed | RunCancelled | RunDead):
            open_.pop(fact.run_id, None)
            held.pop(fact.run_id, None)
        elif isinstance(fact, SeqFact):
            held.get(fact.run_id, {}).pop(fact.seq, None)
            if isinstance(fact, StepHeld):
                held.setdefault(fact.run_id, {})[fact.seq] = fact.group
            started = open_.get(fact.run_id, {}).pop(fact.seq, None)
            if (
                started is not None
                and started.group is not None
                and isinstance(fact, StepFailed)
                and fact.error.startswith(STEP_TIMED_OUT)
                and fact.at_ms >= since_ms
            ):
                group = out.setdefault(started.group, RemoteAttempts())
                group.timeouts += 1
                if group.latest_timeout is None or fact.at_ms >= group.latest_timeout.at_ms:
                    group.latest_timeout = fact
    for attempts in open_.values():
        for started in attempts.values():
            assert started.group is not None
            out.setdefault(started.group, RemoteAttempts()).in_flight += 1
    for seqs in held.values():
        for name in seqs.values():
            out.setdefault(name, RemoteAttempts()).held += 1
    for ent, paused in pauses.items():
        out.setdefault(task_group_of(ent), RemoteAttempts()).paused.append(paused)
    return out


@click.command("status")
@options.namespace
@options.bootstrap
@click.option("--group", default=None, help="Only this task group (default: every one).")
@click.option(
    "--since",
    default="15m",
    show_default=True,
    help="Count the timeouts of this last while (30s, 15m, 2h, 1d).",
)
@options.json_output
def status(
    namespace: str, bootstrap: str | None, group: str | None, since: str, as_json: bool
) -> None:
    """Per task group of NAMESPACE: live workers, lag, oldest waiting task, attempts in
    flight and recent timeouts."""
    try:
        window_ms = int(seconds(since) * 1000)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    settings = Settings().with_bootstrap(bootstrap)
    config = client_config(settings.bootstrap(), settings.kafka)
    topics = Topics(namespace)
    prefix, timeout = topics.tasks_prefix, settings.connect_timeout
    groups = [t[len(prefix) :] for t in topics_with_prefix(config, prefix, timeout)]
    if group is not None:
        if group not in groups:
            known = ", ".join(groups) or "none"
            raise TaskGroupNotFound(
                f"no task group {group!r} in namespace {namespace!r}: {prefix}{group} "
                f"does not exist at {settings.bootstrap()} (task groups there: {known})"
            )
        groups = [group]
    if not groups:
        if as_json:
            click.echo("[]")
        else:
            click.echo(
                f"no task groups in namespace {namespace!r} at {settings.bootstrap()}: no "
                f"{prefix}* topic (an engine creates one per task group its App declares)"
            )
        return
    kafka = [group_status(config, topics.tasks(g), topics.tasks(g), timeout) for g in groups]
    now_ms = int(time.time() * 1000)
    journal = remote_attempts(_facts(settings, topics.journal), now_ms - window_ms)
    rows = [
        _row(g, k, journal.get(g, RemoteAttempts()), now_ms, window_ms)
        for g, k in zip(groups, kafka, strict=True)
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _print(rows, since)


def _facts(settings: Settings, topic: str) -> Iterator[Record]:
    """Every fact of the journal that this version can read, in partition order."""
    codec = Codec.default()
    for batch in options.read_topic(settings, topic, None):
        for rec in batch:
            try:
                yield codec.decode(rec.value)
            except DecodeError:  # not ours to judge here; the engine dead-letters them
                continue


def _row(
    group: str, k: GroupStatus, attempts: RemoteAttempts, now_ms: int, window_ms: int
) -> dict[str, Any]:
    """One group as JSON data (these keys are the --json contract)."""
    oldest = k.oldest_at_ms
    latest = attempts.latest_timeout
    return {
        "group": group,
        "topic": k.topic,
        "consumer_group": k.group_id,
        "state": k.state,
        "workers": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "instance_id": m.instance_id,
                "partitions": m.partitions,
            }
            for m in k.members
        ],
        "lag": k.lag,
        "oldest_waiting": None
        if oldest is None
        else {"at_ms": oldest, "age_ms": max(0, now_ms - oldest)},
        "partitions": [
            {"partition": p.partition, "committed": p.committed, "end": p.end, "lag": p.lag}
            for p in k.partitions
        ],
        "in_flight": attempts.in_flight,
        "paused": _paused(attempts.paused),
        "held": attempts.held,
        "timeouts": {
            "window_ms": window_ms,
            "count": attempts.timeouts,
            "latest": None
            if latest is None
            else {
                "run_id": latest.run_id,
                "seq": latest.seq,
                "step": latest.name,
                "attempt": latest.attempt,
                "at_ms": latest.at_ms,
                "age_ms": max(0, now_ms - latest.at_ms),
                "error": latest.error,
            },
        },
    }


def _paused(pauses: list[GroupPaused]) -> dict[str, Any] | None:
    """The group's pause (None: not paused): on how many partitions, and the latest's
    who, why and when (a pause is sent to every partition at once)."""
    if not pauses:
        return None
    last = max(pauses, key=lambda p: p.at_ms)
    return {"partitions": len(pauses), "reason": last.reason, "by": last.by, "at_ms": last.at_ms}


def _print(rows: list[dict[str, Any]], since: str) -> None:
    """A table of the groups, and one of their workers."""
    table = Table(
        "group", "workers", "state", "lag", "oldest waiting", "in flight", f"timeouts {since}",
        "paused",
    )  # fmt: skip
    for r in rows:
        oldest, timeouts = r["oldest_waiting"], r["timeouts"]
        latest = timeouts["latest"]
        table.add_row(
            r["group"],
            str(len(r["workers"])),
            "none" if r["state"] == "dead" else r["state"],  # Kafka's word for no group
            str(r["lag"]),
            "" if oldest is None else age(oldest["age_ms"]),
            str(r["in_flight"]),
            str(timeouts["count"])
            + (
                ""
                if latest is None
                else f" (last: {latest['run_id']} {latest['step']}#{latest['seq']}, "
                f"{age(latest['age_ms'])} ago)"
            ),
            "" if (p := r["paused"]) is None
            else f"yes, {r['held']} held (by {p['by']}: {p['reason']})",
        )  # fmt: skip
    console = Console()
    console.print(table)
    workers = Table("group", "worker", "host", "partitions", "member id", title="workers")
    for r in rows:
        for w in r["workers"]:
            name = w["client_id"] + (f" ({w['instance_id']})" if w["instance_id"] else "")
            workers.add_row(r["group"], name, w["host"], str(w["partitions"]), w["member_id"])
    if workers.row_count:
        console.print(workers)


def age(ms: int) -> str:
    """A duration as ``45s``, ``3m12s``, ``2h05m`` or ``3d04h``."""
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
