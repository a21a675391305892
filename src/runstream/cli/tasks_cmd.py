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


def _group_command(unpause: bool) -> click.Command:
    verb = "unpause" if unpause else "pause"

    @click.command(verb)
    @click.argument("group")
    @options.namespace
    @options.bootstrap
    @click.option("--reason", default="", help="Why, for the journal and `tasks status`.")
    @options.json_output
    def command(
        group: str, namespace: str, bootstrap: str | None, reason: str, as_json: bool
    ) -> None:
        from runstream.client import Client
        from runstream.errors import TopicError
        from runstream.pausing import who
        from runstream.topics.spec import Topics

        try:
            Topics(namespace).tasks(group)  # a task group's name, checked before Kafka
        except TopicError as exc:
            raise click.BadParameter(str(exc), param_hint="GROUP") from None
        why = reason or f"runstream tasks {verb}"
        with Client(namespace, bootstrap) as client:
            send = client.unpause_group if unpause else client.pause_group
            send(group, reason=why, by=who())
        options.emit(as_json, {"group": group, "sent": verb}, f"task group {group!r}: {verb} sent")

    command.help = (
        "Unpause task group GROUP: the remote steps it held are sent at once."
        if unpause
        else "Pause task group GROUP: the engine sends no new remote step of it (the steps "
        "due wait, their timeout not running, and are sent on unpause); attempts already "
        "sent finish and are recorded. Paused groups show in `runstream tasks status`."
    )
    return command


tasks.add_command(_group_command(unpause=False))
tasks.add_command(_group_command(unpause=True))
