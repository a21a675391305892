"""``runstream sources``: forward the team's own topics (and ``<ns>.events``) as named
events, and show how far the forwarders are."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from runstream.cli import options
from runstream.settings import Settings
from runstream.topics.admin import client_config, wait_for_cluster
from runstream.topics.groups import group_status
from runstream.topics.sourcelog import group_topics, sources_group
from runstream.topics.spec import Topics


@click.group()
def sources() -> None:
    """Event sources: records of Kafka topics become named events."""


@sources.command()
@click.argument("target")
@click.option(
    "--instance",
    "instance_id",
    default=None,
    help="A stable id for this forwarder: names its transactional id and its static "
    "group membership. Never share one. Default: host and PID.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Records forwarded per transaction at most (default: $RUNSTREAM_BATCH_SIZE, 500).",
)
@options.bootstrap
@options.log_format
@click.option(
    "--supervise/--no-supervise",
    default=True,
    show_default=True,
    help="Run the forwarder in a child process and start it again whenever it dies.",
)
def serve(target: str, supervise: bool, **values: Any) -> None:
    """Forward the records of every source topic the App at MODULE:APP declares
    (``app.source(...)``), and of ``<ns>.events``, as named events, until SIGTERM or SIGINT.

    Exactly once per record: each batch's events and the source offsets after it commit
    in one Kafka transaction. A record that cannot be decoded or keyed goes to
    ``<ns>.dlq``."""
    from runstream.sources import SourceForwarder

    settings = options.engine_settings(values)
    options.serve(
        "sources", target, settings, supervise, lambda app: SourceForwarder(app, settings).run()
    )


@sources.command()
@options.namespace
@options.bootstrap
@options.json_output
def status(namespace: str, bootstrap: str | None, as_json: bool) -> None:
    """Show how far the forwarders of namespace -n are: per source topic (those the
    group ``<ns>.sources`` committed offsets of, and ``<ns>.events``) and partition, the
    committed offset, the end offset and the lag."""
    settings = Settings().with_bootstrap(bootstrap)
    config = client_config(settings.bootstrap(), settings.kafka)
    wait_for_cluster(config, settings.connect_timeout)
    topics = Topics(namespace)
    group = sources_group(topics)
    names = sorted({topics.events, *group_topics(config, group, settings.connect_timeout)})
    found = [group_status(config, group, t, settings.connect_timeout) for t in names]
    state = found[0].state
    members = found[0].members
    if as_json:
        doc = {
            "group": group,
            "state": state,
            "forwarders": [
                {"member_id": m.member_id, "client_id": m.client_id, "host": m.host}
                for m in members
            ],
            "lag": sum(g.lag for g in found),
            "topics": [
                {
                    "topic": g.topic,
                    "lag": g.lag,
                    "partitions": [asdict(p) for p in g.partitions],
                }
                for g in found
            ],
        }
        click.echo(json.dumps(doc, indent=2))
        return
    table = Table(title=f"{group}: {state}, {len(members)} forwarder(s)")
    for column in ("topic", "partition", "committed", "end", "lag"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for g in found:
        for p in g.partitions:
            committed = "-" if p.committed is None else str(p.committed)
            table.add_row(g.topic, str(p.partition), committed, str(p.end), str(p.lag))
    Console(width=200).print(table)
