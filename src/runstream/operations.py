"""Operations on many runs, one place for `Client` and the `runstream runs` commands.

The runs read model (`projections.runs`) caught up with ``<ns>.lifecycle``; a run's
journal facts read from its partition; and the durable bulk cancel. ``cancel_where``
selects the matching runs from the model once, writes that list and the options that
shape the job to a job file beside the model, then sends the cancels in chunks,
appending to the file after each chunk Kafka acknowledged how far it got. Stopped, the
same call resumes the job where it stopped (with other options it refuses); a cancel
sent twice is harmless, because the engine ends a run once. Once every cancel is sent
the job is over: its file is renamed ``...done.jsonl``, and the same call later is a new
job that selects again. It then waits for the read model to show the runs ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.engine.workflow import seconds
from runstream.errors import DecodeError, TopicError
from runstream.projections.runs import CLOSED, CatchUp, Progress, RunQuery, RunRow, RunsModel
from runstream.schemas.codec import Codec
from runstream.schemas.records import END_FACTS, TERMINAL, Record, Status
from runstream.settings import Settings, cache_dir
from runstream.topics.admin import client_config
from runstream.topics.catchup import PartitionReader
from runstream.topics.spec import Topics

if TYPE_CHECKING:
    from runstream.client import Client

log = logging.getLogger("runstream.operations")

#: How far before a run's first lifecycle event its journal records may lie (clock skew).
_HISTORY_SLACK_MS = 5 * 60 * 1000
#: Cancels produced before the job file records progress.
CHUNK = 100
#: What a time bound may be: a datetime (naive: local time), how long ago, or text that
#: says either ("1h", "30m", "2d", "2025-01-31T12:00").
When = datetime | timedelta | str


# -- typed results ---------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """A run as the lifecycle stream tells it (`Client.list_runs`)."""

    run_id: str
    workflow: str
    version: str
    status: str
    tags: dict[str, str]
    started_at: datetime | None  # run.started; until then the first event seen
    updated_at: datetime | None
    ended_at: datetime | None
    duration: timedelta | None
    input: Any
    output: Any
    error: str | None
    reason: str | None
    code: str | None
    continued_as: str | None
    steps: int  # completed steps

    @classmethod
    def of(cls, row: RunRow) -> RunSummary:
        """The public form of a read model row."""
        raw = row.to_dict()
        return cls(
            run_id=row.run_id,
            workflow=row.workflow,
            version=row.version,
            status=row.status,
            tags=dict(row.tags),
            started_at=_datetime(row.started_at_ms),
            updated_at=_datetime(row.updated_at_ms),
            ended_at=_datetime(row.ended_at_ms),
            duration=None if row.duration_ms is None else timedelta(milliseconds=row.duration_ms),
            input=raw["input"],
            output=raw["output"],
            error=row.error,
            reason=row.reason,
            code=row.code,
            continued_as=row.continued_as,
            steps=row.steps,
        )


@dataclass(frozen=True)
class RunPage:
    """One page of `Client.list_runs`, newest first.

    ``after`` continues the listing (pass it back as ``after=``; None: the last page);
    ``count`` is how many runs match in all; ``partial``: the lifecycle topic had dropped
    old events (retention) before this machine first read it, so runs quiet since then
    are missing.
    """

    runs: list[RunSummary]
    after: str | None
    count: int
    partial: bool


@dataclass(frozen=True)
class JournalFact:
    """One fact of a run's journal (`Client.history`): its record type, when it was
    written, its sequence number if it has one, and every field (payloads decoded)."""

    type: str
    at: datetime | None
    seq: int | None
    data: dict[str, Any]

    @classmethod
    def of(cls, fact: Record) -> JournalFact:
        """The public form of a decoded journal record."""
        at, seq = _datetime(getattr(fact, "at_ms", 0)), getattr(fact, "seq", None)
        return cls(fact.AVRO, at, seq, plain(fact))


@dataclass(frozen=True)
class CancelReport:
    """What `Client.cancel_where` did: the conditions, the runs its job selected (on a
    dry run: those it would cancel still), and each run's status when it stopped
    waiting (a run that continued as new: its successor's)."""

    where: dict[str, str]
    runs: list[str]
    statuses: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def open(self) -> list[str]:
        """The runs not ended yet (call again to wait for them)."""
        return [r for r, s in self.statuses.items() if s not in TERMINAL]

    @property
    def by_status(self) -> dict[str, int]:
        """How many runs ended in each status."""
        return dict(Counter(self.statuses.values()))


@dataclass(frozen=True)
class RunEvent:
    """A run's event (``ctx.set_event``) as `Client.get_event` reads it from the runs read
    model: its newest value, and where that answer stands on ``<ns>.lifecycle``."""

    run_id: str  # the run that set it: the one asked about, or one carrying it on
    key: str
    value: Any
    seq: int
    set_at: datetime | None
    partition: int  # the lifecycle partition of the run that set it
    offset: int  # where its run.event_set lies in that partition
    as_of: int  # the model had read that partition up to here: the answer reflects every
    # event before this offset (a value set later is not in it)


def run_event(model: RunsModel, run_id: str, key: str) -> tuple[RunEvent | None, RunRow | None]:
    """The newest value of ``key`` set by ``run_id`` or a run that carries it on
    (continue-as-new, retry as a new run), and the last run of that chain the model knows
    (None: not even ``run_id``)."""
    found, row, seen = None, model.get(run_id), {run_id}
    last = row
    while row is not None:
        last = row
        event = model.event(row.run_id, key)
        if event is not None:
            at = _datetime(event.at_ms)
            as_of = model.offsets().get(event.partition, event.offset + 1)
            value = payload.loads(event.value.encode())
            found = RunEvent(
                row.run_id, key, value, event.seq, at, event.partition, event.offset, as_of
            )
        nxt = row.continued_as
        if nxt is None or nxt in seen:
            break
        seen.add(nxt)
        row = model.get(nxt)
    return found, last


def chain_ended(row: RunRow) -> bool:
    """The run ended and no run carries it on (it will set nothing more)."""
    return row.status in CLOSED and row.continued_as is None


# -- the runs read model -----------------------------------------------------------------


def model_path(base: Path | None, bootstrap: str, ns: str) -> Path:
    """The model's directory: one per cluster and namespace."""
    cluster = re.sub(r"[^A-Za-z0-9.-]+", "_", bootstrap)[:120]
    return (base or cache_dir() / "runs") / cluster / ns


def jobs_dir(base: Path | None, bootstrap: str, ns: str) -> Path:
    """Where the bulk cancels' job files are kept: beside the model."""
    return model_path(base, bootstrap, ns).with_name(f"{ns}.jobs")


def reader(settings: Settings, topic: str) -> PartitionReader:
    """A reader of ``topic`` that keeps its own offsets."""
    config = client_config(settings.bootstrap(), settings.kafka)
    return PartitionReader(config, topic, settings.connect_timeout)


def no_namespace(ns: str, settings: Settings, topic: str) -> TopicError:
    return TopicError(
        f"no topic {topic} at {settings.bootstrap()}: is {ns!r} the namespace (-n or "
        f"RUNSTREAM_NAMESPACE) and the broker (--bootstrap) right?"
    )


@contextmanager
def caught_up(
    ns: str,
    settings: Settings,
    base: Path | None,
    progress: Progress | None = None,
    warn: Callable[[str], None] = log.warning,
) -> Iterator[tuple[RunsModel, CatchUp | None]]:
    """The namespace's runs model, caught up with its lifecycle topic (None: another
    process holds the model; it is used as last written)."""
    topic = Topics(ns).lifecycle
    source = reader(settings, topic)
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
                warn(f"another process is updating {path}; showing it as last written")
                if source.layout() is None:
                    raise no_namespace(ns, settings, topic)
            else:
                try:
                    done = model.catch_up(source, progress)
                except LookupError:
                    raise no_namespace(ns, settings, topic) from None
            if model.partial:
                warn(
                    f"{topic} had dropped old events (retention) before this cache first read "
                    "it: runs quiet since then are missing"
                )
            yield model, done
        finally:
            model.close()
    finally:
        source.close()


def time_ms(value: When) -> int:
    """A time bound as epoch ms: a datetime (naive: local time), a timedelta or a
    duration ("1h": that long ago), or an ISO date/time (local unless it names a zone)."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, timedelta):
        return int((time.time() - value.total_seconds()) * 1000)
    try:
        return int((time.time() - seconds(value)) * 1000)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(value).timestamp() * 1000)
    except ValueError:
        raise ValueError(
            f"{value!r} is neither a duration (30m, 1h, 2d) nor a date (2025-01-31T12:00)"
        ) from None


# -- one run's journal -------------------------------------------------------------------


def journal(run_id: str, ns: str, settings: Settings, base: Path | None) -> list[Record]:
    """The run's facts, read from its journal partition: from a little before its first
    lifecycle event when the cached model knows it, else from the start; up to the end
    fact of its last lifecycle event the model knows (a failed run may be retried: an end
    fact is not always its last), else to the partition's end."""
    source = reader(settings, Topics(ns).journal)
    codec, key, facts = Codec.default(), run_id.encode(), []
    try:
        layout = source.layout()
        if layout is None:
            raise no_namespace(ns, settings, Topics(ns).journal)
        p = partition_for(key, len(layout.bounds))
        start = layout.bounds[p][0]
        seen = _seen(model_path(base, settings.bootstrap(), ns), run_id)
        if seen is not None:
            start = source.offset_at(p, seen[0] - _HISTORY_SLACK_MS) or start
        for records, _ in source.read({p: start}):
            for rec in records:
                if rec.key != key:
                    continue
                try:
                    fact = codec.decode(rec.value)
                except DecodeError:
                    continue
                facts.append(fact)
                if type(fact) in END_FACTS and seen and getattr(fact, "at_ms", 0) >= seen[1]:
                    return facts  # its last end the model knows of
    finally:
        source.close()
    return facts


def _seen(path: Path, run_id: str) -> tuple[int, int] | None:
    """When the cached runs model first and last saw ``run_id`` (no catch-up); None if
    it did not."""
    if not path.exists():
        return None
    try:
        model = RunsModel(path, read_only=True)
    except Exception:  # no model there yet, or one being created
        return None
    try:
        events = model.events(run_id)
        return (events[0].at_ms, events[-1].at_ms) if events else None
    finally:
        model.close()


def plain(record: Record) -> dict[str, Any]:
    """A record as JSON data: ``type`` first, payload bytes as the JSON they hold."""
    out: dict[str, Any] = {"type": getattr(record, "type", record.AVRO)}
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        out[f.name] = _bytes_value(value) if isinstance(value, bytes) else value
    return out


def _bytes_value(data: bytes) -> Any:
    try:
        return payload.shown(data)
    except ValueError:
        return data.decode(errors="replace")


# -- the bulk cancel ---------------------------------------------------------------------


def check_status(status: str | None) -> None:
    """Refuse a status no run can have (a typo would match nothing, silently)."""
    if status is not None and status not in {s.value for s in Status}:
        raise ValueError(f"no status {status!r}")


def where_of(
    status: str | None, workflow: str | None, version: str | None, tags: Mapping[str, str]
) -> dict[str, str]:
    """The conditions of a bulk cancel as its job file names them (``tag.K`` for a tag)."""
    check_status(status)
    named = {"status": status, "workflow": workflow, "version": version}
    where = {k: v for k, v in named.items() if v is not None}
    where |= {f"tag.{k}": v for k, v in tags.items()}
    if not where:
        raise ValueError("name at least one condition: status, workflow, version or a tag")
    return where


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


def bulk_cancel(
    ns: str,
    settings: Settings,
    connect: Callable[[], Client],
    where: dict[str, str],
    *,
    compensate: bool,
    reason: str,
    rate: float | None,
    timeout: float,
    dry_run: bool,
    base: Path | None,
    progress: Callable[[CancelJob, Path], None] | None,
) -> CancelReport:
    """The bulk cancel of `Client.cancel_where` and ``runstream runs cancel --where``.
    ``connect`` gives the client that sends the cancels, asked for only once there are
    cancels to send; ``progress`` hears of the job then and after each chunk."""
    job_file = CancelJob.path(jobs_dir(base, settings.bootstrap(), ns), where)
    job = CancelJob.load(job_file)
    if job is None:
        with caught_up(ns, settings, base) as (model, _):
            selected = select(model, where)
        if dry_run:
            return CancelReport(where, selected, dry_run=True)
        job = CancelJob(where, selected, compensate, reason)
        job.create(job_file)
    elif refused := job.refusal(compensate):
        raise ValueError(f"{refused}, or delete {job_file} to start a new one")
    elif dry_run:
        return CancelReport(where, job.runs[job.sent :], dry_run=True)
    client = connect()
    if progress is not None:
        progress(job, job_file)
    began = time.monotonic()
    size = min(CHUNK, max(1, int(rate))) if rate else CHUNK  # about a second's worth
    while job.sent < len(job.runs):
        chunk = job.runs[job.sent : job.sent + size]
        for run_id in chunk:
            client.cancel(run_id, compensate=job.compensate, reason=job.reason, wait=False)
        client.flush()  # Kafka has them: only now does the job move on
        job.advance(job_file, len(chunk))
        if progress is not None:
            progress(job, job_file)
        if rate:  # hold the pace: sent so far / rate seconds since we began
            time.sleep(max(0.0, len(chunk) / rate - (time.monotonic() - began)))
            began = time.monotonic()
    job.finish(job_file)
    statuses = wait_ended(ns, settings, base, job.runs, timeout)
    return CancelReport(where, job.runs, statuses)


def select(model: RunsModel, where: dict[str, str]) -> list[str]:
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


def wait_ended(
    ns: str, settings: Settings, base: Path | None, run_ids: list[str], timeout: float
) -> dict[str, str]:
    """Each run's status once all ended, or as they are after ``timeout`` seconds; a run
    that continued as new has the status of the run that carries it on (its cancel
    followed it there)."""
    deadline = time.monotonic() + timeout
    while True:
        with caught_up(ns, settings, base) as (model, _):
            statuses = {}
            for run_id in run_ids:
                row = model.get(run_id)
                while row is not None and row.status == Status.COMPLETED and row.continued_as:
                    row = model.get(row.continued_as)
                statuses[run_id] = row.status if row else "unknown"
        if all(s in TERMINAL for s in statuses.values()) or time.monotonic() > deadline:
            return statuses
        time.sleep(0.5)


def _datetime(ms: int | None) -> datetime | None:
    return None if not ms else datetime.fromtimestamp(ms / 1000, UTC)


def took(ms: int | None) -> str:
    """A duration as people read it: 850ms, 4.2s, 3m05s, 2h10m."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{ms // 60_000}m{ms % 60_000 // 1000:02d}s"
    return f"{ms // 3_600_000}h{ms % 3_600_000 // 60_000:02d}m"
