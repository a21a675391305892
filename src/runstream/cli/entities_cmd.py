"""`runstream entities show|call|read`: a durable entity's key (`App.entity`,
`Client.entity`): what it holds, an exclusive call, a shared read. The key's owner (a
running engine) answers `show` and `read`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from runstream.cli import options
from runstream.cli.options import emit, json_output, namespace, wait_option
from runstream.client import Client

F = TypeVar("F", bound=Callable[..., Any])

_wait = wait_option(5.0, "the key's owner to answer")


def _handler_call(fn: F) -> F:
    """NAME KEY HANDLER [ARG], -n and --bootstrap: what `call` and `read` both take."""
    for option in reversed(
        (
            click.argument("name"),
            click.argument("key"),
            click.argument("handler"),
            click.argument("arg", required=False),
            namespace,
            options.bootstrap,
        )
    ):
        fn = option(fn)
    return fn


@click.group()
def entities() -> None:
    """Durable entities (@app.entity): show a key, call or read it."""


@entities.command()
@click.argument("name")
@click.argument("key")
@namespace
@options.bootstrap
@_wait
@json_output
def show(
    name: str, key: str, namespace: str, bootstrap: str | None, wait: float, as_json: bool
) -> None:
    """Entity NAME's key KEY: its state, the call in progress (with what it waits on,
    when its run is on the key's partition: a client's call is) and the calls queued, by
    run id. Exits 7 if no engine answers within --wait."""
    with Client(namespace, bootstrap) as client:
        doc = client.entity(name, key).show(timeout=wait)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"entity {name} key {key}")
    click.echo(f"state:       {json.dumps(doc['state'])}")
    for call in doc["in_progress"]:
        waits = doc["waits_on"].get(call)
        click.echo(f"in progress: {call}" + (f" (waits on: {', '.join(waits)})" if waits else ""))
    if not doc["in_progress"]:
        click.echo("in progress: -")
    click.echo(f"queued:      {', '.join(doc['queue']) or '-'}")


@entities.command()
@_handler_call
@click.option("--call-id", default=None, help="Idempotency: the same id is the same call.")
@wait_option(30.0, "the call's result")
@json_output
def call(
    name: str,
    key: str,
    handler: str,
    arg: str | None,
    namespace: str,
    bootstrap: str | None,
    call_id: str | None,
    wait: float,
    as_json: bool,
) -> None:
    """Call exclusive HANDLER of entity NAME's key KEY with ARG (JSON; null if left out)
    and print its result as JSON, once the calls before it are done (the result is JSON
    with or without --json)."""
    value = _json(arg)
    with Client(namespace, bootstrap) as client:
        result = client.entity(name, key).call(handler, value, call_id=call_id, timeout=wait)
    emit(as_json, result, json.dumps(result))


@entities.command()
@_handler_call
@_wait
@json_output
def read(
    name: str,
    key: str,
    handler: str,
    arg: str | None,
    namespace: str,
    bootstrap: str | None,
    wait: float,
    as_json: bool,
) -> None:
    """Ask shared HANDLER of entity NAME's key KEY with ARG (JSON) and print its answer
    (JSON with or without --json)."""
    value = _json(arg)
    with Client(namespace, bootstrap) as client:
        result = client.entity(name, key).read(handler, value, timeout=wait)
    emit(as_json, result, json.dumps(result))


def _json(arg: str | None) -> Any:
    try:
        return None if arg is None else json.loads(arg)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="ARG") from None
