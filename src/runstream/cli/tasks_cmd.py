"""``runstream tasks``: serve a task group (remote steps) from the shell."""

from __future__ import annotations

from typing import Any

import click

from runstream.cli import options


@click.group()
def tasks() -> None:
    """Remote steps: the task workers that serve a task group."""


@tasks.command()
@click.argument("target")
@click.option("-g", "--group", required=True, help="The task group to serve.")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Step bodies running at once, at most.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=256,
    show_default=True,
    help="Tasks held beyond the running ones, waiting for a slot (the partitions pause "
    "once that many are held).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds the running bodies get to finish at a stop (a second signal does not wait).",
)
@options.metrics
@options.bootstrap
@options.log_format
def serve(
    target: str, group: str, concurrency: int, prefetch: int, grace: float, **values: Any
) -> None:
    """Serve the remote steps of task group --group that the App at MODULE:APP declares
    (its namespace is the App's), until SIGTERM or SIGINT.

    Each task runs at least once; its offset is committed once Kafka took its result,
    and the engine settles an attempt with the first result for it. Make steps
    idempotent."""
    from runstream.taskworker import TaskWorker

    settings = options.engine_settings(values)
    app = options.load_app(target)
    TaskWorker(
        app, group, concurrency=concurrency, prefetch=prefetch, settings=settings, grace=grace
    ).run()
