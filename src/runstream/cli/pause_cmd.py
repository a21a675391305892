"""`runstream runs pause|unpause`: hold runs still and let them go on, by id or
``--where`` (`Client.pause_where`): a paused run runs no workflow code; what comes
meanwhile is recorded and reaches its code on unpause (docs/guides/pause.md)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import click

from runstream.cli import options
from runstream.cli.options import namespace
from runstream.cli.runs_cmd import as_json, cache
from runstream.cli.runs_ops import parse_where
from runstream.client import Client
from runstream.pausing import bulk, who
from runstream.schemas.records import Status
from runstream.settings import Settings


def _command(unpause: bool) -> click.Command:
    verb = "unpause" if unpause else "pause"

    @click.command(verb)
    @click.argument("run_ids", nargs=-1)
    @click.option(
        "--where",
        default=None,
        help=options.WHERE[:-1] + ", key=K (a workflow's concurrency_key: the journal is read).",
    )
    @namespace
    @options.bootstrap
    @click.option("--reason", default="", help="Why, for the runs' history.")
    @click.option("--dry-run", is_flag=True, help=f"Only say which runs would be sent a {verb}.")
    @cache
    @as_json
    def command(
        run_ids: tuple[str, ...],
        where: str | None,
        namespace: str,
        bootstrap: str | None,
        reason: str,
        dry_run: bool,
        cache_dir: Path | None,
        as_json: bool,
    ) -> None:
        if bool(run_ids) == (where is not None):
            raise click.UsageError("name the runs, or select them with --where (not both)")
        why = reason or f"runstream runs {verb}"
        if run_ids:
            if dry_run:
                raise click.UsageError("--dry-run goes with --where")
            with Client(namespace, bootstrap) as client:
                send = client.unpause if unpause else client.pause
                for run_id in run_ids:
                    send(run_id, reason=why, by=who(), wait=False)
            options.emit(as_json, {"runs": list(run_ids)}, f"{verb} sent for {len(run_ids)} run(s)")
            return
        assert where is not None
        conditions = parse_where(where, keyed=True)
        if unpause:
            status = conditions.setdefault("status", Status.PAUSED.value)
            if status != Status.PAUSED:
                raise click.BadParameter("only paused runs can be unpaused", param_hint="--where")
        with ExitStack() as stack:
            report = bulk(
                namespace,
                Settings().with_bootstrap(bootstrap),
                lambda: stack.enter_context(Client(namespace, bootstrap)),
                conditions,
                unpause=unpause,
                reason=why,
                by=who(),
                dry_run=dry_run,
                base=cache_dir,
            )
        runs = report.runs
        listed = " ".join(runs[:20]) + (" ..." if len(runs) > 20 else "")
        text = (
            f"{len(runs)} runs to {verb} ({where}): {listed}"
            if dry_run
            else f"{verb} sent for {len(runs)} runs ({where})"
        )
        options.emit(as_json, {"dry_run": dry_run, "where": conditions, "runs": runs}, text)

    command.help = (
        "Let paused runs go on: their code sees, once, what was recorded while paused."
        if unpause
        else "Pause runs: no workflow code runs until unpaused. Steps in flight finish; "
        "signals, events, promise completions and due timers are recorded and reach the "
        "code on unpause. A cancel and the run timeout still end a paused run."
    )
    return command


pause = _command(unpause=False)
unpause = _command(unpause=True)
