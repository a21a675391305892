"""The `runstream` command: thin click groups over the library.

Every error Runstream raises on purpose is printed as one line, ``Type: message``, on
stderr, and the command exits 1; ``-v`` adds the traceback and librdkafka's own log.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from runstream.cli import options
from runstream.errors import RunstreamError
from runstream.instance import read_health
from runstream.topics.logs import LOGGER_NAME

#: The command groups kept in modules of their own, imported only when one is used (a
#: `runstream worker` starts faster, which a restart after a crash waits for):
#: name -> (module, attribute, the commands of other modules it carries too).
LAZY: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "audit": ("audit_cmd", "audit", ()),
    "kafka": ("kafka_cmd", "kafka", ()),
    "topics": ("topics_cmd", "topics", ()),
    "runs": (
        "runs_cmd",
        "runs",
        (
            "runs_ops:retry",
            "runs_ops:resume",
            "runs_ops:cancel_where",
            "queries_cmd:event",
            "pause_cmd:pause",
            "pause_cmd:unpause",
            "update_cmd:update",
            "queries_cmd:query",
            "export_cmd:export",
        ),
    ),
    "versions": ("runs_cmd", "versions", ()),
    "replay": ("replay_cmd", "replay_cmd", ()),
    "dlq": ("dlq_cmd", "dlq", ()),
    "schedules": ("schedules_cmd", "schedules", ()),
    "sources": ("sources_cmd", "sources", ()),
    "tasks": ("tasks_cmd", "tasks", ("tasks_status:status",)),
    "promise": ("promise_cmd", "promise", ()),
    "entities": ("entities_cmd", "entities", ()),
    "ui": ("ui_cmd", "ui", ()),
}


def _command(path: str) -> Any:
    """``module:attribute`` of `runstream.cli` -> that object."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(f"runstream.cli.{module}"), attr)


class _Cli(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in LAZY or name in self.commands:
            return super().get_command(ctx, name)
        module, attr, extra = LAZY[name]
        command: click.Command = _command(f"{module}:{attr}")
        if isinstance(command, click.Group):
            for path in extra:
                command.add_command(_command(path))
        self.add_command(command, name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (RunstreamError, TimeoutError) as exc:
            if logging.getLogger("runstream").isEnabledFor(logging.DEBUG):
                traceback.print_exc()
            click.echo(f"{type(exc).__name__}: {exc}", err=True)
            sys.exit(1)


@click.group(cls=_Cli)
@click.version_option(package_name="runstream", message="runstream %(version)s")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Log at DEBUG level, librdkafka's own lines included; tracebacks on errors.",
)
def cli(verbose: bool) -> None:
    """Runstream: durable workflows whose only database is Kafka."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Runstream says itself when Kafka cannot be reached; librdkafka's lines only with -v.
    logging.getLogger(LOGGER_NAME).setLevel(logging.DEBUG if verbose else logging.CRITICAL)


@cli.command()
@click.argument("target")
@options.engine_options
@options.bootstrap
@options.log_format
@click.option(
    "--supervise/--no-supervise",
    default=True,
    show_default=True,
    help="Run the engine in a child process and start it again whenever it dies.",
)
def worker(target: str, supervise: bool, **values: Any) -> None:
    """Run an engine instance for the App at MODULE:APP until SIGTERM or SIGINT.

    Every option can also be set by environment variable: --batch-size is
    RUNSTREAM_BATCH_SIZE, --kafka-config security.protocol=SASL_SSL is
    RUNSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL.
    """
    from runstream.worker import Worker

    settings = options.engine_settings(values)
    options.serve("worker", target, settings, supervise, lambda app: Worker(app, settings).run())


@cli.command()
@options.namespace
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path("./state"),
    show_default=True,
    help="The engine instances' state directory.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def workers(namespace: str, state_dir: Path, as_json: bool) -> None:
    """Show the engine instances of NAMESPACE that keep their state in --state-dir: what
    each is doing (connecting, restoring, running, draining, stopped) and its partitions."""
    rows = read_health(state_dir / namespace)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no engine instance of {namespace!r} under {state_dir}")
    for r in rows:
        parts = ",".join(map(str, r["partitions"])) or "-"
        status = r["status"] if r["alive"] else f"{r['status']} (process gone)"
        click.echo(
            f"{r['instance']:<24} {status:<28} pid {r['pid']:<8} partitions {parts}  "
            f"(updated {r['age_s']}s ago)"
        )


def _client(namespace: str, bootstrap: str | None) -> Any:
    from runstream.client import Client

    return Client(namespace, bootstrap)


def _json(value: str | None) -> Any:
    try:
        return None if value is None else json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from exc


@cli.command()
@click.argument("workflow")
@click.argument("input", required=False)
@options.namespace
@options.bootstrap
@click.option("--run-id", default=None, help="Idempotency: starting an existing id does nothing.")
@click.option("--version", default=None, help="Pin a workflow version (default: the newest).")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help="A tag (repeatable).")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to --wait.")
@click.option(
    "--run-timeout",
    default=None,
    help="The run's execution timeout (seconds, or 30m, 1d), instead of the workflow's.",
)
def start(
    workflow: str,
    input: str | None,
    namespace: str,
    bootstrap: str | None,
    run_id: str | None,
    version: str | None,
    tags: tuple[str, ...],
    wait: bool,
    timeout: float,
    run_timeout: str | None,
) -> None:
    """Start WORKFLOW with INPUT (JSON); prints the run id."""
    value = _json(input)
    tag_map = dict(t.partition("=")[::2] for t in tags)
    with _client(namespace, bootstrap) as client:
        try:
            rid = client.start(
                workflow, value, run_id=run_id, version=version, tags=tag_map, timeout=run_timeout
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        click.echo(rid)
        if wait:
            click.echo(json.dumps(client.result(rid, timeout=timeout)))


@cli.command()
@click.argument("run_id")
@click.argument("name")
@click.argument("payload", required=False)
@options.namespace
@options.bootstrap
def signal(
    run_id: str, name: str, payload: str | None, namespace: str, bootstrap: str | None
) -> None:
    """Send signal NAME with PAYLOAD (JSON) to RUN_ID."""
    value = _json(payload)
    with _client(namespace, bootstrap) as client:
        client.signal(run_id, name, value)


@cli.command()
@click.argument("run_id")
@options.namespace
@options.bootstrap
@click.option("--timeout", default=60.0, show_default=True)
def result(run_id: str, namespace: str, bootstrap: str | None, timeout: float) -> None:
    """Wait for RUN_ID to end; print its output as JSON (exit 1 if it failed)."""
    with _client(namespace, bootstrap) as client:
        click.echo(json.dumps(client.result(run_id, timeout=timeout)))


@cli.command()
@click.argument("run_id")
@options.namespace
@options.bootstrap
@click.option("--compensate", is_flag=True, help="Run the compensations first.")
@click.option("--reason", default="", help="Recorded with the cancellation.")
def cancel(
    run_id: str, namespace: str, bootstrap: str | None, compensate: bool, reason: str
) -> None:
    """Cancel RUN_ID."""
    with _client(namespace, bootstrap) as client:
        client.cancel(run_id, compensate=compensate, reason=reason)


#: `get --tree` shows child runs this many levels deep at most.
TREE_DEPTH = 10


@cli.command("get")
@click.argument("run_id")
@options.namespace
@options.bootstrap
@click.option("--tree", is_flag=True, help="Draw the run and its child runs, theirs too.")
def get_run(run_id: str, namespace: str, bootstrap: str | None, tree: bool) -> None:
    """Show RUN_ID's status, as its owning instance knows it (JSON), or its tree."""
    from rich.console import Console
    from rich.tree import Tree

    with _client(namespace, bootstrap) as client:
        if not tree:
            click.echo(client.get_run(run_id).model_dump_json(indent=2))
            return

        def grow(node: Tree, child_id: str, depth: int) -> None:
            info = client.get_run(child_id)
            branch = node.add(f"{info.run_id}  {info.workflow}  [bold]{info.status}[/bold]")
            if depth < TREE_DEPTH:
                for grandchild in info.children:
                    grow(branch, grandchild, depth + 1)

        root = Tree(f"namespace {namespace}")
        grow(root, run_id, 0)
        Console().print(root)


def main() -> None:
    """The console script."""
    cli()
