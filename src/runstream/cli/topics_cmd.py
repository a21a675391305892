"""`runstream topics create|describe -n NAMESPACE`: set up and inspect a namespace's Kafka
topics (the namespace as an argument still works, deprecated)."""

from __future__ import annotations

from typing import Any

import click

from runstream.cli import options
from runstream.settings import Settings
from runstream.topics.admin import describe_topics, ensure_topics
from runstream.topics.spec import DEFAULT_PARTITIONS, DEFAULT_REPLICATION


@click.group()
def topics() -> None:
    """Create and inspect a namespace's Kafka topics.

    The partition count of a namespace is fixed when its topics are created:
    commands and journal are co-partitioned, and adding partitions later would
    move runs to other partitions. Pick it generously: it caps how many engine
    instances can share the work.
    """


@topics.command("create")
@options.namespace_compat
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
@options.bootstrap
@options.json_output
def create(
    namespace: str,
    partitions: int,
    replication: int,
    task_groups: tuple[str, ...],
    bootstrap: str | None,
    as_json: bool,
) -> None:
    """Create the topics of NAMESPACE that do not exist yet (safe to repeat)."""
    s = Settings().with_bootstrap(bootstrap)
    server = s.bootstrap()
    created = ensure_topics(
        server, namespace, partitions, replication, task_groups=task_groups, kafka=s.kafka
    )
    rows = describe_topics(server, namespace, kafka=s.kafka)
    if as_json:
        options.emit(True, {"namespace": namespace, "created": list(created), "topics": rows})
        return
    if created:
        for name in created:
            click.echo(f"created {name}")
    else:
        click.echo(f"all topics of {namespace!r} already exist")
    _print_table(rows)


@topics.command("describe")
@options.namespace_compat
@options.bootstrap
@options.json_output
def describe(namespace: str, bootstrap: str | None, as_json: bool) -> None:
    """Show the topics of NAMESPACE: partitions, replication, retention."""
    s = Settings().with_bootstrap(bootstrap)
    rows = describe_topics(s.bootstrap(), namespace, kafka=s.kafka)
    if as_json:
        options.emit(True, {"namespace": namespace, "topics": rows})
        return
    _print_table(rows)
    missing = [r["name"] for r in rows if not r["exists"]]
    if missing:
        click.echo(
            f"\nmissing: {', '.join(missing)}; run `runstream topics create -n {namespace}`",
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
