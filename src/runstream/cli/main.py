"""The `runstream` command: thin click groups over the library.

One convention for every command: the namespace is ``-n/--namespace``, ``--json`` prints
one JSON document (JSON lines for a stream), ``--tag KEY=VALUE`` and times (UTC, ISO 8601
with Z) are read and written by `cli.options`, ``--wait`` is how long the command waits and
``--timeout`` a run's own time limit. Every error is printed as one line on stderr:
``Type: message`` for Runstream's errors, ``UsageError: ...`` for a wrong command line;
the exit status says which kind (`cli.exits`). ``-v`` adds the traceback and librdkafka's
own log.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from runstream.cli import exits, options
from runstream.cli.options import DURATION
from runstream.errors import RunstreamError
from runstream.instance import read_health
from runstream.topics.logs import LOGGER_NAME

#: The commands kept in modules of their own, imported only when one is used (a
#: `runstream worker` starts faster, which a restart after a crash waits for):
#: name -> (module, attribute, the commands of other modules a group carries too).
LAZY: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "audit": ("audit_cmd", "audit", ()),
    "kafka": ("kafka_cmd", "kafka", ()),
    "topics": ("topics_cmd", "topics", ()),
    "cancel": ("runs_ops", "cancel", ()),
    "runs": (
        "runs_cmd",
        "runs",
        (
            "runs_ops:retry",
            "runs_ops:resume",
            "runs_ops:cancel",
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


def _with_epilog(command: click.Command) -> click.Command:
    """Every command's --help ends pointing at the exit-code table."""
    if command.epilog is None:
        command.epilog = exits.EPILOG
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_epilog(sub)
    return command


class _Cli(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in LAZY or name in self.commands:
            command = super().get_command(ctx, name)
            return None if command is None else _with_epilog(command)
        module, attr, extra = LAZY[name]
        command = _command(f"{module}:{attr}")
        if isinstance(command, click.Group):
            for path in extra:
                command.add_command(_command(path))
        self.add_command(command, name)
        return _with_epilog(command)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (RunstreamError, TimeoutError) as exc:
            if logging.getLogger("runstream").isEnabledFor(logging.DEBUG):
                traceback.print_exc()
            click.echo(f"{type(exc).__name__}: {exc}", err=True)
            sys.exit(exits.code_of(exc))

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """click's own handling, but a usage error is one line (click prints the usage
        and a hint too) and each kind of end exits with its code of `cli.exits`."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: its help
            exc.show()
            code = exc.exit_code
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            message = " ".join(exc.format_message().split())
            click.echo(f"UsageError: {message}{where}", err=True)
            code = exits.USAGE
        except click.ClickException as exc:  # a message for the user (an extra not installed)
            click.echo(f"Error: {exc.format_message()}", err=True)
            code = exits.ERROR if exc.exit_code == 1 else exc.exit_code
        except click.Abort:
            click.echo("Aborted.", err=True)
            code = exits.INTERRUPTED
        sys.exit(code if isinstance(code, int) else exits.OK)


@click.group(cls=_Cli, epilog=exits.EPILOG)
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
    # Runstream says itself when Kafka cannot be reached; librdkafka's lines only with -v,
    # but for an offset reset (a consumer moved without reading), which only it can say.
    kafka = logging.getLogger(LOGGER_NAME)
    kafka.setLevel(logging.DEBUG if verbose else logging.WARNING)
    if verbose:
        kafka.removeFilter(_offset_resets_only)
    elif _offset_resets_only not in kafka.filters:
        kafka.addFilter(_offset_resets_only)


def _offset_resets_only(record: logging.LogRecord) -> bool:
    """librdkafka's log lines start with their facility: OFFSET for a reset."""
    return record.getMessage().startswith("OFFSET")


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
    """Run an engine instance for the App at MODULE:APP (its namespace is the App's) until
    SIGTERM or SIGINT.

    Every option can also be set by environment variable: --batch-size is
    RUNSTREAM_BATCH_SIZE, --kafka-config security.protocol=SASL_SSL is
    RUNSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL.
    """
    settings = options.engine_settings(values)

    def run(app: Any) -> None:
        from runstream.worker import Worker  # in the engine process only, not its supervisor

        Worker(app, settings).run()

    options.serve("worker", target, settings, supervise, run)


@cli.command()
@options.namespace
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path("./state"),
    show_default=True,
    help="The engine instances' state directory.",
)
@options.json_output
def workers(namespace: str, state_dir: Path, as_json: bool) -> None:
    """Show the engine instances of NAMESPACE that keep their state in --state-dir: what
    each is doing (connecting, restoring, running, draining, stopped) and its partitions."""
    rows = read_health(state_dir / namespace)
    if as_json:
        options.emit(True, rows)
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


def _json(value: str | None, hint: str) -> Any:
    try:
        return None if value is None else json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=hint) from None


#: `start --wait` alone waits this long (seconds).
WAIT = 60.0


def _start_options(fn: Any) -> Any:
    """What `start` and `signal-with-start` share: the run they may start."""
    for option in reversed(
        (
            options.namespace,
            options.bootstrap,
            click.option(
                "--version", default=None, help="Pin a workflow version (default: the newest)."
            ),
            options.tags("A tag of the run (repeatable)."),
            click.option(
                "--timeout",
                type=DURATION,
                default=None,
                help="The run's execution timeout (seconds, or 30m, 1d), instead of the "
                "workflow's.",
            ),
            click.option(
                "--wait",
                type=DURATION,
                is_flag=False,
                flag_value=WAIT,
                default=None,
                help=f"Wait for the run's result, up to DURATION ({WAIT:.0f}s if only --wait is "
                "given), and print it.",
            ),
            options.json_output,
        )
    ):
        fn = option(fn)
    return fn


def _started(
    client: Any, run_id: str, wait: float | None, as_json: bool, doc: dict[str, Any]
) -> None:
    """Print the run id (and with --wait its output; a run ending otherwise raises)."""
    if wait is None:
        options.emit(as_json, doc, run_id)
        return
    if not as_json:
        click.echo(run_id)
    output = client.result(run_id, timeout=wait)
    options.emit(as_json, {**doc, "status": "completed", "output": output}, json.dumps(output))


def _run_timeout(timeout: float | None, run_timeout: float | None) -> float | None:
    if run_timeout is not None:
        click.echo("warning: --run-timeout is deprecated: use --timeout", err=True)
    return timeout if timeout is not None else run_timeout


@cli.command()
@click.argument("workflow")
@click.argument("input", required=False)
@click.option("--run-id", default=None, help="Idempotency: starting an existing id does nothing.")
@click.option("--run-timeout", type=DURATION, default=None, hidden=True)  # was --timeout's name
@_start_options
def start(
    workflow: str,
    input: str | None,
    run_id: str | None,
    run_timeout: float | None,
    namespace: str,
    bootstrap: str | None,
    version: str | None,
    tags: dict[str, str],
    timeout: float | None,
    wait: float | None,
    as_json: bool,
) -> None:
    """Start WORKFLOW with INPUT (JSON); prints the run id (with --wait, then its output).
    A run that ends failed or cancelled exits 1."""
    value, timeout = _json(input, "INPUT"), _run_timeout(timeout, run_timeout)
    with _client(namespace, bootstrap) as client:
        try:
            rid = client.start(
                workflow, value, run_id=run_id, version=version, tags=tags, timeout=timeout
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        _started(client, rid, wait, as_json, {"run_id": rid})


@cli.command("signal-with-start")
@click.argument("workflow")
@click.argument("input", required=False)
@click.option(
    "--run-id", required=True, help="The run to signal, started first if it does not exist."
)
@click.option("--signal", "name", required=True, help="The signal's name.")
@click.option("--payload", default=None, help="The signal's payload (JSON).")
@click.option("--signal-id", default=None, help="Idempotency: a resend with this id counts once.")
@_start_options
def signal_with_start(
    workflow: str,
    input: str | None,
    run_id: str,
    name: str,
    payload: str | None,
    signal_id: str | None,
    namespace: str,
    bootstrap: str | None,
    version: str | None,
    tags: dict[str, str],
    timeout: float | None,
    wait: float | None,
    as_json: bool,
) -> None:
    """Send signal --signal to run --run-id, starting it (WORKFLOW with INPUT, JSON) first
    if it does not exist, in one command: the signal is delivered exactly once either
    way. Prints the run id (with --wait, then its output)."""
    value, sent = _json(input, "INPUT"), _json(payload, "--payload")
    signal_id = signal_id or uuid.uuid4().hex
    with _client(namespace, bootstrap) as client:
        try:
            rid = client.signal_with_start(
                workflow,
                value,
                run_id=run_id,
                signal=name,
                value=sent,
                signal_id=signal_id,
                version=version,
                tags=tags,
                timeout=timeout,
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        _started(
            client, rid, wait, as_json, {"run_id": rid, "signal": name, "signal_id": signal_id}
        )


@cli.command()
@click.argument("run_id")
@click.argument("name")
@click.argument("payload", required=False)
@options.namespace
@options.bootstrap
@click.option("--signal-id", default=None, help="Idempotency: a resend with this id counts once.")
@options.json_output
def signal(
    run_id: str,
    name: str,
    payload: str | None,
    namespace: str,
    bootstrap: str | None,
    signal_id: str | None,
    as_json: bool,
) -> None:
    """Send signal NAME with PAYLOAD (JSON) to RUN_ID."""
    value = _json(payload, "PAYLOAD")
    signal_id = signal_id or uuid.uuid4().hex
    with _client(namespace, bootstrap) as client:
        client.signal(run_id, name, value, signal_id=signal_id)
    options.emit(as_json, {"run_id": run_id, "signal": name, "signal_id": signal_id})


@cli.command()
@click.argument("name")
@click.argument("payload", required=False)
@options.namespace
@options.bootstrap
@click.option("--key", default="", help="The correlation key: waits for NAME with this key get it.")
@click.option(
    "--ttl",
    type=DURATION,
    default=0.0,
    help="Keep the event this long for waits that come later (default: only waits that exist).",
)
@click.option("--event-id", default=None, help="Idempotency: a resend with this id counts once.")
@options.json_output
def publish(
    name: str,
    payload: str | None,
    namespace: str,
    bootstrap: str | None,
    key: str,
    ttl: float,
    event_id: str | None,
    as_json: bool,
) -> None:
    """Publish event NAME with PAYLOAD (JSON) and --key: each run waiting for it
    (ctx.wait_for_event) gets it once, each workflow it triggers starts. Prints the
    event id."""
    value = _json(payload, "PAYLOAD")
    with _client(namespace, bootstrap) as client:
        sent = client.publish(name, value, key=key, ttl=ttl, event_id=event_id)
    options.emit(as_json, {"name": name, "key": key, "event_id": sent}, sent)


@cli.command()
@click.argument("run_id")
@options.namespace
@options.bootstrap
@options.wait_option(WAIT, "the run to end")
@options.json_output
def result(run_id: str, namespace: str, bootstrap: str | None, wait: float, as_json: bool) -> None:
    """Wait for RUN_ID to end; print its output as JSON (exit 1 if it failed or was
    cancelled, 7 if --wait ran out first)."""
    with _client(namespace, bootstrap) as client:
        output = client.result(run_id, timeout=wait)
    doc = {"run_id": run_id, "status": "completed", "output": output}
    options.emit(as_json, doc, json.dumps(output))


#: `get --tree` shows child runs this many levels deep at most.
TREE_DEPTH = 10


@cli.command("get")
@click.argument("run_id")
@options.namespace
@options.bootstrap
@click.option("--tree", is_flag=True, help="Draw the run and its child runs, theirs too.")
@options.json_output
def get_run(run_id: str, namespace: str, bootstrap: str | None, tree: bool, as_json: bool) -> None:
    """Show RUN_ID's status, as its owning instance knows it (JSON), or its tree (with
    --json: each run with its "children", nested)."""
    from rich.console import Console
    from rich.tree import Tree

    with _client(namespace, bootstrap) as client:
        if not tree:
            click.echo(client.get_run(run_id).model_dump_json(indent=2))
            return

        def grow(child_id: str, depth: int) -> dict[str, Any]:
            info = client.get_run(child_id)
            below = info.children if depth < TREE_DEPTH else []
            return {**info.model_dump(mode="json"), "children": [grow(c, depth + 1) for c in below]}

        found = grow(run_id, 0)
    if as_json:
        options.emit(True, found)
        return

    def draw(node: Tree, run: dict[str, Any]) -> None:
        branch = node.add(f"{run['run_id']}  {run['workflow']}  [bold]{run['status']}[/bold]")
        for child in run["children"]:
            draw(branch, child)

    root = Tree(f"namespace {namespace}")
    draw(root, found)
    Console().print(root)


@cli.command("exit-codes")
@options.json_output
def exit_codes(as_json: bool) -> None:
    """The exit status of every command, and what each one means."""
    rows = [{"code": c, "name": n, "meaning": m} for c, (n, m) in exits.TABLE.items()]
    options.emit(
        as_json, rows, "\n".join(f"{c:>3}  {n:<18} {m}" for c, (n, m) in exits.TABLE.items())
    )


def main() -> None:
    """The console script."""
    cli()
