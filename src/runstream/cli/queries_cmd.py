"""`runstream runs event|query`: read what a run publishes (`Client.get_event`, from the
runs read model: no engine needed) and ask its live query handlers (`Client.query`, of
the run's owner)."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import click

from runstream.cli import exits, options
from runstream.cli.options import DURATION, namespace
from runstream.cli.runs_cmd import as_json, cache
from runstream.client import Client


@click.command("event")
@click.argument("run_id")
@click.argument("key")
@namespace
@options.bootstrap
@click.option(
    "--wait",
    type=DURATION,
    default=None,
    help="Wait up to this long (seconds, or 30s, 5m) for the run to set KEY.",
)
@cache
@as_json
def event(
    run_id: str,
    key: str,
    namespace: str,
    bootstrap: str | None,
    wait: float | None,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """The newest value RUN_ID set for KEY (ctx.set_event), as JSON, following the runs
    that carry it on; with --json, where the answer stands on the lifecycle topic too.
    Exits 1 if the run has not set KEY (with --wait: if it ended first, or time ran out)."""
    with Client(namespace, bootstrap) as client:
        found = client.get_event(run_id, key, wait=wait, cache_dir=cache_dir)
    if found is None:
        click.echo(f"run {run_id!r} has not set {key!r}", err=True)
        sys.exit(exits.NO)
    if as_json:
        doc = {
            "run_id": found.run_id,
            "key": found.key,
            "value": found.value,
            "seq": found.seq,
            "set_at": _iso(found.set_at),
            "partition": found.partition,
            "offset": found.offset,
            "as_of": found.as_of,
        }
        options.emit(True, doc)
        return
    click.echo(json.dumps(found.value))


def _iso(when: datetime | None) -> str | None:
    return None if when is None else options.iso(int(when.timestamp() * 1000), precise=True)


@click.command("query")
@click.argument("run_id")
@click.argument("name")
@click.argument("arg", required=False)
@namespace
@options.bootstrap
@options.wait_option(5.0, "the run's owner to answer")
@as_json
def query(
    run_id: str,
    name: str,
    arg: str | None,
    namespace: str,
    bootstrap: str | None,
    wait: float,
    as_json: bool,
) -> None:
    """Ask RUN_ID's live query handler NAME (@ctx.query_handler) with ARG (JSON; null if
    left out) and print its answer as JSON. The run's owner answers; the run's history
    does not change. Exits 7 if no engine answers within --wait."""
    try:
        value = None if arg is None else json.loads(arg)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="ARG") from None
    with Client(namespace, bootstrap) as client:
        answer = client.query(run_id, name, value, timeout=wait)
    options.emit(as_json, {"run_id": run_id, "query": name, "answer": answer}, json.dumps(answer))
