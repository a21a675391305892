"""`runstream runs update RUN NAME [ARG]`: send a validated update and print its result
(`Client.update`); a rejected or failed update exits 1 with its code and message, a
--wait that runs out exits 7 (`cli.exits`)."""

from __future__ import annotations

import json

import click

from runstream.cli import options
from runstream.client import Client


@click.command("update")
@click.argument("run_id")
@click.argument("name")
@click.argument("arg", required=False)
@click.option("--id", "update_id", default=None, help="The update's id: a resend counts once.")
@click.option(
    "--wait-for",
    type=click.Choice(["admitted", "accepted", "completed"]),
    default="completed",
    show_default=True,
    help="Return once the update is on the log, accepted by its validator, or completed.",
)
@options.wait_option(30.0, "the update to reach --wait-for")
@options.namespace
@options.bootstrap
@options.json_output
def update(
    run_id: str,
    name: str,
    arg: str | None,
    update_id: str | None,
    wait_for: str,
    wait: float,
    namespace: str,
    bootstrap: str | None,
    as_json: bool,
) -> None:
    """Send update NAME with ARG (JSON; null if left out) to RUN_ID; print its result as
    JSON (with --wait-for completed), else the update's id and stage."""
    try:
        value = None if arg is None else json.loads(arg)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="ARG") from None
    with Client(namespace, bootstrap) as client:
        handle = client.start_update(
            run_id, name, value, update_id=update_id, wait_for=wait_for, timeout=wait
        )
        doc = {"run_id": run_id, "update_id": handle.update_id, "stage": handle.stage}
        if wait_for == "completed":
            output = handle.result(wait)
            options.emit(
                as_json, {**doc, "stage": "completed", "result": output}, json.dumps(output)
            )
        else:
            options.emit(as_json, doc, f"{handle.update_id} {handle.stage}")
