"""The `runstream` command: thin click groups over the library."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from runstream.cli.audit_cmd import audit
from runstream.cli.kafka_cmd import kafka
from runstream.cli.topics_cmd import topics
from runstream.errors import RunstreamError


class _Cli(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RunstreamError as exc:
            click.echo(f"{type(exc).__name__}: {exc}", err=True)
            sys.exit(1)


@click.group(cls=_Cli)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
def cli(verbose: bool) -> None:
    """Runstream: durable workflows whose only database is Kafka."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


cli.add_command(audit)
cli.add_command(kafka)
cli.add_command(topics)


def load_app(target: str) -> Any:
    """'package.module:app' -> the App object (the current directory is importable)."""
    module_name, _, attr = target.partition(":")
    if not module_name:
        raise click.BadParameter("use MODULE:APP, e.g. shop.workflows:app")
    sys.path.insert(0, str(Path.cwd()))
    module = importlib.import_module(module_name)
    return getattr(module, attr or "app")


@cli.command()
@click.argument("target")
@click.option(
    "--instance",
    default="",
    help="Stable instance id (names its state dir and "
    "transactional id). Default: host name and PID.",
)
@click.option(
    "--state-dir",
    default="./state",
    type=click.Path(path_type=Path),
    show_default=True,
    help="Where the RocksDB projections live.",
)
@click.option(
    "--partitions",
    default=12,
    show_default=True,
    help="Partition count if this instance creates the namespace's topics.",
)
@click.option("--concurrency", default=16, show_default=True, help="Local steps at once.")
@click.option(
    "--supervise/--no-supervise",
    default=True,
    show_default=True,
    help="Run the engine in a child process and start it again whenever it dies.",
)
def worker(
    target: str,
    instance: str,
    state_dir: Path,
    partitions: int,
    concurrency: int,
    supervise: bool,
) -> None:
    """Run an engine instance for the App at MODULE:APP until SIGTERM."""
    from runstream.worker import WorkerSettings

    if supervise:
        from runstream.supervisor import supervise as run_supervised

        argv = [sys.executable, "-m", "runstream", *sys.argv[1:], "--no-supervise"]
        sys.exit(run_supervised(argv))
    app = load_app(target)
    app.worker(
        WorkerSettings(
            instance_id=instance,
            state_dir=state_dir,
            partitions=partitions,
            step_concurrency=concurrency,
        )
    ).run()


def _client(namespace: str, bootstrap: str | None) -> Any:
    from runstream.client import Client

    return Client(namespace, bootstrap)


_ns = click.option("-n", "--namespace", required=True, help="The App's namespace.")
_bootstrap = click.option("--bootstrap", default=None, help="Kafka bootstrap servers.")


def _json(value: str | None) -> Any:
    try:
        return None if value is None else json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from exc


@cli.command()
@click.argument("workflow")
@click.argument("input", required=False)
@_ns
@_bootstrap
@click.option("--run-id", default=None, help="Idempotency: starting an existing id does nothing.")
@click.option("--version", default=None, help="Pin a workflow version (default: the newest).")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--timeout", default=60.0, show_default=True)
def start(
    workflow: str,
    input: str | None,
    namespace: str,
    bootstrap: str | None,
    run_id: str | None,
    version: str | None,
    wait: bool,
    timeout: float,
) -> None:
    """Start WORKFLOW with INPUT (JSON); prints the run id."""
    with _client(namespace, bootstrap) as client:
        rid = client.start(workflow, _json(input), run_id=run_id, version=version)
        click.echo(rid)
        if wait:
            click.echo(json.dumps(client.result(rid, timeout=timeout)))


@cli.command()
@click.argument("run_id")
@click.argument("name")
@click.argument("payload", required=False)
@_ns
@_bootstrap
def signal(
    run_id: str, name: str, payload: str | None, namespace: str, bootstrap: str | None
) -> None:
    """Send signal NAME with PAYLOAD (JSON) to RUN_ID."""
    with _client(namespace, bootstrap) as client:
        client.signal(run_id, name, _json(payload))


@cli.command()
@click.argument("run_id")
@_ns
@_bootstrap
@click.option("--timeout", default=60.0, show_default=True)
def result(run_id: str, namespace: str, bootstrap: str | None, timeout: float) -> None:
    """Wait for RUN_ID to end; print its output as JSON (exit 1 if it failed)."""
    with _client(namespace, bootstrap) as client:
        click.echo(json.dumps(client.result(run_id, timeout=timeout)))


@cli.command()
@click.argument("run_id")
@_ns
@_bootstrap
@click.option("--compensate", is_flag=True, help="Run the compensations first.")
@click.option("--reason", default="", help="Recorded with the cancellation.")
def cancel(
    run_id: str, namespace: str, bootstrap: str | None, compensate: bool, reason: str
) -> None:
    """Cancel RUN_ID."""
    with _client(namespace, bootstrap) as client:
        client.cancel(run_id, compensate=compensate, reason=reason)


@cli.command("get")
@click.argument("run_id")
@_ns
@_bootstrap
def get_run(run_id: str, namespace: str, bootstrap: str | None) -> None:
    """Show RUN_ID's status, as its owning instance knows it (JSON)."""
    with _client(namespace, bootstrap) as client:
        click.echo(client.get_run(run_id).model_dump_json(indent=2))


def main() -> None:
    cli()
