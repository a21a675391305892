"""Crash safety with real processes: SIGKILL engine instances and check that no run is
lost and no committed step runs again."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

import runstream

from .kit import kill, read_topic, spawn_worker, terminate, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# tick n of workflow `sleepy` is the step at this sequence number (seq 2 is the sleep)
TICK_SEQ = {1: 1, 2: 3, 3: 4}


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _two_instances_busy(bootstrap, ns, tmp_path, runs, sleep, started_fraction):
    """Two engine processes with ``runs`` sleepy runs under way: returns once that
    fraction of the first steps ran. (w1, w2, client, step log)"""
    log = tmp_path / "steps.log"
    state = tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(bootstrap, ns, state, "w1", log)
    w2 = spawn_worker(bootstrap, ns, state, "w2", log)
    try:
        client = wait_for(lambda: _client(ns, bootstrap), what="topics")
        for i in range(runs):
            client.start("sleepy", sleep, run_id=f"run-{i}", wait=False)
        client.start("sleepy", sleep, run_id="probe")  # flushes the others too
        wait_for(
            lambda: log.exists() and len(log.read_text().splitlines()) >= runs * started_fraction,
            timeout=120,
            what="the first steps to get going",
        )
    except BaseException:
        _stop(w1, w2)
        raise
    return w1, w2, client, log


def _check_journal(bootstrap, ns, runs):
    """Exactly one completion per step and one end per run, for ``runs`` + the probe."""
    journal = read_topic(bootstrap, f"{ns}.journal", timeout=30)
    completed = Counter((r["run_id"], r["seq"]) for n, r, _ in journal if n == "StepCompleted")
    assert len(completed) == 3 * (runs + 1) and set(completed.values()) == {1}
    finished = Counter(r["run_id"] for n, r, _ in journal if n == "RunCompleted")
    assert len(finished) == runs + 1 and set(finished.values()) == {1}
    return journal


def _stop(*workers):
    for w in workers:
        w.send_signal(signal.SIGCONT)
        if w.poll() is None:
            terminate(w)


def test_two_instances_one_sigkilled_mid_flight(kafka_bootstrap, ns, tmp_path):
    runs = 500
    w1, w2, client, log = _two_instances_busy(kafka_bootstrap, ns, tmp_path, runs, 1.0, 0.5)
    try:
        kill(w1)  # mid-flight: first steps running, many runs asleep
        killed_at = time.monotonic()
        results = {f"run-{i}": client.result(f"run-{i}", timeout=180) for i in range(runs)}
        recovered_in = time.monotonic() - killed_at
        assert set(results.values()) == {"rested"}
    finally:
        _stop(w1, w2)
    journal = _check_journal(kafka_bootstrap, ns, runs)
    bodies = Counter(tuple(line.split()) for line in log.read_text().splitlines())
    twice = {k: n for k, n in bodies.items() if n > 1}
    recovered = {(r["run_id"], r["seq"]) for n, r, _ in journal if n == "RunRecovered"}
    # Only a step whose first run was in flight in the killed process may run again.
    assert all((run, TICK_SEQ[int(n)]) in recovered for run, n in twice)
    assert all(n == 2 for n in twice.values())
    print(
        f"\n{len(twice)} step bodies ran twice (in flight at the kill); "
        f"all {runs} runs finished {recovered_in:.1f}s after the kill"
    )


def test_a_run_that_keeps_crashing_its_instance_goes_dead(kafka_bootstrap, ns, tmp_path):
    """The poison step SIGKILLs its engine process each time; the supervisor of
    `runstream worker` starts it again, and the run goes dead without anyone's help."""
    log = tmp_path / "steps.log"
    state = tmp_path / "state"
    state.mkdir()
    env = {"RUNSTREAM_TEST_MAX_RECOVERY": "2"}
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, **env)
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        client.start("poison", None, run_id="poison")
        with pytest.raises(runstream.RunFailed, match=r"dead: .*interrupted 3 times"):
            client.result("poison", timeout=180)
        client.start("three_steps", 1, run_id="healthy")  # the instance carries on
        assert client.result("healthy", timeout=60) == 4
        assert worker.poll() is None  # the supervisor never gave up
    finally:
        _stop(worker)
    # the first attempt and two recoveries each took the engine process down
    assert log.read_text().splitlines().count("crash") == 3
    dlq = read_topic(kafka_bootstrap, f"{ns}.dlq")
    assert [r["run_id"] for _, r, _ in dlq] == ["poison"]
    assert "max_recovery_attempts=2" in dlq[0][1]["reason"]


def test_a_frozen_instance_is_fenced_when_it_wakes(kafka_bootstrap, ns, tmp_path):
    """SIGSTOP one instance (a zombie: its session expires, its partitions move), let
    the other take over, then SIGCONT it: nothing it had in hand may reach the journal."""
    runs = 200
    w1, w2, client, _ = _two_instances_busy(kafka_bootstrap, ns, tmp_path, runs, 0.5, 1 / 3)
    try:
        w1.send_signal(signal.SIGSTOP)
        results = {f"run-{i}": client.result(f"run-{i}", timeout=180) for i in range(runs)}
        assert set(results.values()) == {"rested"}
        w1.send_signal(signal.SIGCONT)  # the zombie wakes with a batch in hand
        time.sleep(8)
    finally:
        _stop(w1, w2)
    _check_journal(kafka_bootstrap, ns, runs)
