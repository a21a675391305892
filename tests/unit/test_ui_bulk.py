"""The dashboard's bulk actions (`runstream.ui.bulk`) on a real runs model in tmp_path:
which runs each action acts on, which it leaves alone and why, and when a run shows it."""

from __future__ import annotations

from pathlib import Path

from runstream.projections.runs import RunRow, RunsModel
from runstream.schemas.records import LifecycleEvent
from runstream.settings import Settings
from runstream.ui.bulk import ACTIONS, Plan, job_file, plan

from .test_runs_model import ListSource, started

WHERE = {"tag.batch": "b"}


def _moved(run: str, at: int, kind: str, status: str) -> LifecycleEvent:
    return LifecycleEvent(kind, run, at_ms=at, workflow="order", version="1", status=status)


def _model(path: Path) -> RunsModel:
    src = ListSource()
    for n, run in enumerate(("running", "failed", "dead", "parked", "paused", "done", "other")):
        src.add(started(run, 100 + n, batch="b" if run != "other" else "x"))
    src.add(
        _moved("failed", 200, "run.failed", "failed"),
        _moved("dead", 201, "run.dead", "dead"),
        _moved("parked", 202, "run.suspended", "parked"),
        _moved("paused", 203, "run.paused", "paused"),
        _moved("done", 204, "run.completed", "completed"),
    )
    model = RunsModel(path)
    model.catch_up(src)
    return model


def test_each_action_acts_on_the_runs_of_its_statuses_and_says_why_it_leaves_the_rest(
    tmp_path: Path,
) -> None:
    model = _model(tmp_path / "runs")
    try:
        acts = {a: plan(model, a, WHERE) for a in ACTIONS}
    finally:
        model.close()
    assert {a: sorted(p.runs) for a, p in acts.items()} == {
        "cancel": ["parked", "paused", "running"],
        "retry": ["dead", "failed"],
        "resume": ["parked"],
        "pause": ["parked", "running"],
        "unpause": ["paused"],
    }
    for a, p in acts.items():  # every run of the filter is acted on or left with a reason
        assert sorted([*p.runs, *p.left]) == sorted(
            ["running", "failed", "dead", "parked", "paused", "done"]
        ), a
        assert "other" not in p.left
    assert acts["retry"].left["running"] == "running: only failed or dead runs are retried"
    assert acts["cancel"].left["done"] == "completed: it has ended"
    assert acts["unpause"].left["parked"] == "parked: only paused runs are unpaused"


def test_a_run_shows_an_action_by_its_status_or_by_moving_since_and_settles_when_ended():
    row = RunRow("r", status="failed", updated_at_ms=100)
    assert not ACTIONS["retry"].changed(row, since_ms=150)  # refused: nothing moved
    assert ACTIONS["retry"].changed(RunRow("r", status="failed", updated_at_ms=160), 150)
    assert ACTIONS["retry"].changed(RunRow("r", status="running", updated_at_ms=100), 150)
    assert ACTIONS["resume"].changed(RunRow("r", status="running", updated_at_ms=100), 150)
    assert not ACTIONS["resume"].changed(RunRow("r", status="parked", updated_at_ms=100), 150)
    assert ACTIONS["pause"].changed(RunRow("r", status="paused"), 0)
    assert not ACTIONS["pause"].changed(RunRow("r", status="running"), 0)
    assert ACTIONS["unpause"].changed(RunRow("r", status="running"), 0)
    assert ACTIONS["cancel"].changed(RunRow("r", status="cancelled"), 0)
    assert not ACTIONS["cancel"].changed(None, 0)
    # completed before the cancel came: not cancelled, and no use waiting for it
    completed = RunRow("r", status="completed")
    assert not ACTIONS["cancel"].changed(completed, 0) and ACTIONS["cancel"].settled(completed)
    assert ACTIONS["pause"].settled(completed) and not ACTIONS["pause"].settled(None)
    assert not ACTIONS["retry"].settled(RunRow("r", status="failed"))  # a retry may come


def test_retry_and_resume_keep_a_job_file_of_their_own_beside_the_cancels(tmp_path) -> None:
    settings = Settings().with_bootstrap("127.0.0.1:9092")
    files = {a: job_file(tmp_path, settings, "shop", Plan(a, WHERE, [], {})) for a in ACTIONS}
    assert files["pause"] is None and files["unpause"] is None
    names = {a: f.name for a, f in files.items() if f is not None}
    digest = names["cancel"].removeprefix("cancel-")
    assert names == {a: f"{a}-{digest}" for a in ("cancel", "retry", "resume")}
    assert len({f.parent for f in files.values() if f is not None}) == 1
