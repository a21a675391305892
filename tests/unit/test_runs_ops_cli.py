"""`runstream runs cancel --where`: what it accepts, checked before any broker is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runstream.cli.main import cli
from runstream.cli.runs_cmd import model_path
from runstream.cli.runs_ops import CancelJob


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("colour=red", "use status=S, workflow=W"),
        ("status=sleeping", "no status 'sleeping'"),
        ("workflow=", "use status=S, workflow=W"),
        (",", "name at least one condition"),
    ],
)
def test_runs_cancel_where_refuses_a_condition_it_does_not_know(where, problem):
    out = CliRunner().invoke(cli, ["runs", "cancel", "--where", where, "-n", "shop"])
    assert out.exit_code == 2 and problem in out.output


def test_the_namespace_comes_from_the_environment():
    out = CliRunner().invoke(
        cli, ["runs", "cancel", "--where", "colour=red"], env={"RUNSTREAM_NAMESPACE": "shop"}
    )
    assert "Missing option" not in out.output and "use status=S" in out.output


def _jobs(cache) -> Path:
    return model_path(cache, "127.0.0.1:1", "shop").with_name("shop.jobs")


WHERE = {"workflow": "approval", "status": "running"}


def test_a_job_file_holds_its_runs_and_options_once_and_appends_its_progress(tmp_path):
    path = CancelJob.path(_jobs(tmp_path), WHERE)
    job = CancelJob(WHERE, ["a", "b", "c"], compensate=True, reason="why")
    job.create(path)
    job.advance(path, 2)
    job.advance(path, 1)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and lines[0].count('"a"') == 1  # the list once, then progress
    again = CancelJob.load(path)
    assert again is not None
    assert (again.runs, again.compensate, again.reason, again.sent) == (
        ["a", "b", "c"],
        True,
        "why",
        3,
    )
    with path.open("a") as f:  # a kill while it appended: the torn line counts for nothing
        f.write('{"se')
    torn = CancelJob.load(path)
    assert torn is not None and torn.sent == 3


def test_a_finished_job_is_closed_so_the_same_command_starts_a_new_one(tmp_path):
    path = CancelJob.path(_jobs(tmp_path), WHERE)
    job = CancelJob(WHERE, ["a"])
    job.create(path)
    job.advance(path, 1)
    done = job.finish(path)
    assert CancelJob.load(path) is None  # nothing left to resume
    assert done.exists() and done.parent == path.parent and done != path
    assert json.loads(done.read_text().splitlines()[-1]) == {"sent": 1}


@pytest.mark.parametrize("compensate", [True, False])
def test_resuming_a_job_with_another_compensate_is_refused(tmp_path, compensate):
    path = CancelJob.path(_jobs(tmp_path), WHERE)
    CancelJob(WHERE, ["a", "b"], compensate=not compensate).create(path)
    args = ["runs", "cancel", "--where", "workflow=approval,status=running", "-n", "shop"]
    args += ["--bootstrap", "127.0.0.1:1", "--cache-dir", str(tmp_path)]
    out = CliRunner().invoke(cli, args + (["--compensate"] if compensate else []))
    assert out.exit_code == 2, out.output
    assert "unfinished bulk cancel" in out.output and "0 of 2 sent" in out.output
    assert ("made without --compensate" if compensate else "made with --compensate") in out.output
    assert CancelJob.load(path) is not None  # left as it was
