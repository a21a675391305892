"""Crash drills with real processes: kill engine instances and brokers under load, then
prove with the journal audit that nothing was lost, duplicated or left behind.

Each drill ends with ``audit(..., expect_finished=True)`` reporting no violation and an
exact account of step-body executions (`kit.check_ticks`): every tick of every run ran,
the journal recorded exactly one of its executions, none ran after that one (no committed
step ran again), and within one process a tick ran again only after its recovery.

- instance churn: 3 engine instances; runs of ``sleepy`` (1 s durable sleep) start at a
  steady rate while every 10 s one instance is SIGKILLed and restarted on its state dir;
- rebuild: after the churn, every instance's state is deleted and rebuilt from the
  journal; the projections must come back byte for byte;
- broker restart: a private single-node broker is SIGKILLed under load and restarted on
  its data dirs; the engine instances carry on without help;
- 3-node cluster: a private cluster, topics with replication 3 and min.insync.replicas 2;
  the broker that coordinates the engine's consumer group is SIGKILLed under load.

Every instance must also survive and stop cleanly on SIGTERM (exit 0): the engine
recovers without an operator (an instance whose Kafka call hangs ends itself, and the
supervisor of `runstream worker` starts it again; see BROKER_SETTLE_TIMEOUT).

Sizes: CI runs the whole suite on 2 cores within 90 minutes, so the churn drill starts 300
runs over 30 s of churn (3 kills) by default. RUNSTREAM_DRILL_FULL=1 runs the full drill:
1000 runs over 60 s of churn (6 kills, two per instance).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from types import SimpleNamespace

import pytest
from confluent_kafka.admin import AdminClient

import runstream
from runstream.audit import AuditReport, audit
from runstream.dev import localkafka
from runstream.engine.partitioner import partition_for
from runstream.topics.admin import client_config, describe_topics, ensure_topics
from runstream.topics.watchdog import EXIT_ABANDONED, EXIT_HUNG

from .kit import (
    PARTITIONS,
    SteadyStarts,
    check_ticks,
    journal_ends,
    kill,
    projection_copies,
    read_topic,
    results,
    spawn_worker,
    terminate,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FULL = os.environ.get("RUNSTREAM_DRILL_FULL") == "1"
CHURN_RUNS = 1000 if FULL else 300
CHURN_SECONDS = 60 if FULL else 30
KILL_EVERY = 10  # seconds between two SIGKILLs
INSTANCES = ("e0", "e1", "e2")
# Once the load and the hit are over, every run settles within seconds on a healthy engine;
# waiting much longer only delays the report of a stuck one.
SETTLE_TIMEOUT = 60


def _spawn(bootstrap, ns, state, name, log=None) -> subprocess.Popen[bytes]:
    # faulthandler: a SIGABRT makes a hung instance write every thread's stack to its log
    return spawn_worker(bootstrap, ns, state, name, log, PYTHONFAULTHANDLER="1")


def _stop(proc: subprocess.Popen[bytes]) -> int | str:
    """SIGTERM and wait; an instance that ignores it is dumped (SIGABRT) and reported."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        return terminate(proc, timeout=20)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(10)
        return "hung after SIGTERM (stacks in its log)"


def _client(ns: str, bootstrap: str) -> runstream.Client | None:
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def _journal(bootstrap: str, ns: str) -> list:
    return read_topic(bootstrap, f"{ns}.journal", timeout=60)


def _assert_clean(report: AuditReport) -> None:
    assert report.ok, "\n".join(str(v) for v in report.violations[:20])


def _unfinished(outputs: dict) -> dict[str, str]:
    """Runs whose result() did not give the output of a finished `sleepy`, with why."""
    return {run: repr(out) for run, out in outputs.items() if out != "rested"}


# -- instance churn ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def churned(kafka_bootstrap, tmp_path_factory):
    """Runs the churn drill once; the churn test checks it, the rebuild test reuses it."""
    ns = f"drill{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("churn")
    state, log = root / "state", root / "steps.log"
    state.mkdir()
    procs = {name: _spawn(kafka_bootstrap, ns, state, name, log) for name in INSTANCES}
    run_ids = [f"churn-{i}" for i in range(CHURN_RUNS)]
    began = time.monotonic()
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
    try:
        load = SteadyStarts(kafka_bootstrap, ns, "sleepy", 1.0, run_ids, CHURN_SECONDS)
        kills = []
        for k in range(CHURN_SECONDS // KILL_EVERY):
            time.sleep(max(0.0, began + (k + 1) * KILL_EVERY - time.monotonic()))
            name = INSTANCES[k % len(INSTANCES)]
            kill(procs[name])
            procs[name] = _spawn(kafka_bootstrap, ns, state, name, log)
            kills.append(f"{name}@{time.monotonic() - began:.0f}s")
        load.finish()
        churn_ended = time.monotonic()
        outputs = results(client, run_ids, timeout=SETTLE_TIMEOUT)
        settled_in = time.monotonic() - churn_ended
    finally:
        client.close()
        exits = {name: _stop(p) for name, p in procs.items()}
    print(
        f"\nchurn: {len(run_ids)} runs, kills {', '.join(kills)}; last run settled "
        f"{settled_in:.1f}s after the churn; instances exited {exits}"
    )
    return SimpleNamespace(
        ns=ns, state=state, log=log, run_ids=run_ids, outputs=outputs, exits=exits, root=root
    )


def test_instance_churn_loses_and_duplicates_nothing(churned, kafka_bootstrap):
    assert not _unfinished(churned.outputs)
    report = audit(kafka_bootstrap, churned.ns, expect_finished=True)
    _assert_clean(report)
    assert report.statuses == {"completed": len(churned.run_ids)}
    assert set(churned.exits.values()) == {0}, f"see the logs in {churned.root}: {churned.exits}"
    print(
        f"\nchurn audit: {report.facts} facts; "
        + check_ticks(churned.log, _journal(kafka_bootstrap, churned.ns), churned.run_ids)
    )


def test_rebuild_after_churn_restores_the_same_projections(churned, kafka_bootstrap):
    """What "the same" means: after churn a partition may have copies in several instance
    dirs, and only those whose stored journal offset is the journal's end are current (an
    instance that lost the partition keeps a copy that stopped where it lost it). Every
    current copy of a partition must be identical, and after deleting all state and
    restoring, every copy (restored by whichever instance took it) must equal them: facts,
    indexes and journal offset, byte for byte."""
    ns, state = churned.ns, churned.state
    ends = journal_ends(kafka_bootstrap, ns)
    assert sorted(ends) == list(range(PARTITIONS))
    before = {}
    for p, copies in projection_copies(state).items():
        current = [dump for offset, dump in copies.values() if offset == ends[p]]
        assert current, f"no projection of partition {p} reached the journal's end"
        assert all(dump == current[0] for dump in current), f"current copies of p{p} differ"
        before[p] = current[0]
    assert sorted(before) == list(range(PARTITIONS))

    shutil.rmtree(state)
    state.mkdir()
    began = time.monotonic()
    procs = [_spawn(kafka_bootstrap, ns, state, name) for name in INSTANCES]
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="topics")
    try:
        probes = {partition_for(r.encode(), PARTITIONS): r for r in churned.run_ids}
        for run_id in probes.values():  # answered only once its partition is restored
            assert wait_for(lambda r=run_id: _status(client, r), timeout=120) == "completed"
        restored_in = time.monotonic() - began
    finally:
        client.close()
        exits = [_stop(proc) for proc in procs]
    assert exits == [0] * len(procs), exits
    after = projection_copies(state)
    assert sorted(after) == list(range(PARTITIONS))
    for p, copies in after.items():
        for instance, (offset, dump) in copies.items():
            assert offset == ends[p], f"{instance}'s copy of p{p} is at {offset}, not {ends[p]}"
            assert dump == before[p], f"{instance}'s rebuilt copy of p{p} differs"
    keys = sum(len(d) for d in before.values())
    print(
        f"\nrebuild: {keys} projection entries of {PARTITIONS} partitions restored and "
        f"answering in {restored_in:.1f}s, equal to the churned ones"
    )


def _status(client: runstream.Client, run_id: str) -> str | None:
    try:
        return client.get_run(run_id, timeout=5).status
    except TimeoutError:
        return None


# -- brokers ------------------------------------------------------------------------------------


def _private_kafka(tmp_path, nodes: int) -> localkafka.LocalKafka:
    libs = localkafka.ensure_jars(progress=lambda _: None)
    return localkafka.LocalKafka(tmp_path / "kafka", nodes=nodes, libs=libs, die_with_parent=True)


def _drill_under_load(
    bootstrap, ns, tmp_path, instances, runs, seconds, hit_at, hit, settle=SETTLE_TIMEOUT
):
    """Start ``runs`` sleepy runs over ``seconds`` with ``instances`` engine processes, call
    ``hit()`` ``hit_at`` seconds in, wait for every run, stop the instances, audit."""
    state, log = tmp_path / "state", tmp_path / "steps.log"
    state.mkdir()
    procs = [_spawn(bootstrap, ns, state, name, log) for name in instances]
    run_ids = [f"run-{i}" for i in range(runs)]
    client = wait_for(lambda: _client(ns, bootstrap), what="topics")
    try:
        began = time.monotonic()
        load = SteadyStarts(bootstrap, ns, "sleepy", 1.0, run_ids, seconds)
        time.sleep(hit_at)
        what = hit()
        back_after = time.monotonic() - began - hit_at
        load.finish()
        # Starts are idempotent by run id: send them all again, as a client that saw a
        # delivery failure would, so a start Kafka refused while its broker died counts.
        for run_id in run_ids:
            client.start("sleepy", 1.0, run_id=run_id, wait=False)
        client.close()
        client = runstream.Client(ns, bootstrap)
        outputs = results(client, run_ids, timeout=settle)
        took = time.monotonic() - began
    finally:
        client.close()
        exits = [_stop(proc) for proc in procs]  # 0: alive, and stopped cleanly on SIGTERM
    report = audit(bootstrap, ns, expect_finished=True)
    journal = _journal(bootstrap, ns)  # read now: the caller may stop its private broker
    summary = (
        f"{load.undelivered or 'every start delivered'}; "
        f"{runs} runs started over {seconds}s; {what} at {hit_at}s, back after "
        f"{back_after:.1f}s; all settled {took:.1f}s after the first start; instances "
        f"exited {exits}"
    )
    return SimpleNamespace(
        outputs=outputs,
        report=report,
        journal=journal,
        log=log,
        run_ids=run_ids,
        exits=exits,
        summary=summary,
    )


def _assert_drill(d: SimpleNamespace, tmp_path) -> str:
    assert not _unfinished(d.outputs), d.summary
    _assert_clean(d.report)
    steps = check_ticks(d.log, d.journal, d.run_ids)
    # 0: stopped cleanly on SIGTERM. EXIT_HUNG: the watchdog ended a transactional call
    # librdkafka was stuck in (the hang these drills exist for); EXIT_ABANDONED: SIGTERM
    # came while it was stuck, and the instance stopped without waiting for it.
    allowed = {0, EXIT_HUNG, EXIT_ABANDONED}
    assert set(d.exits) <= allowed, f"see the instance logs in {tmp_path}: {d.summary}"
    return steps


# These drills found that librdkafka can block forever in send_offsets_to_transaction
# while the group coordinator is down (librdkafka issues 5456, 5511): the engine's
# watchdog now ends such a process after 45 s and `runstream worker`'s supervisor starts
# it again, so runs may take a minute longer to settle here.
BROKER_SETTLE_TIMEOUT = 150


def _broker_drill(bootstrap, ns, tmp_path, hit):
    """Two instances, 200 runs started over 20 s, ``hit()`` the brokers 8 s in."""
    return _drill_under_load(
        bootstrap, ns, tmp_path, ("e0", "e1"), 200, 20, 8, hit, settle=BROKER_SETTLE_TIMEOUT
    )


BROKER_DOWN = 30  # seconds the broker stays away


def test_broker_sigkilled_for_30s_under_load(tmp_path):
    """The instances wait the outage out without flooding their logs, carry on by
    themselves when the broker is back, and the audit is clean."""
    kafka = _private_kafka(tmp_path, nodes=1)
    bootstrap = kafka.start()
    ns = f"drill{uuid.uuid4().hex[:8]}"
    outage: list[float] = []

    def restart_broker() -> str:
        kafka.kill_node(0)
        outage.append(time.time())
        time.sleep(BROKER_DOWN)
        kafka.restart_node(0)
        outage.append(time.time())
        return f"broker SIGKILLed for {BROKER_DOWN}s, then restarted"

    try:
        drill = _broker_drill(bootstrap, ns, tmp_path, restart_broker)
    finally:
        kafka.stop()
    lines = {
        name: _lines_between(tmp_path / f"{name}.log", outage[0], outage[1] + 10)
        for name in ("e0", "e1")
    }
    print(f"\nbroker outage: {drill.summary}; log lines during the outage {lines}")
    print("broker outage audit: " + _assert_drill(drill, tmp_path))
    assert all(n <= 60 for n in lines.values()), lines


def _lines_between(path, start: float, end: float) -> int:
    """Log lines of an instance stamped between two wall-clock times (a traceback's lines
    count with the entry they belong to)."""
    count, inside = 0, False
    for line in path.read_text().splitlines():
        try:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            inside = start - 1 <= stamp <= end
        except ValueError:
            pass  # a continuation line
        count += inside
    return count


def test_one_of_three_brokers_sigkilled_under_load(tmp_path):
    kafka = _private_kafka(tmp_path, nodes=3)
    bootstrap = kafka.start()
    ns = f"drill{uuid.uuid4().hex[:8]}"
    try:
        ensure_topics(bootstrap, ns, PARTITIONS, 3)  # before any instance: they would use RF 1
        for topic in describe_topics(bootstrap, ns):
            assert topic["replication"] == 3 and topic["configs"]["min.insync.replicas"] == "2"

        def kill_coordinator() -> str:
            # the broker coordinating the engine's group: the harder one to lose
            admin = AdminClient(client_config(bootstrap))
            group = f"{ns}.engine"
            desc = admin.describe_consumer_groups([group])[group].result(10)
            node = desc.coordinator.id - 1  # node.id = index + 1
            kafka.kill_node(node)
            return f"node {node} (group coordinator) SIGKILLed"

        drill = _broker_drill(bootstrap, ns, tmp_path, kill_coordinator)
    finally:
        kafka.stop()
    print(f"\n3-node cluster: {drill.summary}")
    print("3-node audit: " + _assert_drill(drill, tmp_path))


def test_a_start_kafka_never_took_raises_and_sending_it_again_is_idempotent(tmp_path):
    """A start produced while the broker is down is reported (CommandNotDelivered), never
    dropped silently; the client sends it again once Kafka is back, and the run starts once."""
    kafka = _private_kafka(tmp_path, nodes=1)
    bootstrap = kafka.start()
    ns = f"drill{uuid.uuid4().hex[:8]}"
    state = tmp_path / "state"
    state.mkdir()
    worker = None
    try:
        ensure_topics(bootstrap, ns, PARTITIONS)
        client = runstream.Client(ns, bootstrap, settings=runstream.Settings(send_timeout=3))
        kafka.kill_node(0)
        with pytest.raises(runstream.CommandNotDelivered, match="StartRun for run 'once'"):
            client.start("three_steps", 1, run_id="once")
        with contextlib.suppress(runstream.CommandNotDelivered):
            client.close()
        kafka.restart_node(0)
        worker = _spawn(bootstrap, ns, state, "w1")
        client = wait_for(lambda: _client(ns, bootstrap), what="the broker back")
        client.start("three_steps", 1, run_id="once")
        client.start("three_steps", 1, run_id="once")  # a retry of the retry: no second run
        assert client.result("once", timeout=60) == 4
        client.close()
        journal = audit(bootstrap, ns, expect_finished=True)
        _assert_clean(journal)
        assert journal.runs == 1 and journal.statuses == {"completed": 1}
    finally:
        if worker is not None:
            _stop(worker)
        kafka.stop()
