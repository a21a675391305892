"""`runstream kafka up|down|status`: a local Kafka for development (runstream.dev.localkafka)."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from runstream.cli import exits, options
from runstream.dev import localkafka
from runstream.settings import kafka_key_env


@click.group()
def kafka() -> None:
    """Run a local Apache Kafka (KRaft) from Maven jars: no Docker needed."""


@kafka.command()
@click.option("--nodes", type=click.Choice(["1", "3"]), default="1", show_default=True)
@click.option("--port", type=int, default=None, help="Client port of the first node.")
@click.option(
    "--security",
    type=click.Choice(localkafka.SECURITY),
    default="plaintext",
    show_default=True,
    help="sasl_ssl: SCRAM-SHA-512 over TLS (a throwaway CA) with ACLs on.",
)
@options.json_output
def up(nodes: str, port: int | None, security: str, as_json: bool) -> None:
    """Start a broker (or a 3-node cluster) in the background."""
    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    state = localkafka.up(nodes=int(nodes), port=port, progress=say, security=security)
    if as_json:
        options.emit(True, state)
        return
    click.echo(f"Kafka is up at {state['bootstrap']} ({state['startup_seconds']:.1f} s)")
    click.echo(f"logs: {state['work_dir']}")
    if security == "sasl_ssl":
        _print_secured(state)


def _print_secured(state: dict[str, Any]) -> None:
    """What a client needs: the CA, the users, and the settings ready to paste."""
    config: dict[str, str] = state["kafka_config"]
    click.echo(f"SASL_SSL, SCRAM-SHA-512, ACLs on; CA certificate: {state['ca_file']}")
    for user, password in state["users"].items():
        role = " (super user)" if user == localkafka.ADMIN else ""
        click.echo(f"user {user}{role}: password {password}")
    click.echo("Runstream (the CLI, engines, task workers, clients), as the admin:")
    exports = [f"RUNSTREAM_BOOTSTRAP_SERVERS={state['bootstrap']}"]
    exports += [f"{kafka_key_env(k)}={shlex.quote(v)}" for k, v in config.items()]
    click.echo("  export " + " ".join(exports))
    click.echo("or on any command:")
    click.echo(
        "  " + " ".join(f"--kafka-config {shlex.quote(f'{k}={v}')}" for k, v in config.items())
    )
    click.echo("Other librdkafka clients: bootstrap.servers=" + state["bootstrap"])
    for k, v in config.items():
        click.echo(f"  {k}={v}")


@kafka.command()
@options.json_output
def down(as_json: bool) -> None:
    """Stop the broker(s) `up` started and delete their data."""
    pids = localkafka.down()
    text = f"stopped pids {', '.join(map(str, pids))}" if pids else "not running"
    options.emit(as_json, {"stopped": pids}, text)


@kafka.command()
@options.json_output
def status(as_json: bool) -> None:
    """Show whether the local broker runs, and where (exit code 1 when it does not)."""
    st = localkafka.status()
    if as_json or not st["running"]:
        options.emit(as_json, st, "not running")
        sys.exit(exits.OK if st["running"] else exits.NO)
    alive = zip(st["pids"], st["alive"], strict=True)
    pids = ", ".join(f"{p}{'' if a else ' (dead)'}" for p, a in alive)
    click.echo(f"running at {st['bootstrap']} ({st.get('security', 'plaintext')})")
    click.echo(f"nodes: {st['nodes']}  pids: {pids}  since: {st['started']}")
    click.echo(f"logs: {st['work_dir']}")
    if st.get("security") == "sasl_ssl":
        _print_secured(st)
