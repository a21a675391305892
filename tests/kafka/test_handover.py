"""Graceful handover with real processes: instances scaled out and in with SIGTERM (never
SIGKILL) while runs are under way. A deploy or a rebalance is not a crash: a step that
ends within the handover timeout is committed by the instance that ran it, one that does
not is handed over (StepHandedOver) and runs again uncharged, and nothing is a recovery.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import runstream
from runstream.audit import audit

from .kit import SteadyStarts, owns, read_topic, results, spawn_worker, terminate, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# dynamic members: a stopped instance leaves the group, and its partitions move at once
ELASTIC = {"RUNSTREAM_LEAVE_ON_STOP": "true", "RUNSTREAM_STEP_CONCURRENCY": "64"}


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _bodies(step_log: Path) -> Counter[tuple[str, int]]:
    """(run, seq) -> how many bodies of that step began (`flows.shift` logs as it begins)."""
    lines = step_log.read_text().splitlines() if step_log.exists() else []
    return Counter((run, int(n)) for run, n, _pid in (line.split() for line in lines))


class Scaler:
    """Engine instances in their own processes, added and SIGTERMed by name."""

    def __init__(self, bootstrap: str, ns: str, tmp: Path, **env: str) -> None:
        self.bootstrap, self.ns, self.env = bootstrap, ns, {**ELASTIC, **env}
        self.state, self.log = tmp / "state", tmp / "steps.log"
        self.state.mkdir()
        self.procs: dict[str, object] = {}
        self.exits: dict[str, int] = {}

    def add(self, name: str) -> None:
        self.procs[name] = spawn_worker(
            self.bootstrap, self.ns, self.state, name, self.log, **self.env
        )

    def wait_owning(self, *names: str) -> None:
        wait_for(
            lambda: all(owns(self.state, self.ns, n) for n in names),
            timeout=60,
            what=f"{', '.join(names)} to own partitions",
        )

    def stop(self, name: str) -> None:
        self.exits[name] = terminate(self.procs.pop(name), timeout=60)  # type: ignore[arg-type]

    def close(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:  # type: ignore[attr-defined]
                proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            self.exits[name] = proc.wait(60)  # type: ignore[attr-defined]
        self.procs.clear()


def _facts(bootstrap: str, ns: str, name: str) -> list[dict]:
    return [r for n, r, _ in read_topic(bootstrap, f"{ns}.journal", timeout=60) if n == name]


def _each_step_ran_once(
    bootstrap: str, ns: str, step_log: Path, run_ids: list[str], outputs: dict
) -> Counter[tuple[str, int]]:
    """Every run completed, each of its three step bodies began exactly once, and no
    recovery was charged; the bodies, counted."""
    assert outputs == dict.fromkeys(run_ids, 6)
    bodies = _bodies(step_log)
    assert set(bodies) == {(r, n) for r in run_ids for n in (1, 2, 3)}
    twice = {step: n for step, n in bodies.items() if n > 1}
    assert not twice, f"step bodies that ran more than once: {twice}"
    assert not _facts(bootstrap, ns, "RunRecovered"), "a stop was charged as a crash"
    return bodies


def test_scaling_1_to_3_to_1_with_sigterm_runs_no_step_body_twice(kafka_bootstrap, ns, tmp_path):
    runs = 200
    # 16 steps at a time: w1 alone needs about a minute for the 600 bodies, so the scale-up
    # lands mid-work even when a loaded machine is slow to start w2 and w3
    fleet = Scaler(kafka_bootstrap, ns, tmp_path, RUNSTREAM_STEP_CONCURRENCY="16")
    try:
        fleet.add("w1")
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        run_ids = [f"run-{i}" for i in range(runs)]
        for i, run_id in enumerate(run_ids):  # steps of 1.0 to 1.8 s
            client.start("shifts", 1.0 + (i % 5) * 0.2, run_id=run_id, wait=False)
        client.flush(30)
        wait_for(lambda: _bodies(fleet.log).total() >= 60, timeout=60, what="steps under way")
        fleet.add("w2")
        fleet.add("w3")  # 1 -> 3: w1 hands partitions over mid-step
        fleet.wait_owning("w1", "w2", "w3")
        began = _bodies(fleet.log).total()
        wait_for(
            lambda: _bodies(fleet.log).total() >= began + 60,
            timeout=60,
            what=f"progress past {began} of {3 * runs} step bodies",
        )
        fleet.stop("w2")  # 3 -> 1: each hands its partitions back, steps still running
        fleet.stop("w3")
        outputs = results(client, run_ids, timeout=180)
        client.close()
    finally:
        fleet.close()
    bodies = _each_step_ran_once(kafka_bootstrap, ns, fleet.log, run_ids, outputs)
    handed = _facts(kafka_bootstrap, ns, "StepHandedOver")
    assert not [h for h in handed if h["ran"]], "a step ran past the handover timeout"
    report = audit(kafka_bootstrap, ns, expect_finished=True)
    assert report.ok, report.violations[:5]
    assert set(fleet.exits.values()) == {0}, fleet.exits
    print(
        f"\n1 -> 3 -> 1: {bodies.total()} step bodies for {len(bodies)} steps; "
        f"{len(handed)} queued steps handed over before they began"
    )


def test_a_handover_timeout_shorter_than_the_steps_re_runs_only_the_steps_it_abandoned(
    kafka_bootstrap, ns, tmp_path
):
    runs = 40
    fleet = Scaler(
        kafka_bootstrap,
        ns,
        tmp_path,
        RUNSTREAM_HANDOVER_TIMEOUT="0.2",
        RUNSTREAM_STOP_TIMEOUT="0.2",
    )
    try:
        fleet.add("w1")
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        run_ids = [f"run-{i}" for i in range(runs)]
        for run_id in run_ids:
            client.start("shifts", 2.0, run_id=run_id, wait=False)
        client.flush(30)
        wait_for(lambda: _bodies(fleet.log).total() >= runs, timeout=60, what="steps under way")
        fleet.add("w2")  # 1 -> 2: w1 abandons the steps running on what it gives away
        fleet.wait_owning("w1", "w2")
        fleet.stop("w2")  # 2 -> 1: w2 abandons its own, at once
        outputs = results(client, run_ids, timeout=180)
        client.close()
    finally:
        fleet.close()
    assert outputs == dict.fromkeys(run_ids, 6)
    handed = Counter(
        (h["run_id"], h["seq"]) for h in _facts(kafka_bootstrap, ns, "StepHandedOver") if h["ran"]
    )
    assert handed, "no step was abandoned: the test did not test the timeout"
    bodies = _bodies(fleet.log)
    extra = {step: n for step, n in bodies.items() if n != 1 + handed[step]}
    assert not extra, f"bodies that ran again without being handed over: {extra}"
    assert not _facts(kafka_bootstrap, ns, "RunRecovered"), "a handover was charged as a crash"
    report = audit(kafka_bootstrap, ns, expect_finished=True)
    assert report.ok, report.violations[:5]
    print(f"\nshort handover timeout: {handed.total()} abandoned steps ran again, no other")


def test_a_rolling_restart_of_three_instances_under_load_re_runs_no_step(
    kafka_bootstrap, ns, tmp_path
):
    """Three static members (a restart takes its partitions back), each SIGTERMed and
    started again in turn while runs of three quick steps keep arriving (W2-style)."""
    names = ("w1", "w2", "w3")
    fleet = Scaler(kafka_bootstrap, ns, tmp_path, RUNSTREAM_LEAVE_ON_STOP="false")
    run_ids = [f"run-{i}" for i in range(2400)]
    try:
        for name in names:
            fleet.add(name)
        fleet.wait_owning(*names)
        load = SteadyStarts(kafka_bootstrap, ns, "shifts", 0.0, run_ids, seconds=24)
        time.sleep(8)
        restart = [time.time()]
        for name in names:
            fleet.stop(name)
            fleet.add(name)
            fleet.wait_owning(name)
        restart.append(time.time())
        load.finish()
        client = runstream.Client(ns, kafka_bootstrap)
        outputs = results(client, run_ids, timeout=180)
        client.close()
    finally:
        fleet.close()
    _each_step_ran_once(kafka_bootstrap, ns, fleet.log, run_ids, outputs)
    assert set(fleet.exits.values()) == {0}, fleet.exits
    ended = [r["at_ms"] / 1000 for r in _facts(kafka_bootstrap, ns, "RunCompleted")]
    first = min(ended)

    def rate(lo: float, hi: float) -> float:
        return sum(lo <= t < hi for t in ended) / (hi - lo)

    print(
        f"\nrolling restart of 3 instances in {restart[1] - restart[0]:.1f}s under 100 runs/s: "
        f"{rate(first + 1, restart[0]):.0f} runs/s completed before it, "
        f"{rate(*restart):.0f} runs/s during it; no step body ran twice"
    )
