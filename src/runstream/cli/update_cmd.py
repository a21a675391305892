"""`runstream runs update RUN NAME [ARG]`: send a validated update and print its result
(`Client.update`); a rejected or failed update exits 1 with its code and message."""

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
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait.")
@options.namespace
@options.bootstrap
def update(
    run_id: str,
    name: str,
    arg: str | None,
    update_id: str | None,
    wait_for: str,
    timeout: float,
    namespace: str,
    bootstrap: str | None,
) -> None:
    """Send update NAME with ARG (JSON; null if left out) to RUN_ID; print its result as
    JSON (with --wait-for completed), else the update's id and stage."""
    try:
        value = None if arg is None else json.loads(arg)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="ARG") from None
    with Client(namespace, bootstrap) as client:
        handle = client.start_update(
            run_id, name, value, update_id=update_id, wait_for=wait_for, timeout=timeout
        )
        if wait_for == "completed":
            click.echo(json.dumps(handle.result(timeout)))
        else:
            click.echo(f"{handle.update_id} {handle.stage}")
