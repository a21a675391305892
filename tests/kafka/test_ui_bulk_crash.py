"""The dashboard's bulk pause and unpause while the engine process that owns the runs
is SIGKILLed and restarted, or while the runs' partitions are handed over between two
engine processes: every run is paused once and unpaused once (one RunPaused, one
RunUnpaused each in its journal), and the job's result says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from starlette.testclient import TestClient

import runstream
from runstream.cli.ui_cmd import dashboard
from runstream.schemas.records import Kind
from runstream.ui.server import Dashboard, Filters, create_app

from .kit import (
    PARTITIONS,
    client_or_none,
    fact_names,
    kill,
    owns,
    read_topic,
    spawn_worker,
    terminate,
    wait_for,
)

RUNS = [f"hold-{i}" for i in range(20)]


def _bulk(dash: Dashboard, http: TestClient, action: str, meanwhile: Callable[[], object]) -> None:
    """Confirm ``action`` on batch k, do ``meanwhile`` at once, and wait for the job."""
    form = {"token": dash.token, "tag": "batch=k", "action": action, "confirm": "yes"}
    answer = http.post("/bulk", data=form, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    job_id = answer.headers["location"].rsplit("/", 1)[1]
    meanwhile()
    job = dash.bulk_job(job_id)
    assert job is not None
    wait_for(lambda: job.finished, timeout=150, what=f"the bulk {action}")
    assert (job.state, job.error, job.refused) == ("done", None, {})
    assert sorted(job.changed) == sorted(RUNS)
    page = http.get(f"/bulk/{job_id}").text
    assert f"<b>{len(RUNS)}</b> of {len(RUNS)} runs {action}d" in page


def _each_once(bootstrap: str, ns: str, client: runstream.Client) -> None:
    """Each run paused once and unpaused once, then on to its end."""
    for run_id in RUNS:
        names = fact_names(bootstrap, ns, run_id)
        assert (names.count("RunPaused"), names.count("RunUnpaused")) == (1, 1), run_id
    lifecycle = [m.key() for n, r, m in read_topic(bootstrap, f"{ns}.lifecycle")
                 if r.get("type") == Kind.RUN_PAUSED]  # fmt: skip
    assert sorted(k.decode() for k in lifecycle) == sorted(RUNS)
    for run_id in RUNS:  # unpaused, each goes on
        client.signal(run_id, "approve", run_id)
        assert client.result(run_id, timeout=60) == {"approved": True, "by": run_id}


def test_a_bulk_pause_and_unpause_through_sigkilled_engines_change_each_run_once(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    workers = [spawn_worker(kafka_bootstrap, ns, state, "w1")]

    def restart() -> None:
        kill(workers[-1])
        workers.append(spawn_worker(kafka_bootstrap, ns, state, "w1"))

    dash = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        for run_id in RUNS:
            client.start("approval", None, run_id=run_id, tags={"batch": "k"}, wait=False)
        client.flush()
        dash = dashboard(ns, kafka_bootstrap, tmp_path / "cache")
        dash.bulk_timeout = 120  # the restarted engine restores first
        dash.start()
        listed = Filters(tags=("batch=k",))
        wait_for(
            lambda: [r.status for r in dash.find(listed)[0]] == ["running"] * len(RUNS),
            what="the runs to wait",
        )
        with TestClient(create_app(dash)) as http:
            _bulk(dash, http, "pause", restart)
            _bulk(dash, http, "unpause", restart)
        _each_once(kafka_bootstrap, ns, client)
        client.close()
    finally:
        if dash is not None:
            dash.close()
        if workers[-1].poll() is None:
            terminate(workers[-1])


def test_a_bulk_pause_and_unpause_across_handovers_between_two_engines_change_each_run_once(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    workers = {"w1": spawn_worker(kafka_bootstrap, ns, state, "w1")}
    dash = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        for run_id in RUNS:
            client.start("approval", None, run_id=run_id, tags={"batch": "k"}, wait=False)
        client.flush()
        dash = dashboard(ns, kafka_bootstrap, tmp_path / "cache")
        dash.bulk_timeout = 120
        dash.start()
        listed = Filters(tags=("batch=k",))
        wait_for(
            lambda: [r.status for r in dash.find(listed)[0]] == ["running"] * len(RUNS),
            what="the runs to wait",
        )

        def join() -> None:  # a second instance joins: some partitions move to it
            workers["w2"] = spawn_worker(kafka_bootstrap, ns, state, "w2")

        with TestClient(create_app(dash)) as http:
            _bulk(dash, http, "pause", join)
            wait_for(lambda: owns(state, ns, "w2"), timeout=90, what="w2 to own some")
            _bulk(dash, http, "unpause", lambda: terminate(workers["w1"]))  # w1 hands over
        _each_once(kafka_bootstrap, ns, client)
        client.close()
    finally:
        if dash is not None:
            dash.close()
        for worker in workers.values():
            if worker.poll() is None:
                terminate(worker)
