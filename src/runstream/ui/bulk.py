"""The dashboard's bulk actions by the runs list's filter: cancel, retry, resume, pause
and unpause every run it matches, after a dry run that says which.

Each goes through the machinery of ``runstream runs`` and `Client`: a cancel is the
durable job of `operations.bulk_cancel` (``runstream runs cancel --where`` resumes it),
pause and unpause are `pausing.bulk` (sent again, they send what is left); retry and
resume keep the same job file as a cancel (`CancelJob`: the runs selected, how many
sent) beside the runs model, so confirmed again after the dashboard stopped part way,
they go on where they stopped. A job runs on a thread; its page shows how far it got,
then how many runs it changed, and why each other run was left alone or not changed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runstream.client import Client
from runstream.operations import CHUNK, CancelJob, bulk_cancel, jobs_dir, select
from runstream.pausing import bulk as bulk_pause
from runstream.pausing import who
from runstream.projections.runs import CLOSED, RunRow, RunsModel
from runstream.schemas.records import Status
from runstream.settings import Settings


@dataclass(frozen=True)
class Action:
    """A bulk action: the statuses of the runs it acts on, and why it leaves the rest."""

    name: str
    done: str  # what a run it changed is, in a sentence: "cancelled"
    acts_on: Callable[[str], bool]
    leaves: str  # why a run of another status is left alone

    def changed(self, row: RunRow | None, since_ms: int) -> bool:
        """Whether the run shows this action's effect, ``since_ms`` being when it was sent."""
        if row is None:
            return False
        if self.name == "cancel":
            return row.status == Status.CANCELLED
        if self.name == "pause":
            return row.status == Status.PAUSED
        if self.name == "unpause":
            return row.status != Status.PAUSED
        # retry, resume: a lifecycle event since (run.retried, a step), even if it
        # failed or parked again meanwhile; a refused one changes nothing (a dead letter)
        return row.updated_at_ms >= since_ms or not self.acts_on(row.status)

    def settled(self, row: RunRow | None) -> bool:
        """Whether the run can no longer show this action: it ended some other way
        (completed before its cancel or pause came)."""
        return row is not None and self.name in ("cancel", "pause") and row.status in CLOSED


_FAILED = (Status.FAILED, Status.DEAD)
ACTIONS = {
    a.name: a
    for a in (
        Action("cancel", "cancelled", lambda s: s not in CLOSED, "it has ended"),
        Action("retry", "retried", lambda s: s in _FAILED, "only failed or dead runs are retried"),
        Action("resume", "resumed", lambda s: s == Status.PARKED, "only parked runs are resumed"),
        Action(
            "pause",
            "paused",
            lambda s: s not in CLOSED and s != Status.PAUSED,
            "only open runs not paused yet are paused",
        ),
        Action(
            "unpause", "unpaused", lambda s: s == Status.PAUSED, "only paused runs are unpaused"
        ),
    )
}


@dataclass(frozen=True)
class Plan:
    """What a bulk action would do now: the runs it acts on, newest first, and each run
    that matches but is left alone, with why."""

    action: str
    where: dict[str, str]
    runs: list[str]
    left: dict[str, str]

    @property
    def where_text(self) -> str:
        """The conditions as ``--where`` says them."""
        return ",".join(f"{k}={v}" for k, v in self.where.items())


def plan(model: RunsModel, action: str, where: dict[str, str]) -> Plan:
    """The runs matching ``where`` that ``action`` acts on, and the others with why."""
    act = ACTIONS[action]
    runs, left = [], {}
    for run_id in select(model, where):
        row = model.get(run_id)
        status = row.status if row is not None else "unknown"
        if act.acts_on(status):
            runs.append(run_id)
        else:
            left[run_id] = f"{status}: {act.leaves}"
    return Plan(action, where, runs, left)


def job_file(base: Path | None, settings: Settings, ns: str, p: Plan) -> Path | None:
    """The durable job file of ``p`` (None: pause and unpause keep none)."""
    if p.action in ("pause", "unpause"):
        return None
    path = CancelJob.path(jobs_dir(base, settings.bootstrap(), ns), p.where)
    return path.with_name(path.name.replace("cancel-", f"{p.action}-", 1))  # same digest


def unfinished(path: Path | None) -> CancelJob | None:
    """The job a confirmed action would go on with, if one stopped part way."""
    return None if path is None else CancelJob.load(path)


class Stopped(Exception):
    """The dashboard is closing: the job stops between chunks (its file resumes it)."""


@dataclass
class BulkJob:
    """One bulk action under way or done, as its page shows it."""

    plan: Plan
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    state: str = "sending"  # sending, waiting (for the runs to show it), done, stopped, failed
    runs: list[str] = field(default_factory=list)  # the runs it acts on
    total: int = 0  # commands to send (a cancel's job sends to the ended runs too: harmless)
    sent: int = 0
    resumed: int = 0  # sent by an earlier job of the same file
    statuses: dict[str, str] = field(default_factory=dict)  # each run's status at the end
    changed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # sent but not changed: why
    error: str | None = None
    file: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("done", "stopped", "failed")

    @property
    def by_status(self) -> list[tuple[str, int]]:
        return sorted(Counter(self.statuses.values()).items())


@dataclass
class Runner:
    """What a job needs from the dashboard."""

    namespace: str
    settings: Settings
    base: Path | None  # the cache directory, as ``runstream runs --cache-dir``
    row: Callable[[str], RunRow | None]  # a run as the dashboard's model shows it
    letters: Callable[[], list[dict[str, Any]]] | None
    stopping: threading.Event
    timeout: float  # how long to wait for the runs to show the action

    def run(self, job: BulkJob) -> None:
        """Do ``job`` to its end (on its own thread), recording how far it got."""
        try:
            with Client(self.namespace, settings=self.settings) as client:
                self._send(job, client)
            job.state = "waiting"
            self._wait(job)
            job.state = "done"
        except Stopped:
            job.state = "stopped"
        except Exception as exc:  # shown on the job's page
            job.error, job.state = f"{type(exc).__name__}: {exc}", "failed"

    def _send(self, job: BulkJob, client: Client) -> None:
        p, reason = job.plan, f"runstream ui: bulk {job.plan.action} {job.plan.where_text}"
        if p.action in ("pause", "unpause"):
            report = bulk_pause(
                self.namespace,
                self.settings,
                lambda: client,
                p.where,
                unpause=p.action == "unpause",
                reason=reason,
                by=who(),
                dry_run=False,
                base=self.base,
            )
            job.runs, job.total = report.runs, len(report.runs)
            job.sent = job.total
            return
        path = job_file(self.base, self.settings, self.namespace, p)
        assert path is not None
        job.file = str(path)

        def progress(cj: CancelJob, _path: Path) -> None:
            if not job.total:  # the job's first word: it may go on from an earlier one
                job.runs = [r for r in cj.runs if r not in p.left]
                job.total, job.resumed = len(cj.runs), cj.sent
            job.sent = cj.sent
            if self.stopping.is_set():
                raise Stopped

        if p.action == "cancel":
            bulk_cancel(
                self.namespace,
                self.settings,
                lambda: client,
                p.where,
                compensate=False,
                reason=reason,
                rate=None,
                timeout=0,  # waited for below, on the dashboard's own model
                dry_run=False,
                base=self.base,
                progress=progress,
            )
            return
        cj = CancelJob.load(path)
        if cj is None:
            cj = CancelJob(p.where, p.runs, reason=reason)
            cj.create(path)
        progress(cj, path)
        while cj.sent < len(cj.runs):  # as `bulk_cancel` sends its chunks
            chunk = cj.runs[cj.sent : cj.sent + CHUNK]
            for run_id in chunk:
                client.retry(run_id, reason=cj.reason, wait=False)
            client.flush()  # Kafka has them: only now does the job move on
            cj.advance(path, len(chunk))
            progress(cj, path)
        cj.finish(path)

    def _wait(self, job: BulkJob) -> None:
        """Until every run shows the action, or ``timeout``: then each that does not
        gets why (the engine's dead letter for it, or its status)."""
        act, deadline = ACTIONS[job.plan.action], time.monotonic() + self.timeout
        while True:
            rows = {r: self.row(r) for r in job.runs}
            job.statuses = {r: row.status if row else "unknown" for r, row in rows.items()}
            job.changed = [r for r, row in rows.items() if act.changed(row, job.started_ms)]
            ended = {r for r, row in rows.items() if r not in job.changed and act.settled(row)}
            if len(job.changed) + len(ended) == len(job.runs) or time.monotonic() > deadline:
                break
            if self.stopping.wait(0.3):
                raise Stopped
        changed = set(job.changed)
        missing = {r for r in job.runs if r not in changed and r not in ended}
        said = self._dead_letters(missing, job.started_ms) if missing else {}
        for r in job.runs:
            if r in ended:
                job.refused[r] = f"ended {job.statuses[r]}, not {act.done}"
            elif r in missing:
                job.refused[r] = said.get(r) or f"still {job.statuses[r]} after {self.timeout:g}s"

    def _dead_letters(self, runs: set[str], since_ms: int) -> dict[str, str]:
        """The engine's reasons for refusing commands to ``runs`` since ``since_ms``."""
        if self.letters is None:
            return {}
        out = {}
        for letter in self.letters():
            at = letter.get("at")
            if letter.get("run_id") in runs and at and _ms(at) >= since_ms - 1000:
                out[letter["run_id"]] = f"refused ({letter.get('code')}): {letter.get('reason')}"
        return out


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)
