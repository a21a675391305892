"""`runstream promise resolve|reject`: complete a run's durable promise (`Client.resolve`,
`Client.reject`). Fire and forget, as `signal`: a completion the engine refuses goes to
``<ns>.dlq`` with the reason (`runstream dlq list`)."""

from __future__ import annotations

import json

import click

from runstream.cli import options
from runstream.client import Client
from runstream.schemas.records import promise_of


@click.group()
def promise() -> None:
    """Complete durable promises (ctx.promise()) by their id."""


@promise.command()
@click.argument("promise_id")
@click.argument("value", required=False)
@options.namespace
@options.bootstrap
@options.json_output
def resolve(
    promise_id: str, value: str | None, namespace: str, bootstrap: str | None, as_json: bool
) -> None:
    """Resolve PROMISE_ID with VALUE (JSON; null if left out)."""
    _check(promise_id)
    try:
        data = None if value is None else json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="VALUE") from None
    with Client(namespace, bootstrap) as client:
        client.resolve(promise_id, data)
    options.emit(as_json, {"promise_id": promise_id, "resolved": data})


@promise.command()
@click.argument("promise_id")
@click.argument("message")
@options.namespace
@options.bootstrap
@options.json_output
def reject(
    promise_id: str, message: str, namespace: str, bootstrap: str | None, as_json: bool
) -> None:
    """Reject PROMISE_ID with MESSAGE: the workflow's await raises PromiseRejected."""
    _check(promise_id)
    with Client(namespace, bootstrap) as client:
        client.reject(promise_id, message)
    options.emit(as_json, {"promise_id": promise_id, "rejected": message})


def _check(promise_id: str) -> None:
    if promise_of(promise_id) is None:
        why = f"{promise_id!r} is not a promise id (<run_id>/promise/<seq>)"
        raise click.BadParameter(why, param_hint="PROMISE_ID")
