"""`runstream runs retry|resume|cancel`: act on runs, one by id or many at once.

``runs cancel --where`` is a durable job. It selects the matching runs from the runs read
model once, writes that list and the options that shape the job to a job file beside the
model, then sends the cancels in chunks, appending to the file after each chunk Kafka
acknowledged how far it got. Killed, the same command resumes the job where it stopped
(with other options it refuses); a cancel sent twice is harmless, because the engine ends
a run once (a cancel of a finished run changes nothing). Once every cancel is sent the
job is over: its file is renamed ``...done.jsonl``, and the same command later is a new
job that selects again. It then waits for the read model to show the runs finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import click
from rich.console import Console
from rich.progress import Progress

from runstream.cli import options
from runstream.cli.options import namespace
from runstream.cli.runs_cmd import as_json, cache, caught_up, model_path
from runstream.client import Client
from runstream.projections.runs import RunQuery, RunsModel
from runstream.schemas.records import TERMINAL, Status
from runstream.settings import Settings

#: Cancels produced before the job file records progress.
CHUNK = 100


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
def retry(
    run_ids: tuple[str, ...],
    namespace: str,
    bootstrap: str | None,
    input_file: TextIO | None,
    reason: str,
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
        click.echo(f"retry of {run_ids[0]} as new run {new} sent")
        return
    with Client(namespace, bootstrap) as client:
        for run_id in run_ids:
            client.retry(run_id, reason=why)
    click.echo(f"retry sent for {len(run_ids)} run(s); follow with `runstream runs show`")


@click.command("resume")
@click.argument("run_ids", nargs=-1, required=True)
@namespace
@options.bootstrap
def resume(run_ids: tuple[str, ...], namespace: str, bootstrap: str | None) -> None:
    """Try parked runs again now (their code or version may be back)."""
    with Client(namespace, bootstrap) as client:
        for run_id in run_ids:
            client.retry(run_id, reason="runstream runs resume")
    click.echo(f"resume sent for {len(run_ids)} run(s)")


@dataclass
class CancelJob:
    """A bulk cancel: the runs it selected, the options that shape it, and how many of
    the runs were sent a cancel.

    Its file is JSON lines: the job without ``sent`` first, then ``{"sent": N}`` appended
    as the cancels go (a line torn by a kill counts for nothing).
    """

    where: dict[str, str]
    runs: list[str]
    compensate: bool = False
    reason: str = ""
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    sent: int = 0

    @staticmethod
    def path(jobs: Path, where: dict[str, str]) -> Path:
        """The file of the unfinished job for ``where``."""
        digest = hashlib.sha256(json.dumps(where, sort_keys=True).encode()).hexdigest()
        return jobs / f"cancel-{digest[:12]}.jsonl"

    @classmethod
    def load(cls, path: Path) -> CancelJob | None:
        try:
            first, *progress = path.read_text().splitlines()
        except FileNotFoundError:
            return None
        job = cls(**json.loads(first))
        for line in progress:
            with contextlib.suppress(ValueError):
                job.sent = json.loads(line)["sent"]
        return job

    def create(self, path: Path) -> None:
        """Write the job atomically: a kill leaves no file or the whole job."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        head = {k: v for k, v in asdict(self).items() if k != "sent"}
        tmp.write_text(json.dumps(head) + "\n")
        os.replace(tmp, path)

    def advance(self, path: Path, n: int) -> None:
        """Record that ``n`` more cancels were sent."""
        self.sent += n
        with path.open("a") as f:
            f.write(json.dumps({"sent": self.sent}) + "\n")

    def finish(self, path: Path) -> Path:
        """Close the job: every cancel is sent, nothing is left to resume."""
        done = path.with_name(f"{path.stem}-{self.created_ms}.done.jsonl")
        os.replace(path, done)
        return done

    def refusal(self, compensate: bool) -> str | None:
        """Why a command with these options may not resume this job (None: it may)."""
        if compensate == self.compensate:
            return None
        made = "with" if self.compensate else "without"
        return (
            f"an unfinished bulk cancel ({self.sent} of {len(self.runs)} sent) was made {made} "
            f"--compensate: run the same command {made} --compensate to finish it"
        )


@click.command("cancel")
@click.option(
    "--where",
    required=True,
    help="Which runs: comma-separated status=S, workflow=W, version=V, tag.K=V.",
)
@namespace
@options.bootstrap
@click.option("--dry-run", is_flag=True, help="Only say which runs would be cancelled.")
@click.option("--compensate", is_flag=True, help="Run each run's compensations first.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="At most this many cancels per second.")  # fmt: skip
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds to wait for the runs to end once every cancel is sent.")  # fmt: skip
@cache
@as_json
def cancel_where(
    where: str,
    namespace: str,
    bootstrap: str | None,
    dry_run: bool,
    compensate: bool,
    rate: float | None,
    timeout: float,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Cancel every run matching --where, as a job that survives being killed: run the
    same command again and it goes on where it stopped."""
    conditions = _where(where)
    settings = Settings().with_bootstrap(bootstrap)
    model_dir = model_path(cache_dir, settings.bootstrap(), namespace)
    job_file = CancelJob.path(model_dir.with_name(f"{namespace}.jobs"), conditions)
    job = CancelJob.load(job_file)
    say = _Say(as_json)
    if job is None:
        with caught_up(namespace, bootstrap, cache_dir) as (model, _):
            selected = _select(model, conditions)
        if dry_run:
            say.done({"dry_run": True, "where": conditions, "runs": selected},
                     f"{len(selected)} runs match {where}: {' '.join(selected[:20])}"
                     + (" ..." if len(selected) > 20 else ""))  # fmt: skip
            return
        reason = f"runstream runs cancel --where {where}"
        job = CancelJob(conditions, selected, compensate, reason)
        job.create(job_file)
        say.line(f"bulk cancel of {len(selected)} runs; job file {job_file}")
    else:
        if refused := job.refusal(compensate):
            raise click.UsageError(f"{refused}, or delete {job_file} to start a new one")
        say.line(f"resuming the bulk cancel of {job_file}: {job.sent} of {len(job.runs)} sent")
        if dry_run:
            say.done({"dry_run": True, "where": conditions, "runs": job.runs[job.sent :]},
                     f"{len(job.runs) - job.sent} runs left to cancel")  # fmt: skip
            return
    with Client(namespace, bootstrap) as client, _bar(as_json, len(job.runs)) as bar:
        began, bar_task = time.monotonic(), bar.add_task("cancelling", total=len(job.runs))
        bar.update(bar_task, completed=job.sent)
        size = min(CHUNK, max(1, int(rate))) if rate else CHUNK  # about a second's worth
        while job.sent < len(job.runs):
            chunk = job.runs[job.sent : job.sent + size]
            for run_id in chunk:
                client.cancel(run_id, compensate=job.compensate, reason=job.reason, wait=False)
            client.flush()  # Kafka has them: only now does the job move on
            job.advance(job_file, len(chunk))
            bar.update(bar_task, completed=job.sent)
            if rate:  # hold the pace: sent so far / rate seconds since we began
                time.sleep(max(0.0, len(chunk) / rate - (time.monotonic() - began)))
                began = time.monotonic()
    job.finish(job_file)
    statuses = _wait_ended(namespace, bootstrap, cache_dir, job.runs, timeout)
    by_status: dict[str, int] = {}
    for status in statuses.values():
        by_status[status] = by_status.get(status, 0) + 1
    open_runs = [r for r, s in statuses.items() if s not in TERMINAL]
    summary = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    say.done(
        {"where": conditions, "runs": len(job.runs), "statuses": by_status, "open": open_runs},
        f"{len(job.runs)} runs: {summary}"
        + (f"; {len(open_runs)} not ended yet: run the command again" if open_runs else ""),
    )
    if open_runs:
        raise SystemExit(1)


def _where(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value or not (key in ("status", "workflow", "version") or
                                         (key.startswith("tag.") and len(key) > 4)):  # fmt: skip
            raise click.BadParameter(
                f"{part!r}: use status=S, workflow=W, version=V or tag.K=V", param_hint="--where"
            )
        if key == "status" and value not in {s.value for s in Status}:
            raise click.BadParameter(f"no status {value!r}", param_hint="--where")
        out[key] = value
    if not out:
        raise click.BadParameter("name at least one condition", param_hint="--where")
    return out


def _select(model: RunsModel, where: dict[str, str]) -> list[str]:
    """Every run matching ``where`` now, newest first."""
    query = RunQuery(
        status=where.get("status"),
        workflow=where.get("workflow"),
        version=where.get("version"),
        tags={k[4:]: v for k, v in where.items() if k.startswith("tag.")},
    )
    selected: list[str] = []
    after: str | None = None
    while True:
        page = model.find(query, 1000, after)
        selected += [r.run_id for r in page.runs]
        if page.after is None:
            return selected
        after = page.after


def _wait_ended(
    ns: str, bootstrap: str | None, base: Path | None, run_ids: list[str], timeout: float
) -> dict[str, str]:
    """Each run's status once all ended, or as they are after ``timeout`` seconds; a run
    that continued as new has the status of the run that carries it on (its cancel
    followed it there)."""
    deadline = time.monotonic() + timeout
    while True:
        with caught_up(ns, bootstrap, base) as (model, _):
            statuses = {}
            for run_id in run_ids:
                row = model.get(run_id)
                while row is not None and row.status == Status.COMPLETED and row.continued_as:
                    row = model.get(row.continued_as)
                statuses[run_id] = row.status if row else "unknown"
        if all(s in TERMINAL for s in statuses.values()) or time.monotonic() > deadline:
            return statuses
        time.sleep(0.5)


class _Say:
    """Lines on stderr as the job goes; the result on stdout (JSON with ``--json``)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def line(self, text: str) -> None:
        click.echo(text, err=True)

    def done(self, doc: object, text: str) -> None:
        click.echo(json.dumps(doc, indent=2) if self.as_json else text)


def _bar(as_json: bool, total: int) -> Progress:
    console = Console(stderr=True)
    return Progress(console=console, transient=True, disable=as_json or not console.is_terminal)
