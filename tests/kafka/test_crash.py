"""Crash safety with real processes: SIGKILL engine instances and check that no run is
lost and no committed step runs again."""

from __future__ import annotations

import signal
import time
from collections import Counter

import psutil
import pytest

import runstream

from .kit import (
    PARTITIONS,
    check_ticks,
    kill,
    owns,
    read_topic,
    spawn_worker,
    terminate,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _proved_member(client):
    """Finish one run, so the instance's commits have just proved it a member of its
    group: a start right after it chains its steps ahead of its commit (an instance whose
    last proof is older than its session allows starts nothing ahead, `Worker`)."""
    client.start("three_steps", 1, run_id="warm")
    assert client.result("warm", timeout=60) == 4


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
        run_ids = [f"run-{i}" for i in range(runs)] + ["probe"]  # all, before the stop
        results = {run_id: client.result(run_id, timeout=180) for run_id in run_ids}
        recovered_in = time.monotonic() - killed_at
        assert set(results.values()) == {"rested"}
    finally:
        _stop(w1, w2)
    journal = _check_journal(kafka_bootstrap, ns, runs)
    ticks = check_ticks(log, journal, list(results))
    print(f"\n{ticks}; all {runs} runs finished {recovered_in:.1f}s after the kill")


def test_a_run_that_keeps_crashing_its_instance_goes_dead(kafka_bootstrap, ns, tmp_path):
    """The poison step SIGKILLs its engine process each time; the supervisor of
    `runstream worker` starts it again, and the run goes dead without anyone's help.
    Its first attempt ran ahead of its commit (a fresh start chains its steps), so nothing
    of it counted; the start, read again, commits the step before it runs. That crash
    charges nobody (other steps might have been running), and neither does the crash of
    its recovery beside the others; each crash while the step runs alone, as a recovery,
    is the run's own: the third such one goes past max_recovery_attempts=2."""
    log = tmp_path / "steps.log"
    state = tmp_path / "state"
    state.mkdir()
    env = {"RUNSTREAM_TEST_MAX_RECOVERY": "2"}
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, **env)
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        _proved_member(client)
        client.start("poison", None, run_id="poison")  # fresh: its first attempt runs ahead
        with pytest.raises(runstream.RunFailed, match=r"dead: .*died, 3 times"):
            client.result("poison", timeout=180)
        client.start("three_steps", 1, run_id="healthy")  # the instance carries on
        assert client.result("healthy", timeout=60) == 4
        assert worker.poll() is None  # the supervisor never gave up
    finally:
        _stop(worker)
    # ahead of its commit, committed, recovered beside others, then three recoveries
    # alone: each took the process down
    assert log.read_text().splitlines().count("crash") == 6
    dlq = read_topic(kafka_bootstrap, f"{ns}.dlq")
    assert [r["run_id"] for _, r, _ in dlq] == ["poison"]
    assert "max_recovery_attempts=2" in dlq[0][1]["reason"]


def test_a_frozen_instance_is_fenced_when_it_wakes(kafka_bootstrap, ns, tmp_path):
    """SIGSTOP one instance's engine while its runs sleep (a zombie: its session expires,
    its partitions move), let the other finish everything, then SIGCONT it: it learns it
    was fenced, and nothing it had in hand reaches the journal."""
    runs, state = 200, tmp_path / "state"
    w1, w2, client, _ = _two_instances_busy(kafka_bootstrap, ns, tmp_path, runs, 4.0, 1 / 3)
    (engine,) = psutil.Process(w1.pid).children()  # the engine below w1's supervisor
    try:
        wait_for(lambda: owns(state, ns, "w1"), what="w1 to own partitions")
        engine.send_signal(signal.SIGSTOP)  # its runs' timers come due while it sleeps
        wait_for(
            lambda: len(owns(state, ns, "w2")) == PARTITIONS,
            timeout=60,
            what="w2 to take w1's partitions over",
        )
        results = {f"run-{i}": client.result(f"run-{i}", timeout=180) for i in range(runs)}
        assert set(results.values()) == {"rested"}
        engine.send_signal(signal.SIGCONT)  # the zombie wakes with due timers in hand
        # It learns it is fenced: its partitions are gone (lost), the transaction it tries
        # to commit is refused (its group generation is stale, KIP-447), or its producer
        # is fenced (the coordinator aborted its open transaction at the timeout).
        log = tmp_path / "w1.log"
        fenced = wait_for(
            lambda: [
                line
                for line in log.read_text().splitlines()
                if " lost" in line or "transaction aborted" in line or "fenced" in line
            ],
            timeout=60,
            what="the zombie to see it was fenced",
        )
        print(f"\nthe zombie, awake: {fenced[0][24:]}")
    finally:
        _stop(w1, w2)
    _check_journal(kafka_bootstrap, ns, runs)


def test_a_poison_step_among_healthy_runs_takes_only_its_own_run_down(
    kafka_bootstrap, ns, tmp_path
):
    """51 runs with a step in flight when the poison step kills the instance: the crash
    is nobody's fault yet, so nobody is charged, and the steps run again at once, side by
    side; that crashes too, so they run again one at a time, and only the one that kills
    the process while running alone is charged, until dead."""
    log, state = tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    env = {"RUNSTREAM_TEST_MAX_RECOVERY": "1", "RUNSTREAM_STEP_CONCURRENCY": "64"}
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, **env)
    healthy = [f"healthy-{i}" for i in range(50)]
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        _proved_member(client)
        for run_id in healthy:
            client.start("steady", 0.2, run_id=run_id, wait=False)
        client.start("poison", None, run_id="poison")
        with pytest.raises(runstream.RunFailed, match=r"dead: step .*crash was running alone"):
            client.result("poison", timeout=180)
        assert {client.result(r, timeout=120) for r in healthy} == set(healthy)
        assert worker.poll() is None  # the supervisor restarted the engine each time
    finally:
        _stop(worker)
    journal = read_topic(kafka_bootstrap, f"{ns}.journal")
    dead = {r["run_id"] for n, r, _ in journal if n == "RunDead"}
    assert dead == {"poison"}
    charged = {r["run_id"]: r["recoveries"] for n, r, _ in journal if n == "RunRecovered"}
    blamed = {r for r in healthy if charged.get(r)}  # recovered, never charged
    # If this fails, say why the engine processes ended (a crash step, or the watchdog
    # ending a Kafka call that hung on a loaded machine: that charges the run alone then).
    lines = (tmp_path / "w1.log").read_text().splitlines()
    exits = [x for x in lines if "exited with" in x or " CRITICAL " in x]
    facts = [(n, r) for n, r, _ in journal if r["run_id"] in blamed | {"poison"}]
    assert not blamed, (exits, facts)
    crashes = log.read_text().splitlines().count("crash")
    # ahead of its commit, in the crowd and recovered in it (free), alone (charged 1 <= 1),
    # alone again (dead)
    assert crashes == 5


def test_workflow_code_blocked_in_a_call_restarts_the_instance_and_is_parked(
    kafka_bootstrap, ns, tmp_path
):
    state = tmp_path / "state"
    state.mkdir()
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", RUNSTREAM_ACTIVATION_BUDGET="0.5")
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        client.start("block", None, run_id="blocker")
        wait_for(
            lambda: client.get_run("blocker").status == "parked",
            timeout=120,
            what="the blocked run parked",
        )
        assert "blocked in a call that never returned" in client.get_run("blocker").reason
        client.start("three_steps", 1, run_id="after")
        assert client.result("after", timeout=60) == 4
        assert worker.poll() is None
    finally:
        _stop(worker)
    assert "exited with 75" in (tmp_path / "w1.log").read_text()  # it restarted once


def test_a_final_stop_hands_the_partitions_over_at_once(kafka_bootstrap, ns, tmp_path):
    """With --leave-on-stop a stopped instance leaves the group at once: the runs of its
    partitions go on elsewhere well before the (here 45 s) session timeout."""
    state = tmp_path / "state"
    state.mkdir()
    env = {"RUNSTREAM_LEAVE_ON_STOP": "true", "RUNSTREAM_SESSION_TIMEOUT_MS": "45000"}
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", **env)
    w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", **env)
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        for i in range(8):  # both instances own partitions once these complete
            client.start("three_steps", i, run_id=f"warm-{i}")
        assert [client.result(f"warm-{i}", timeout=60) for i in range(8)] == list(range(3, 11))
        wait_for(lambda: owns(state, ns, "w1") and owns(state, ns, "w2"), what="both own")
        assert terminate(w1) == 0
        stopped = time.monotonic()
        for i in range(8):
            client.start("three_steps", i, run_id=f"after-{i}")
        assert [client.result(f"after-{i}", timeout=60) for i in range(8)] == list(range(3, 11))
        took = time.monotonic() - stopped
        assert took < 30, f"the partitions moved only after {took:.0f}s"
    finally:
        _stop(w1, w2)


def test_after_a_sigkill_the_steps_in_flight_run_again_at_once_side_by_side(
    kafka_bootstrap, ns, tmp_path
):
    """30 runs each in a 2 s step when their only instance is SIGKILLed: the restarted
    instance runs the 30 interrupted steps again at once, beside each other (a first crash
    is nobody's), not one run at a time; nobody is charged and every run completes. On
    each journal partition, every recovery is decided before any recovered step ends."""
    runs, log, state = 30, tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    env = {"RUNSTREAM_STEP_CONCURRENCY": "64"}
    worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, **env)
    run_ids = [f"run-{i}" for i in range(runs)]
    try:
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: len(owns(state, ns, "w1")) == PARTITIONS, what="w1 to own all")
        for run_id in run_ids:
            client.start("shifts", 2.0, run_id=run_id, wait=False)
        client.flush(30)
        wait_for(
            lambda: _started(kafka_bootstrap, ns) >= runs,
            timeout=60,
            what="every first step's start to be committed (its body is under way)",
        )
        kill(worker)
        worker = spawn_worker(kafka_bootstrap, ns, state, "w1", log, **env)
        assert {client.result(r, timeout=180) for r in run_ids} == {6}
    finally:
        _stop(worker)
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=30)
    recovered = [(r, m) for n, r, m in journal if n == "RunRecovered"]
    assert recovered, "the kill interrupted no step"
    assert {r["recoveries"] for r, _ in recovered} == {0}, "a first crash was charged"
    again = {(r["run_id"], r["seq"]) for r, _ in recovered}
    restarts = [
        r
        for n, r, _ in journal
        if n == "StepStarted" and (r["run_id"], r["seq"]) in again and r["attempt"] > 1
    ]
    assert len(restarts) == len(again) and not any(r["isolated"] for r in restarts)
    last_recovery = {m.partition(): m.offset() for _, m in recovered}  # read in order
    for n, r, m in journal:
        if n == "StepCompleted" and (r["run_id"], r["seq"]) in again:
            assert m.offset() > last_recovery[m.partition()], (r["run_id"], r["seq"])


def _started(bootstrap, ns):
    journal = read_topic(bootstrap, f"{ns}.journal", timeout=5)
    return sum(n == "StepStarted" for n, _, _ in journal)
