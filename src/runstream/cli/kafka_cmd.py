"""`runstream kafka up|down|status`: a local Kafka for development (runstream.dev.localkafka)."""

from __future__ import annotations

import sys

import click

from runstream.dev import localkafka


@click.group()
def kafka() -> None:
    """Run a local Apache Kafka (KRaft) from Maven jars: no Docker needed."""


@kafka.command()
@click.option("--nodes", type=click.Choice(["1", "3"]), default="1", show_default=True)
@click.option("--port", type=int, default=None, help="Client port of the first node.")
def up(nodes: str, port: int | None) -> None:
    """Start a broker (or a 3-node cluster) in the background."""
    state = localkafka.up(nodes=int(nodes), port=port, progress=click.echo)
    click.echo(f"Kafka is up at {state['bootstrap']} ({state['startup_seconds']:.1f} s)")
    click.echo(f"logs: {state['work_dir']}")


@kafka.command()
def down() -> None:
    """Stop the broker(s) `up` started and delete their data."""
    pids = localkafka.down()
    click.echo(f"stopped pids {', '.join(map(str, pids))}" if pids else "not running")


@kafka.command()
def status() -> None:
    """Show whether the local broker runs, and where (exit code 1 when it does not)."""
    st = localkafka.status()
    if not st["running"]:
        click.echo("not running")
        sys.exit(1)
    alive = zip(st["pids"], st["alive"], strict=True)
    pids = ", ".join(f"{p}{'' if a else ' (dead)'}" for p, a in alive)
    click.echo(f"running at {st['bootstrap']}")
    click.echo(f"nodes: {st['nodes']}  pids: {pids}  since: {st['started']}")
    click.echo(f"logs: {st['work_dir']}")
