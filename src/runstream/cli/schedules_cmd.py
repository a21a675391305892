"""`runstream schedules ...`: set, list, pause, resume and delete schedules.

A schedule is an entity keyed ``~schedule/<name>`` whose facts are in ``<ns>.journal``;
``list`` folds them from the topic (it does not ask the engine).
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from runstream.cli import options
from runstream.client import Client
from runstream.engine.reducer import apply
from runstream.engine.state import ScheduleState
from runstream.errors import DecodeError
from runstream.schemas.codec import Codec
from runstream.schemas.records import FACTS, ScheduleFired, schedule_id
from runstream.settings import Settings
from runstream.topics.spec import Topics

_PREFIX = schedule_id("").encode()


@click.group()
def schedules() -> None:
    """Schedules: start a workflow at the fire times of a cron expression."""


@schedules.command("set")
@click.argument("name")
@click.argument("workflow")
@click.argument("input", required=False)
@click.option("--cron", required=True, help='A cron expression, e.g. "0 3 * * *".')
@click.option("--tz", default="UTC", show_default=True, help="The IANA time zone it is read in.")
@options.namespace
@options.bootstrap
@options.json_output
def set_schedule(
    name: str, workflow: str, input: str | None, cron: str, tz: str, namespace: str,
    bootstrap: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Create or replace schedule NAME: start WORKFLOW with INPUT (JSON) at each fire."""
    try:
        value = None if input is None else json.loads(input)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="INPUT") from None
    with Client(namespace, bootstrap) as client:
        client.schedule(name, workflow, value, cron=cron, tz=tz)
    doc = {"schedule": name, "workflow": workflow, "cron": cron, "tz": tz}
    options.emit(as_json, doc, f"schedule {name!r} set")


def _op(verb: str) -> click.Command:
    @click.command(verb)
    @click.argument("name")
    @options.namespace
    @options.bootstrap
    @options.json_output
    def op(name: str, namespace: str, bootstrap: str | None, as_json: bool) -> None:
        with Client(namespace, bootstrap) as client:
            getattr(client, f"{verb}_schedule")(name)
        options.emit(as_json, {"schedule": name, "sent": verb}, f"schedule {name!r}: {verb} sent")

    op.help = f"{verb.capitalize()} schedule NAME."
    return op


for _verb in ("pause", "resume", "delete"):
    schedules.add_command(_op(_verb))


@schedules.command("list")
@options.namespace
@options.bootstrap
@options.json_output
def list_schedules(namespace: str, bootstrap: str | None, as_json: bool) -> None:
    """The schedules of NAMESPACE, from its journal."""
    settings, codec = Settings().with_bootstrap(bootstrap), Codec.default()
    states: dict[str, ScheduleState] = {}
    last: dict[str, str] = {}
    for batch in options.read_topic(settings, Topics(namespace).journal, None):
        for rec in batch:
            if not (rec.key or b"").startswith(_PREFIX):
                continue
            try:
                fact = codec.decode(rec.value)
            except DecodeError:
                continue
            if isinstance(fact, FACTS):
                state = states.setdefault(fact.run_id, ScheduleState(fact.run_id))  # type: ignore[attr-defined]
                apply(state, fact)  # type: ignore[arg-type]
                if isinstance(fact, ScheduleFired):
                    last[fact.run_id] = fact.run
    rows = [
        {
            "name": s.schedule.name,
            "workflow": s.schedule.workflow,
            "cron": s.schedule.cron,
            "tz": s.schedule.tz,
            "status": "paused" if s.paused else "active",
            "next_fire": options.iso(s.next_fire_ms),
            "last_run": last.get(s.run_id),
        }
        for s in sorted(states.values(), key=lambda s: s.run_id)
        if s.schedule is not None
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("schedule", "workflow", "cron", "tz", "status", "next fire", "last run")
    for r in rows:
        table.add_row(*(str(r[k] or "-") for k in r))
    Console().print(table)
