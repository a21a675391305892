"""`runstream topics create|describe`: set up and inspect a namespace's Kafka topics."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from runstream.config import resolve_bootstrap
from runstream.errors import RunstreamError
from runstream.topics.admin import describe_topics, ensure_topics
from runstream.topics.spec import DEFAULT_PARTITIONS, DEFAULT_REPLICATION

F = TypeVar("F", bound=Callable[..., Any])

_BOOTSTRAP_HELP = (
    "Kafka bootstrap servers (default: $RUNSTREAM_BOOTSTRAP_SERVERS, "
    "$KAFKA_BOOTSTRAP_SERVERS, the broker `runstream kafka up` started, 127.0.0.1:9092)."
)


def _errors_to_exit(fn: F) -> F:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RunstreamError as exc:
            click.echo(f"Error: {exc}", err=True)
            raise SystemExit(1) from None

    return wrapper  # type: ignore[return-value]


@click.group()
def topics() -> None:
    """Create and inspect a namespace's Kafka topics.

    The partition count of a namespace is fixed when its topics are created:
    commands and journal are co-partitioned, and adding partitions later would
    move runs to other partitions. Pick it generously: it caps how many engine
    instances can share the work.
    """


@topics.command("create")
@click.argument("namespace")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=DEFAULT_PARTITIONS,
    show_default=True,
    help="Partitions per topic; fixed for the namespace's lifetime.",
)
@click.option(
    "--replication",
    type=click.IntRange(min=1),
    default=DEFAULT_REPLICATION,
    show_default=True,
    help="Replication factor (3 in production).",
)
@click.option(
    "--task-group",
    "task_groups",
    multiple=True,
    help="Also create <namespace>.tasks.<group> for this worker group (repeatable).",
)
@click.option("--bootstrap", default=None, help=_BOOTSTRAP_HELP)
@_errors_to_exit
def create(
    namespace: str,
    partitions: int,
    replication: int,
    task_groups: tuple[str, ...],
    bootstrap: str | None,
) -> None:
    """Create the topics of NAMESPACE that do not exist yet (safe to repeat)."""
    server = resolve_bootstrap(bootstrap)
    created = ensure_topics(server, namespace, partitions, replication, task_groups=task_groups)
    if created:
        for name in created:
            click.echo(f"created {name}")
    else:
        click.echo(f"all topics of {namespace!r} already exist")
    _print_table(describe_topics(server, namespace))


@topics.command("describe")
@click.argument("namespace")
@click.option("--bootstrap", default=None, help=_BOOTSTRAP_HELP)
@_errors_to_exit
def describe(namespace: str, bootstrap: str | None) -> None:
    """Show the topics of NAMESPACE: partitions, replication, retention."""
    rows = describe_topics(resolve_bootstrap(bootstrap), namespace)
    _print_table(rows)
    missing = [r["name"] for r in rows if not r["exists"]]
    if missing:
        click.echo(
            f"\nmissing: {', '.join(missing)}; run `runstream topics create {namespace}`",
            err=True,
        )


def _print_table(rows: list[dict[str, Any]]) -> None:
    headers = ("TOPIC", "PARTITIONS", "RF", "CLEANUP", "RETENTION.MS", "RETENTION.BYTES", "MIN.ISR")
    table = [headers]
    for r in rows:
        c = r["configs"]
        table.append(
            (
                r["name"],
                "-" if r["partitions"] is None else str(r["partitions"]),
                "-" if r["replication"] is None else str(r["replication"]),
                c.get("cleanup.policy", "-") if r["exists"] else "(missing)",
                c.get("retention.ms", "-"),
                c.get("retention.bytes", "-"),
                c.get("min.insync.replicas", "-"),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
