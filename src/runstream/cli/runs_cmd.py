"""`runstream runs ...` and `runstream versions`: find runs without asking the engine.

Each command first catches the namespace's runs read model (`projections.runs`, in the
cache directory) up with ``<ns>.lifecycle``; the first time on a machine that is one pass
over the topic. ``history`` reads the run's journal partition; ``tail`` follows the
lifecycle topic from its end. ``--json`` prints one JSON document (``tail``: one line per
event) on stdout; warnings and the progress bar go to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from runstream.cli import options
from runstream.cli.options import namespace
from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.engine.workflow import seconds
from runstream.errors import DecodeError, RunNotFound, TopicError
from runstream.projections.runs import CatchUp, RunQuery, RunRow, RunsModel
from runstream.schemas.codec import Codec
from runstream.schemas.records import END_FACTS, LifecycleEvent, Record, Status
from runstream.settings import Settings, cache_dir
from runstream.topics.admin import client_config
from runstream.topics.catchup import PartitionReader
from runstream.topics.spec import Topics

#: Show a progress bar when a catch-up has more lifecycle records than this to read.
PROGRESS_FROM = 3000
#: How far before a run's first lifecycle event its journal records may lie (clock skew).
_HISTORY_SLACK_MS = 5 * 60 * 1000

as_json = click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts).")
cache = click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the runs read model is kept (default: the runstream cache directory).",
)


def model_path(base: Path | None, bootstrap: str, ns: str) -> Path:
    """The model's directory: one per cluster and namespace."""
    cluster = re.sub(r"[^A-Za-z0-9.-]+", "_", bootstrap)[:120]
    return (base or cache_dir() / "runs") / cluster / ns


def _reader(settings: Settings, topic: str) -> PartitionReader:
    config = client_config(settings.bootstrap(), settings.kafka)
    return PartitionReader(config, topic, settings.connect_timeout)


def _no_namespace(ns: str, settings: Settings, topic: str) -> TopicError:
    return TopicError(
        f"no topic {topic} at {settings.bootstrap()}: is {ns!r} the namespace (-n or "
        f"RUNSTREAM_NAMESPACE) and the broker (--bootstrap) right?"
    )


@contextmanager
def caught_up(
    ns: str, bootstrap: str | None, base: Path | None
) -> Iterator[tuple[RunsModel, CatchUp | None]]:
    """The namespace's runs model, caught up with its lifecycle topic (None: another
    process holds the model; it is used as last written)."""
    settings = Settings().with_bootstrap(bootstrap)
    topic = Topics(ns).lifecycle
    reader = _reader(settings, topic)
    path = model_path(base, settings.bootstrap(), ns)
    try:
        try:
            model = RunsModel(path)
        except Exception as exc:  # rocksdict says only "IO error: ... lock file ..."
            if "lock" not in str(exc).lower():
                raise
            model = RunsModel(path, read_only=True)
        try:
            done = None
            if model.read_only:
                _warn(f"another process is updating {path}; showing it as last written")
                if reader.layout() is None:
                    raise _no_namespace(ns, settings, topic)
            else:
                with _ProgressBar() as bar:
                    try:
                        done = model.catch_up(reader, bar)
                    except LookupError:
                        raise _no_namespace(ns, settings, topic) from None
            if model.partial:
                _warn(
                    f"{topic} had dropped old events (retention) before this cache first read "
                    "it: runs quiet since then are missing"
                )
            yield model, done
        finally:
            model.close()
    finally:
        reader.close()


class _ProgressBar:
    """A progress bar on stderr, shown only on a terminal for a long catch-up."""

    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> _ProgressBar:
        return self

    def __call__(self, done: int, total: int) -> None:
        if self._progress is None:
            console = Console(stderr=True)
            if total < PROGRESS_FROM or not console.is_terminal:
                return
            self._progress = Progress(console=console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task("reading lifecycle events", total=total)
        self._progress.update(self._task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


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
@click.option(
    "--tag", "tags", multiple=True, metavar="KEY=VALUE", help="Repeatable: all must match."
)
@click.option(
    "--since", default=None, help="Started within this long (1h, 30m, 2d) or since a date."
)
@click.option("--until", default=None, help="Started before this long ago, or this date.")
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
    tags: tuple[str, ...],
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
        tags=_tags(tags),
        since_ms=_time(since, "--since"),
        until_ms=_time(until, "--until"),
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
            _took(r.duration_ms),
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
            "timeline": [{**_plain(ev), "since_previous_ms": d} for ev, d in timeline],
        }
        click.echo(json.dumps(out, indent=2))
        return
    for label, value in _summary(row):
        click.echo(f"{label:<10} {value}")
    table = Table("at", "+", "event", "status", "detail", title="timeline")
    for ev, since in timeline:
        table.add_row(_when(ev.at_ms, precise=True), _took(since), ev.type, ev.status, _detail(ev))
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
    facts = _journal(
        run_id, namespace, settings, model_path(cache_dir, settings.bootstrap(), namespace)
    )
    if not facts:
        raise RunNotFound(f"no run {run_id!r} in {namespace}.journal")
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "facts": [_plain(f) for f in facts]}, indent=2))
        return
    table = Table("at", "+", "fact", "seq", "detail")
    prev_ms = None
    for f in facts:
        at = getattr(f, "at_ms", 0)
        seq = getattr(f, "seq", None)
        table.add_row(
            _when(at, precise=True),
            _took(at - prev_ms if prev_ms else 0),
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
    reader = _reader(settings, topic)
    codec, shown = Codec.default(), 0
    try:
        layout = reader.layout()
        if layout is None:
            raise _no_namespace(namespace, settings, topic)
        start = {p: high for p, (_, high) in layout.bounds.items()}
        for records, _ in reader.read(start, follow=True):
            for rec in records:
                try:
                    ev = codec.decode(rec.value)
                except DecodeError:
                    continue
                if not isinstance(ev, LifecycleEvent):
                    continue
                if (workflow and ev.workflow != workflow) or (status and ev.status != status):
                    continue
                if as_json:
                    click.echo(json.dumps(_plain(ev)))
                else:
                    click.echo(_line(ev))
                shown += 1
                if limit is not None and shown >= limit:
                    return
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()


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


def _journal(run_id: str, ns: str, settings: Settings, path: Path) -> list[Record]:
    """The run's facts, read from its journal partition: from a little before its first
    lifecycle event when the cache knows it, else from the start; up to its end fact."""
    reader = _reader(settings, Topics(ns).journal)
    codec, key, facts = Codec.default(), run_id.encode(), []
    try:
        layout = reader.layout()
        if layout is None:
            raise _no_namespace(ns, settings, Topics(ns).journal)
        p = partition_for(key, len(layout.bounds))
        start = layout.bounds[p][0]
        first_ms = _first_seen(path, run_id)
        if first_ms is not None:
            start = reader.offset_at(p, first_ms - _HISTORY_SLACK_MS) or start
        for records, _ in reader.read({p: start}):
            for rec in records:
                if rec.key != key:
                    continue
                try:
                    fact = codec.decode(rec.value)
                except DecodeError:
                    continue
                facts.append(fact)
                if type(fact) in END_FACTS:  # nothing follows a run's end
                    return facts
    finally:
        reader.close()
    return facts


def _first_seen(path: Path, run_id: str) -> int | None:
    """When the cached runs model first saw ``run_id`` (no catch-up); None if it did not."""
    if not path.exists():
        return None
    try:
        model = RunsModel(path, read_only=True)
    except Exception:  # no model there yet, or one being created
        return None
    try:
        events = model.events(run_id)
        return events[0].at_ms if events else None
    finally:
        model.close()


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
        yield "ended", f"{_when(row.ended_at_ms, precise=True)} (took {_took(row.duration_ms)})"
    else:
        yield "updated", _when(row.updated_at_ms, precise=True)
    yield "steps", f"{row.steps} completed"
    yield "input", row.input if row.input is not None else "(not in the lifecycle stream)"
    if row.output is not None:
        yield "output", row.output
    if row.error is not None:
        yield "error", row.error
    if row.continued_as:
        yield "continued", f"as {row.continued_as}"


def _line(ev: LifecycleEvent) -> str:
    at = _when(ev.at_ms, precise=True)
    what = f"{ev.type:<16} {ev.status:<12} {ev.workflow}@{ev.version}"
    return f"{at}  {ev.run_id}  {what}  {_detail(ev)}".rstrip()


def _detail(ev: LifecycleEvent) -> str:
    parts = []
    if ev.step is not None:
        parts.append(f"{ev.step} #{ev.seq} attempt {ev.attempt}")
    if ev.duration_ms is not None:
        parts.append(f"took {_took(ev.duration_ms)}")
    parts += [x for x in (ev.error, ev.reason) if x]
    return "; ".join(parts)


def _fact_detail(fact: Record) -> str:
    fields = _plain(fact)
    skip = {"type", "run_id", "at_ms", "seq", "traceback", "reply_to", "request_id"}
    return ", ".join(
        f"{k}={json.dumps(v)}"
        for k, v in fields.items()
        if k not in skip and v not in (None, "", {})
    )


def _plain(record: Record) -> dict[str, Any]:
    """A record as JSON data: ``type`` first, payload bytes as the JSON they hold."""
    out: dict[str, Any] = {"type": getattr(record, "type", record.AVRO)}
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        out[f.name] = _bytes_value(value) if isinstance(value, bytes) else value
    return out


def _bytes_value(data: bytes) -> Any:
    try:
        return payload.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def _tags(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--tag")
        out[key] = value
    return out


def _time(value: str | None, option: str) -> int | None:
    """``1h`` (that long ago) or an ISO date/time (local unless it names a zone) -> epoch ms."""
    if value is None:
        return None
    try:
        return int((time.time() - seconds(value)) * 1000)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(value).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration (30m, 1h, 2d) nor a date (2025-01-31T12:00)",
            param_hint=option,
        ) from None


def _when(at_ms: int, precise: bool = False) -> str:
    """Epoch ms as local time; ``precise`` adds the milliseconds."""
    if not at_ms:
        return ""
    text = datetime.fromtimestamp(at_ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")
    return text[:-3] if precise else text[:-7]


def _took(ms: int | None) -> str:
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{ms // 60_000}m{ms % 60_000 // 1000:02d}s"
    return f"{ms // 3_600_000}h{ms % 3_600_000 // 60_000:02d}m"


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)
