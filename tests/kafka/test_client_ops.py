"""The Python API for operations against the real broker: `Client.list_runs` (paged,
from the runs read model), `Client.history` (from the journal) and `Client.cancel_where`
(the durable bulk cancel the CLI's ``runs cancel --where`` runs too)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import runstream
from runstream.operations import CancelJob, jobs_dir
from runstream.topics.admin import ensure_topics

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, wait_for

pytestmark = pytest.mark.kafka


def test_list_runs_pages_filters_and_types_the_runs_and_history_reads_the_journal(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    cache = tmp_path / "cache"
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("three_steps", 1, run_id="done-1", tags={"team": "a"})
            assert client.result("done-1", timeout=60) == 4
            waiting = [f"a-{i}" for i in range(5)]
            for run_id in waiting:
                client.start("approval", run_id=run_id, tags={"team": "b"})

            def running() -> int:
                return client.list_runs(status="running", cache_dir=cache).count

            wait_for(lambda: running() == 5, timeout=60, what="5 running runs")

            pages, after = [], None
            while True:
                page = client.list_runs(tags={"team": "b"}, limit=2, after=after, cache_dir=cache)
                pages.append([r.run_id for r in page.runs])
                assert page.count == 5 and not page.partial
                if page.after is None:
                    break
                after = page.after
            assert [len(p) for p in pages] == [2, 2, 1]
            assert sorted(r for p in pages for r in p) == waiting

            (done,) = client.list_runs(status="completed", cache_dir=cache).runs
            assert isinstance(done, runstream.RunSummary)
            assert (done.run_id, done.workflow, done.tags) == (
                "done-1",
                "three_steps",
                {"team": "a"},
            )
            assert (done.input, done.output, done.steps) == (1, 4, 3)
            assert done.started_at is not None and done.ended_at is not None
            assert done.started_at <= done.ended_at and done.duration is not None

            recent = client.list_runs(since=timedelta(hours=1), limit=50, cache_dir=cache)
            assert recent.count == 6
            assert client.list_runs(since="1h", workflow="approval", cache_dir=cache).count == 5
            later = datetime.now(UTC) + timedelta(hours=1)
            assert client.list_runs(since=later, cache_dir=cache).runs == []
            assert client.list_runs(until=later, cache_dir=cache).count == 6
            with pytest.raises(ValueError, match="no status 'sleeping'"):
                client.list_runs(status="sleeping", cache_dir=cache)

            facts = client.history("done-1", cache_dir=cache)
            assert all(isinstance(f, runstream.JournalFact) for f in facts)
            types = [f.type for f in facts]
            assert types[0] == "RunStarted" and types[-1] == "RunCompleted"
            assert types.count("StepCompleted") == 3
            assert [f.seq for f in facts if f.type == "StepCompleted"] == [1, 2, 3]
            assert facts[-1].data["output"] == 4 and facts[-1].at is not None
            with pytest.raises(runstream.RunNotFound):
                client.history("no-such-run", cache_dir=cache)
    finally:
        worker.stop()


def test_cancel_where_cancels_the_matching_runs_and_refuses_what_it_cannot_do(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    cache = tmp_path / "cache"
    wanted = [f"w-{i}" for i in range(6)]
    others = ["keep-1", "keep-2"]
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            for run_id in wanted:
                client.start("approval", run_id=run_id, tags={"batch": "b1"})
            for run_id in others:
                client.start("approval", run_id=run_id, tags={"batch": "b2"})
            wait_for(
                lambda: client.list_runs(status="running", cache_dir=cache).count == 8,
                timeout=60,
                what="8 running runs",
            )
            with pytest.raises(ValueError, match="at least one condition"):
                client.cancel_where(cache_dir=cache)
            with pytest.raises(ValueError, match="no status 'sleeping'"):
                client.cancel_where(status="sleeping", cache_dir=cache)

            where = {"workflow": "approval", "tags": {"batch": "b1"}}
            dry = client.cancel_where(**where, dry_run=True, cache_dir=cache)
            assert dry.dry_run and sorted(dry.runs) == wanted and dry.statuses == {}

            # An unfinished job of these conditions made with --compensate: not resumed
            # without it, and left as it was.
            job_file = CancelJob.path(
                jobs_dir(cache, kafka_bootstrap, ns), {"workflow": "approval", "tag.batch": "b1"}
            )
            CancelJob({"workflow": "approval", "tag.batch": "b1"}, wanted, True).create(job_file)
            with pytest.raises(ValueError, match="made with --compensate"):
                client.cancel_where(**where, cache_dir=cache)
            assert CancelJob.load(job_file) is not None
            job_file.unlink()

            report = client.cancel_where(**where, reason="clean up", cache_dir=cache)
            assert isinstance(report, runstream.CancelReport)
            assert sorted(report.runs) == wanted and not report.dry_run
            assert report.by_status == {"cancelled": 6} and report.open == []
            assert not job_file.exists()  # the job is over
            assert [client.get_run(r).status for r in others] == ["running", "running"]
            assert client.get_run("w-0").reason == "clean up"
    finally:
        worker.stop()


def test_history_of_a_run_that_failed_and_was_retried_goes_on_past_its_failure(
    kafka_bootstrap, ns, tmp_path
):
    """The journal reader stopped at a run's first end fact, so the history (and `runs
    history`, and the dashboard's timeline) of a run that failed and was retried ended at
    its failure."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    cache = tmp_path / "cache"
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("approval", run_id="again-1", timeout=2)
            with pytest.raises(runstream.RunTimedOut):
                client.result("again-1", timeout=60)
            client.retry("again-1")
            wait_for(lambda: client.get_run("again-1").status == "running", timeout=60)
            client.signal("again-1", "approve", "ann")
            assert client.result("again-1", timeout=60) == {"approved": True, "by": "ann"}
            names = [f.type for f in client.history("again-1", cache_dir=cache)]
            assert (
                names.index("RunFailed") < names.index("RunRetried") < names.index("RunCompleted")
            )
    finally:
        worker.stop()
