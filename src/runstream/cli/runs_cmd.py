"""`runstream runs ...` and `runstream versions`: find runs without asking the engine.

Each command first catches the namespace's runs read model (`projections.runs`, in the
cache directory) up with ``<ns>.lifecycle``; the first time on a machine that is one pass
over the topic. ``history`` reads the run's journal partition; ``tail`` follows the
lifecycle topic from its end. ``--json`` prints one JSON document (``tail``: one line per
event) on stdout; warnings and the progress bar go to stderr.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from runstream.cli import options
from runstream.cli.options import namespace
from runstream.engine import blobs
from runstream.errors import DecodeError, RunNotFound
from runstream.operations import caught_up as model_caught_up
from runstream.operations import journal, no_namespace, plain, reader, took
from runstream.operations import model_path as model_path  # where it was: tests import it
from runstream.projections.runs import CatchUp, RunQuery, RunRow, RunsModel, shown_text
from runstream.schemas.codec import Codec
from runstream.schemas.records import LifecycleEvent, Record, Status
from runstream.settings import Settings
from runstream.topics import lifecycle_wire
from runstream.topics.blobstore import blob_store
from runstream.topics.spec import Topics

#: Show a progress bar when a catch-up has more lifecycle records than this to read.
PROGRESS_FROM = 3000

as_json = options.json_output
cache = click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the runs read model is kept (default: the runstream cache directory).",
)


@contextmanager
def caught_up(
    ns: str, bootstrap: str | None, base: Path | None
) -> Iterator[tuple[RunsModel, CatchUp | None]]:
    """The namespace's runs model, caught up with its lifecycle topic (None: another
    process holds the model; it is used as last written), with a progress bar and
    warnings on stderr."""
    settings = Settings().with_bootstrap(bootstrap)
    bar = _ProgressBar()
    try:
        with model_caught_up(ns, settings, base, bar, _warn) as found:
            bar.stop()  # before the answer is printed
            yield found
    finally:
        bar.stop()


class _ProgressBar:
    """A progress bar on stderr, shown only on a terminal for a long catch-up."""

    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._progress is None:
            console = Console(stderr=True)
            if total < PROGRESS_FROM or not console.is_terminal:
                return
            self._progress = Progress(console=console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task("reading lifecycle events", total=total)
        self._progress.update(self._task, completed=done)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


@click.group()
def runs() -> None:
    """Find runs and read their timelines (from the lifecycle topic, not the engine)."""


@runs.command("list")
@namespace
@options.bootstrap
@click.option("--status", type=click.Choice([s.value for s in Status]), default=None)
@click.option("--workflow", default=None)
@click.option(
    "--version", "version_", default=None, help="Workflow version (with or without --workflow)."
)
@options.tags("Repeatable: all must match.")
@click.option(
    "--since", default=None, help="Started within this long (1h, 30m, 2d) or since a UTC time."
)
@click.option("--until", default=None, help="Started before this long ago, or this UTC time.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1))
@click.option(
    "--after", default=None, help="Continue a listing: the position the previous page ended at."
)
@cache
@as_json
def list_runs(
    namespace: str,
    bootstrap: str | None,
    status: str | None,
    workflow: str | None,
    version_: str | None,
    tags: dict[str, str],
    since: str | None,
    until: str | None,
    limit: int,
    after: str | None,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Runs of NAMESPACE, newest first, filtered by status, workflow, version, tag, time."""
    query = RunQuery(
        status=status,
        workflow=workflow,
        version=version_,
        tags=tags,
        since_ms=options.time_ms(since, "--since"),
        until_ms=options.time_ms(until, "--until"),
    )
    with caught_up(namespace, bootstrap, cache_dir) as (model, done):
        try:
            page = model.find(query, limit, after)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--after") from None
        total = model.count(query)
        partial = model.partial
    if as_json:
        out = {
            "namespace": namespace,
            "count": total,
            "runs": [r.to_dict() for r in page.runs],
            "after": page.after,
            "read": done.read if done else 0,
            "partial": partial,
        }
        click.echo(json.dumps(out, indent=2))
        return
    table = Table("run", "workflow", "version", "status", "started", "took", "steps", "tags")
    for r in page.runs:
        table.add_row(
            r.run_id,
            r.workflow,
            r.version,
            r.status,
            _when(r.started_at_ms),
            took(r.duration_ms),
            str(r.steps),
            " ".join(f"{k}={v}" for k, v in sorted(r.tags.items())),
        )
    Console().print(table)
    click.echo(
        f"{len(page.runs)} of {total:,} runs"
        + (f"; next page: --after {page.after}" if page.after else "")
    )


@runs.command("show")
@click.argument("run_id")
@namespace
@options.bootstrap
@cache
@as_json
def show(
    run_id: str, namespace: str, bootstrap: str | None, cache_dir: Path | None, as_json: bool
) -> None:
    """RUN_ID's status, workflow, input, output or error, timings and timeline."""
    # large payloads: their value, read through the namespace's blobs topic (this command's)
    with blobs.active(blob_store(namespace, Settings().with_bootstrap(bootstrap))):
        _show(run_id, namespace, bootstrap, cache_dir, as_json)


def _show(
    run_id: str, namespace: str, bootstrap: str | None, cache_dir: Path | None, as_json: bool
) -> None:
    with caught_up(namespace, bootstrap, cache_dir) as (model, _):
        row, events = model.get(run_id), model.events(run_id)
    if row is None:
        raise RunNotFound(
            f"no run {run_id!r} in {namespace}.lifecycle (a run quiet for longer than the "
            f"topic's retention is not there: ask its engine with `runstream get {run_id} "
            f"-n {namespace}`)"
        )
    timeline = [(ev, ev.at_ms - prev.at_ms if prev else 0) for prev, ev in _pairs(events)]
    if as_json:
        out = {
            "run": row.to_dict(),
            "timeline": [{**plain(ev), "since_previous_ms": d} for ev, d in timeline],
        }
        click.echo(json.dumps(out, indent=2))
        return
    for label, value in _summary(row):
        click.echo(f"{label:<10} {value}")
    table = Table("at", "+", "event", "status", "detail", title="timeline")
    for ev, since in timeline:
        table.add_row(_when(ev.at_ms, precise=True), took(since), ev.type, ev.status, _detail(ev))
    Console().print(table)


@runs.command("history")
@click.argument("run_id")
@namespace
@options.bootstrap
@cache
@as_json
def history(
    run_id: str, namespace: str, bootstrap: str | None, cache_dir: Path | None, as_json: bool
) -> None:
    """RUN_ID's journal facts, decoded, in order (read from its journal partition)."""
    settings = Settings().with_bootstrap(bootstrap)
    facts = journal(run_id, namespace, settings, cache_dir)
    if not facts:
        raise RunNotFound(f"no run {run_id!r} in {namespace}.journal")
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "facts": [plain(f) for f in facts]}, indent=2))
        return
    table = Table("at", "+", "fact", "seq", "detail")
    prev_ms = None
    for f in facts:
        at = getattr(f, "at_ms", 0)
        seq = getattr(f, "seq", None)
        table.add_row(
            _when(at, precise=True),
            took(at - prev_ms if prev_ms else 0),
            f.AVRO,
            "" if seq is None else str(seq),
            _fact_detail(f),
        )
        prev_ms = at
    Console().print(table)


@runs.command("tail")
@namespace
@options.bootstrap
@click.option("--workflow", default=None)
@click.option("--status", type=click.Choice([s.value for s in Status]), default=None)
@click.option("--limit", type=click.IntRange(1), default=None, help="Stop after this many events.")
@as_json
def tail(
    namespace: str,
    bootstrap: str | None,
    workflow: str | None,
    status: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Print NAMESPACE's lifecycle events as they happen (Ctrl-C stops; --json: JSON lines)."""
    settings = Settings().with_bootstrap(bootstrap)
    topic = Topics(namespace).lifecycle
    source = reader(settings, topic)
    codec, shown = Codec.default(), 0
    try:
        layout = source.layout()
        if layout is None:
            raise no_namespace(namespace, settings, topic)
        start = {p: high for p, (_, high) in layout.bounds.items()}
        for records, _ in source.read(start, follow=True):
            for rec in records:
                try:
                    ev = lifecycle_wire.decode(codec, rec.value)
                except DecodeError:
                    continue
                if not isinstance(ev, LifecycleEvent):
                    continue
                if (workflow and ev.workflow != workflow) or (status and ev.status != status):
                    continue
                if as_json:
                    click.echo(json.dumps(plain(ev)))
                else:
                    click.echo(_line(ev))
                shown += 1
                if limit is not None and shown >= limit:
                    return
    except KeyboardInterrupt:
        pass
    finally:
        source.close()


@click.command()
@namespace
@options.bootstrap
@cache
@as_json
def versions(namespace: str, bootstrap: str | None, cache_dir: Path | None, as_json: bool) -> None:
    """Per workflow and version, how many runs are still open: a version with none open
    can be retired (taken out of the deployed code)."""
    with caught_up(namespace, bootstrap, cache_dir) as (model, _):
        counts, partial = model.versions(), model.partial
    if as_json:
        rows = [
            {
                "workflow": v.workflow,
                "version": v.version,
                "open": v.open,
                "total": v.total,
                "statuses": v.statuses,
            }
            for v in counts
        ]
        click.echo(
            json.dumps({"namespace": namespace, "versions": rows, "partial": partial}, indent=2)
        )
        return
    table = Table("workflow", "version", "open", "total", "by status", "can retire")
    for v in counts:
        by = ", ".join(f"{s}={n}" for s, n in sorted(v.statuses.items()))
        table.add_row(
            v.workflow, v.version, str(v.open), str(v.total), by, "no" if v.open else "yes"
        )
    Console().print(table)


# -- helpers ------------------------------------------------------------------------------


def _pairs(events: list[LifecycleEvent]) -> Iterator[tuple[LifecycleEvent | None, LifecycleEvent]]:
    prev = None
    for ev in events:
        yield prev, ev
        prev = ev


def _summary(row: RunRow) -> Iterator[tuple[str, str]]:
    yield "run", row.run_id
    yield (
        "status",
        row.status + (f" ({row.reason})" if row.reason and row.status != "completed" else ""),
    )
    yield "workflow", f"{row.workflow} version {row.version}"
    if row.tags:
        yield "tags", " ".join(f"{k}={v}" for k, v in sorted(row.tags.items()))
    yield "started", _when(row.started_at_ms, precise=True)
    if row.ended_at_ms is not None:
        yield "ended", f"{_when(row.ended_at_ms, precise=True)} (took {took(row.duration_ms)})"
    else:
        yield "updated", _when(row.updated_at_ms, precise=True)
    yield "steps", f"{row.steps} completed"
    yield "input", shown_text(row.input) or "(not in the lifecycle stream)"
    if row.output is not None:
        yield "output", shown_text(row.output) or ""
    if row.error is not None:
        yield "error", row.error
    if row.continued_as:
        yield "continued", f"as {row.continued_as}"
    if row.purged_at_ms is not None:  # snapshots.py: finished_retention
        yield "purged", f"{_when(row.purged_at_ms)} (past finished_retention; journal keeps it)"


def _line(ev: LifecycleEvent) -> str:
    at = _when(ev.at_ms, precise=True)
    what = f"{ev.type:<16} {ev.status:<12} {ev.workflow}@{ev.version}"
    return f"{at}  {ev.run_id}  {what}  {_detail(ev)}".rstrip()


def _detail(ev: LifecycleEvent) -> str:
    parts = []
    if ev.step is not None:
        parts.append(f"{ev.step} #{ev.seq} attempt {ev.attempt}")
    if ev.duration_ms is not None:
        parts.append(f"took {took(ev.duration_ms)}")
    if ev.key is not None:  # run.event_set: the key and its new value
        parts.append(f"{ev.key} = {(ev.output or b'null').decode(errors='replace')}")
    parts += [x for x in (ev.error, ev.reason) if x]
    return "; ".join(parts)


def _fact_detail(fact: Record) -> str:
    fields = plain(fact)
    skip = {"type", "run_id", "at_ms", "seq", "traceback", "reply_to", "request_id"}
    return ", ".join(
        f"{k}={json.dumps(v)}"
        for k, v in fields.items()
        if k not in skip and v not in (None, "", {})
    )


def _when(at_ms: int, precise: bool = False) -> str:
    """Epoch ms as the CLI shows times (`options.iso`); nothing for 0."""
    return (options.iso(at_ms, precise) or "") if at_ms else ""


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)
