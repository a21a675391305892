"""`runstream runs retry|resume` and `runstream cancel` (also `runs cancel`): act on runs,
one by id or many at once.

``cancel --where`` is a durable job (`operations.bulk_cancel`, as
`Client.cancel_where`): killed, the same command resumes it where it stopped.
"""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

import click
from rich.console import Console
from rich.progress import Progress

from runstream.cli import exits, options
from runstream.cli.options import namespace
from runstream.cli.runs_cmd import cache
from runstream.client import Client
from runstream.operations import CancelJob as CancelJob  # where it was: tests import it
from runstream.operations import bulk_cancel
from runstream.schemas.records import Status
from runstream.settings import Settings


@click.command("retry")
@click.argument("run_ids", nargs=-1, required=True)
@namespace
@options.bootstrap
@click.option(
    "--input",
    "input_file",
    type=click.File("r"),
    default=None,
    help="Retry one ended run as a new run with this JSON input instead ('-': stdin).",
)
@click.option("--reason", default="", help="Why, for the run's history.")
@options.json_output
def retry(
    run_ids: tuple[str, ...],
    namespace: str,
    bootstrap: str | None,
    input_file: TextIO | None,
    reason: str,
    as_json: bool,
) -> None:
    """Let failed or dead runs go on from their last completed step: the steps after it
    that failed run again (a completed step never does). Parked runs are tried again.
    With --input, the run is retried as a new run, RUN~N, linked to it both ways."""
    why = reason or "runstream runs retry"
    if input_file is not None:
        if len(run_ids) != 1:
            raise click.UsageError("--input retries one run at a time")
        try:
            new_input = json.load(input_file)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
        with Client(namespace, bootstrap) as client:
            new = client.retry(run_ids[0], input=new_input, reason=why)
        doc = {"runs": [run_ids[0]], "new_run_id": new}
        options.emit(as_json, doc, f"retry of {run_ids[0]} as new run {new} sent")
        return
    with Client(namespace, bootstrap) as client:
        for run_id in run_ids:
            client.retry(run_id, reason=why)
    text = f"retry sent for {len(run_ids)} run(s); follow with `runstream runs show`"
    options.emit(as_json, {"runs": list(run_ids)}, text)


@click.command("resume")
@click.argument("run_ids", nargs=-1, required=True)
@namespace
@options.bootstrap
@options.json_output
def resume(run_ids: tuple[str, ...], namespace: str, bootstrap: str | None, as_json: bool) -> None:
    """Try parked runs again now (their code or version may be back)."""
    with Client(namespace, bootstrap) as client:
        for run_id in run_ids:
            client.retry(run_id, reason="runstream runs resume")
    options.emit(as_json, {"runs": list(run_ids)}, f"resume sent for {len(run_ids)} run(s)")


@click.command("cancel")
@click.argument("run_ids", nargs=-1)
@click.option("--where", default=None, help=options.WHERE + " A job that survives being killed.")
@namespace
@options.bootstrap
@click.option("--compensate", is_flag=True, help="Run each run's compensations first.")
@click.option("--reason", default="", help="Why, for the runs' history.")
@click.option(
    "--dry-run", is_flag=True, help="With --where: only say which runs would be cancelled."
)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --where: at most this many cancels per second.")  # fmt: skip
@options.wait_option(120.0, "the runs to end once every cancel is sent (with --where)")
@cache
@options.json_output
def cancel(
    run_ids: tuple[str, ...],
    where: str | None,
    namespace: str,
    bootstrap: str | None,
    compensate: bool,
    reason: str,
    dry_run: bool,
    rate: float | None,
    wait: float,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Cancel RUN_IDS, or every run matching --where. The --where form is a job that
    survives being killed: run the same command again and it goes on where it stopped;
    it exits 1 if runs have not ended within --wait."""
    if bool(run_ids) == (where is not None):
        raise click.UsageError("name the runs, or select them with --where (not both)")
    if run_ids:
        if dry_run or rate is not None:
            raise click.UsageError("--dry-run and --rate go with --where")
        with Client(namespace, bootstrap) as client:
            for run_id in run_ids:
                client.cancel(run_id, compensate=compensate, reason=reason)
        options.emit(as_json, {"runs": list(run_ids)}, None)
        return
    assert where is not None
    conditions = parse_where(where)
    say = _Say(as_json)
    with ExitStack() as stack, _bar(as_json) as bar:
        task: Any = None

        def progress(job: CancelJob, job_file: Path) -> None:
            nonlocal task
            if task is None:
                say.line(f"bulk cancel of {len(job.runs)} runs ({job.sent} sent); job {job_file}")
                task = bar.add_task("cancelling", total=len(job.runs))
            bar.update(task, completed=job.sent)

        try:
            report = bulk_cancel(
                namespace,
                Settings().with_bootstrap(bootstrap),
                lambda: stack.enter_context(Client(namespace, bootstrap)),
                conditions,
                compensate=compensate,
                reason=reason or f"runstream cancel --where {where}",
                rate=rate,
                timeout=wait,
                dry_run=dry_run,
                base=cache_dir,
                progress=progress,
            )
        except ValueError as exc:  # an unfinished job made with other options
            raise click.UsageError(str(exc)) from None
    if report.dry_run:
        runs = report.runs
        say.done({"dry_run": True, "where": conditions, "runs": runs},
                 f"{len(runs)} runs to cancel ({where}): {' '.join(runs[:20])}"
                 + (" ..." if len(runs) > 20 else ""))  # fmt: skip
        return
    by_status, still_open = report.by_status, report.open
    summary = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    doc = {"where": conditions, "runs": len(report.runs), "statuses": by_status}
    say.done(
        {**doc, "open": still_open},
        f"{len(report.runs)} runs: {summary}"
        + (f"; {len(still_open)} not ended yet: run the command again" if still_open else ""),
    )
    if still_open:
        sys.exit(exits.NO)


def parse_where(text: str, keyed: bool = False) -> dict[str, str]:
    """``--where``'s conditions; ``keyed``: ``key=K`` too (a limit's concurrency key)."""
    out: dict[str, str] = {}
    names = ("status", "workflow", "version", *(("key",) if keyed else ()))
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value or not (key in names or
                                         (key.startswith("tag.") and len(key) > 4)):  # fmt: skip
            use = "status=S, workflow=W, version=V" + (", key=K" if keyed else "")
            raise click.BadParameter(f"{part!r}: use {use} or tag.K=V", param_hint="--where")
        if key == "status" and value not in {s.value for s in Status}:
            raise click.BadParameter(f"no status {value!r}", param_hint="--where")
        out[key] = value
    if not out:
        raise click.BadParameter("name at least one condition", param_hint="--where")
    return out


class _Say:
    """Lines on stderr as the job goes; the result on stdout (JSON with ``--json``)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def line(self, text: str) -> None:
        click.echo(text, err=True)

    def done(self, doc: object, text: str) -> None:
        options.emit(self.as_json, doc, text)


def _bar(as_json: bool) -> Progress:
    console = Console(stderr=True)
    return Progress(console=console, transient=True, disable=as_json or not console.is_terminal)
