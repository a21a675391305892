"""`runstream runs event|query`: read what a run publishes (`Client.get_event`, from the
runs read model: no engine needed) and ask its live query handlers (`Client.query`, of
the run's owner)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from runstream.cli import options
from runstream.cli.options import namespace
from runstream.cli.runs_cmd import as_json, cache
from runstream.client import Client
from runstream.engine.workflow import seconds


@click.command("event")
@click.argument("run_id")
@click.argument("key")
@namespace
@options.bootstrap
@click.option(
    "--wait",
    default=None,
    help="Wait up to this long (seconds or 5m) for the run to set KEY.",
)
@cache
@as_json
def event(
    run_id: str,
    key: str,
    namespace: str,
    bootstrap: str | None,
    wait: str | None,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """The newest value RUN_ID set for KEY (ctx.set_event), as JSON, following the runs
    that carry it on; with --json, where the answer stands on the lifecycle topic too.
    Exits 1 if the run has not set KEY (with --wait: if it ended first, or time ran out)."""
    if wait is not None:
        try:
            seconds(wait)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--wait") from None
    with Client(namespace, bootstrap) as client:
        found = client.get_event(run_id, key, wait=wait, cache_dir=cache_dir)
    if found is None:
        click.echo(f"run {run_id!r} has not set {key!r}", err=True)
        sys.exit(1)
    if as_json:
        doc = {
            "run_id": found.run_id,
            "key": found.key,
            "value": found.value,
            "seq": found.seq,
            "set_at": found.set_at.isoformat() if found.set_at else None,
            "partition": found.partition,
            "offset": found.offset,
            "as_of": found.as_of,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(json.dumps(found.value))


@click.command("query")
@click.argument("run_id")
@click.argument("name")
@click.argument("arg", required=False)
@namespace
@options.bootstrap
@click.option(
    "--timeout",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds to wait for the run's owner to answer.",
)
def query(
    run_id: str, name: str, arg: str | None, namespace: str, bootstrap: str | None, timeout: float
) -> None:
    """Ask RUN_ID's live query handler NAME (@ctx.query_handler) with ARG (JSON; null if
    left out) and print its answer as JSON. The run's owner answers; the run's history
    does not change. Exits 1 if no engine answers within --timeout."""
    try:
        value = None if arg is None else json.loads(arg)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="ARG") from None
    with Client(namespace, bootstrap) as client:
        answer = client.query(run_id, name, value, timeout=timeout)
    click.echo(json.dumps(answer))
