"""The task worker against the real broker, without an engine: the tests produce
StepTask records to ``<ns>.tasks.g`` themselves (in a transaction, as the engine does)
and read the worker's StepResult and Heartbeat commands back from ``<ns>.commands``.

A subprocess imports this module as ``tests.kafka.test_task_worker:app``; the namespace
comes from RUNSTREAM_TEST_NS and the step log from RUNSTREAM_TEST_STEP_LOG.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pydantic import BaseModel

import runstream
from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.engine.steps import StepContext
from runstream.schemas.codec import Codec
from runstream.schemas.records import StepTask
from runstream.settings import Settings
from runstream.taskworker import TaskWorker
from runstream.topics.admin import client_config, ensure_topics

from .kit import PARTITIONS, ROOT, kill, read_topic, wait_for

pytestmark = pytest.mark.kafka

GROUP = "g"


class Person(BaseModel):
    name: str


class Bodies:
    """What the step bodies of one App saw: how many ran at once, which ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.ran: Counter[str] = Counter()
        self.started = threading.Event()

    def enter(self, name: str) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.ran[name] += 1
        self.started.set()

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    if path:
        with open(path, "a") as f:  # O_APPEND: one short write per line
            f.write(line + "\n")


def make_app(ns: str, bootstrap: str | None, bodies: Bodies) -> runstream.App:
    app = runstream.App(ns, bootstrap)

    @app.step(group=GROUP, name="add")
    def add(x: int, y: int) -> int:
        bodies.enter("add")
        bodies.leave()
        return x + y

    @app.step(group=GROUP, name="greet")
    def greet(p: Person) -> str:
        assert isinstance(p, Person)  # rebuilt from its JSON by the type hint
        return f"hi {p.name}"

    @app.step(group=GROUP, name="slow")
    def slow(seconds: float) -> float:
        bodies.enter("slow")
        time.sleep(seconds)
        bodies.leave()
        return seconds

    @app.step(group=GROUP, heartbeat="600ms", name="beats")
    def beats(n: int, step: StepContext) -> int:
        for i in range(n):
            step.heartbeat({"i": i})
            time.sleep(0.02)
        return n

    @app.step(group=GROUP, heartbeat="10s", name="big_beat")
    def big_beat(size: int, step: StepContext) -> str:
        step.heartbeat("x" * size)
        return "done"

    @app.step(group=GROUP, name="logged")
    def logged(tag: str, seconds: float) -> str:
        _log(f"{tag} {os.getpid()} begin")
        time.sleep(seconds)
        _log(f"{tag} {os.getpid()} end")
        return tag

    @app.step(group=GROUP, name="quotes")
    def quotes(text: str) -> str:
        raise ValueError(f"cannot take {text}")

    @app.step(group="other", name="elsewhere")
    def elsewhere(x: int) -> int:
        return x

    @app.step
    def local(x: int) -> int:
        return x

    return app


# The App a `tasks serve` subprocess serves.
app = make_app(os.environ.get("RUNSTREAM_TEST_NS", "tunused"), None, Bodies())


# -- helpers -----------------------------------------------------------------------------


def _task(run_id: str, name: str, args: list[Any], seq: int = 1, **kw: Any) -> StepTask:
    return StepTask(
        run_id,
        seq,
        attempt=1,
        name=name,
        args=payload.dumps(args),
        attempt_id=f"{run_id}/{seq}/1/{uuid.uuid4().hex[:6]}",
        group=GROUP,
        sent_at_ms=time.time_ns() // 1_000_000,
        **kw,
    )


def produce(bootstrap: str, ns: str, items: list[StepTask | tuple[str, bytes]]) -> list[Any]:
    """Produce tasks (or raw (key, value) records) to the group's topic in one transaction,
    each on the partition of its key; their (partition, offset), in order."""
    producer = Producer(
        {**client_config(bootstrap), "transactional.id": f"test-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    placed: dict[int, tuple[int, int]] = {}
    codec = Codec.default()
    for i, item in enumerate(items):
        key, value = (
            (item.run_id.encode(), codec.encode(item)) if isinstance(item, StepTask) else item
        )
        if isinstance(key, str):
            key = key.encode()

        def delivered(err, msg, i=i):
            assert err is None, err
            placed[i] = (msg.partition(), msg.offset())

        producer.produce(
            f"{ns}.tasks.{GROUP}",
            value,
            key,
            partition=partition_for(key, PARTITIONS),
            on_delivery=delivered,
        )
    producer.commit_transaction(30)
    producer.flush(10)
    return [placed[i] for i in range(len(items))]


def commands(bootstrap: str, ns: str, kind: str) -> list[tuple[dict[str, Any], Any]]:
    return [(r, m) for n, r, m in read_topic(bootstrap, f"{ns}.commands") if n == kind]


def results_for(bootstrap: str, ns: str, n: int, timeout: float = 60) -> dict[str, dict]:
    """attempt id -> its (first) StepResult, once there are results for ``n`` attempts."""

    def enough() -> dict[str, dict] | None:
        out: dict[str, dict] = {}
        for r, _ in commands(bootstrap, ns, "StepResult"):
            out.setdefault(r["attempt_id"], r)
        return out if len(out) >= n else None

    return wait_for(enough, timeout=timeout, what=f"results for {n} tasks")


def committed(bootstrap: str, ns: str) -> dict[int, int]:
    """The task group's committed offset per partition (-1001: none)."""
    consumer = Consumer({**client_config(bootstrap), "group.id": f"{ns}.tasks.{GROUP}"})
    try:
        tps = [TopicPartition(f"{ns}.tasks.{GROUP}", p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


class Served:
    """A task worker on a thread of the test process."""

    def __init__(self, app: runstream.App, concurrency: int = 4, **kw: Any) -> None:
        settings = Settings(session_timeout_ms=6000)
        self.worker = TaskWorker(app, GROUP, concurrency=concurrency, settings=settings, **kw)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the task worker did not stop within 60 s"


@pytest.fixture
def setup(kafka_bootstrap, ns):
    """The namespace with its task topic, an App, what its bodies saw, a running worker
    factory; workers are stopped at the end."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS, task_groups=[GROUP])
    bodies = Bodies()
    the_app = make_app(ns, kafka_bootstrap, bodies)
    workers: list[Served] = []

    def serve(**kw: Any) -> Served:
        workers.append(Served(the_app, **kw))
        return workers[-1]

    yield the_app, bodies, serve
    for w in workers:
        if w.thread.is_alive():
            w.stop()


# -- tests -------------------------------------------------------------------------------


def test_each_task_gets_a_result_with_its_attempt_id_on_its_runs_partition(
    kafka_bootstrap, ns, setup
):
    _, bodies, serve = setup
    serve()
    tasks = [_task(f"r{i}", "add", [i, 10]) for i in range(12)]
    tasks.append(_task("r-model", "greet", [{"name": "ann"}]))
    produce(kafka_bootstrap, ns, tasks)
    got = results_for(kafka_bootstrap, ns, len(tasks))
    for t in tasks[:12]:
        r = got[t.attempt_id]
        assert (r["run_id"], r["seq"], r["attempt"], r["ok"]) == (t.run_id, 1, 1, True)
        assert payload.loads(r["output"]) == payload.loads(t.args)[0] + 10
        assert r["worker"].endswith(f":{os.getpid()}")
    assert payload.loads(got[tasks[-1].attempt_id]["output"]) == "hi ann"
    assert bodies.ran["add"] == 12
    answers = commands(kafka_bootstrap, ns, "StepResult")
    assert len(answers) == len(tasks)  # one each: nothing ran twice
    for r, msg in answers:
        assert msg.key() == r["run_id"].encode()
        assert msg.partition() == partition_for(msg.key(), PARTITIONS)


def test_a_task_delivered_again_to_the_same_worker_gets_its_result_again_not_a_second_body(
    kafka_bootstrap, ns, setup
):
    """A worker stopped (SIGSTOP) after sending a result and before committing the task's
    offset is given the task again when it wakes: CI's chaos run saw the body run twice,
    after the engine had committed the first result. Here the same task is on the topic
    twice, which delivers it again to the one worker."""
    _, bodies, serve = setup
    serve()
    task = _task("r-again", "add", [1, 2])
    produce(kafka_bootstrap, ns, [task, task])

    def two_results() -> list[dict] | None:
        got = [r for r, _ in commands(kafka_bootstrap, ns, "StepResult")]
        return got if len(got) >= 2 else None

    first, second = wait_for(two_results, timeout=60, what="two results")
    assert first == second  # the same attempt, the same result, sent twice
    assert payload.loads(first["output"]) == 3
    assert bodies.ran["add"] == 1


def test_unknown_steps_and_invalid_arguments_fail_for_good_with_a_clear_error(
    kafka_bootstrap, ns, setup
):
    _, bodies, serve = setup
    serve()
    unknown = _task("r1", "charge", [1])
    other_group = _task("r2", "elsewhere", [1])
    bad_args = _task("r3", "add", ["not a number", 1])
    not_a_list = dataclasses.replace(_task("r4", "add", []), args=b'{"x": 1}')
    tasks = [unknown, other_group, bad_args, not_a_list]
    produce(kafka_bootstrap, ns, tasks)
    got = results_for(kafka_bootstrap, ns, len(tasks))
    for t in tasks:
        r = got[t.attempt_id]
        assert (r["ok"], r["retryable"], payload.loads(r["output"])) == (False, False, None)
    registered = "add, beats, big_beat, greet, logged, quotes, slow"
    assert got[unknown.attempt_id]["error"] == (
        f"task group 'g' has no step 'charge' in this worker (registered: {registered})"
    )
    assert got[other_group.attempt_id]["error"].startswith(
        "task group 'g' has no step 'elsewhere' in this worker"
    )
    assert "is in group 'other'" in got[other_group.attempt_id]["error"]
    assert got[bad_args.attempt_id]["error"].startswith("arguments of step 'add' are invalid")
    assert "expected a JSON array of arguments" in got[not_a_list.attempt_id]["error"]
    assert bodies.ran["add"] == 0


def test_no_more_bodies_run_at_once_than_the_concurrency(kafka_bootstrap, ns, setup):
    _, bodies, serve = setup
    serve(concurrency=3, prefetch=2)  # holds 5 tasks at most: pauses and resumes
    tasks = [_task(f"r{i}", "slow", [0.3]) for i in range(15)]
    produce(kafka_bootstrap, ns, tasks)
    results_for(kafka_bootstrap, ns, len(tasks))
    assert bodies.ran["slow"] == 15
    assert bodies.peak == 3  # all slots were used, and never more


def test_a_task_past_its_deadline_is_skipped_and_committed_past(kafka_bootstrap, ns, setup):
    _, bodies, serve = setup
    now = time.time_ns() // 1_000_000
    late = _task("same-run", "add", [1, 1], seq=1, deadline_ms=now - 1000)
    timely = _task("same-run", "add", [2, 2], seq=2, deadline_ms=now + 600_000)
    placed = produce(kafka_bootstrap, ns, [late, timely])
    assert placed[0][0] == placed[1][0]  # one partition: the commit must pass the late one
    serve()
    got = results_for(kafka_bootstrap, ns, 1)
    assert list(got) == [timely.attempt_id] and bodies.ran["add"] == 1
    p, last = placed[1]
    wait_for(lambda: committed(kafka_bootstrap, ns)[p] == last + 1, what="the commit")
    assert len(commands(kafka_bootstrap, ns, "StepResult")) == 1


def test_an_undecodable_record_goes_to_the_dlq_and_the_next_task_runs(kafka_bootstrap, ns, setup):
    _, _, serve = setup
    after = _task("run-x", "add", [1, 2])
    placed = produce(kafka_bootstrap, ns, [("run-x", b"\xc3\x01 not avro"), after])
    serve()
    got = results_for(kafka_bootstrap, ns, 1)
    assert payload.loads(got[after.attempt_id]["output"]) == 3
    letters = wait_for(
        lambda: [r for n, r, _ in read_topic(kafka_bootstrap, f"{ns}.dlq") if n == "DeadLetter"],
        what="the dead letter",
    )
    (letter,) = letters
    assert (letter["code"], letter["source_topic"]) == ("undecodable", f"{ns}.tasks.g")
    assert (letter["partition"], letter["offset"]) == placed[0]
    assert (letter["key"], letter["value"]) == (b"run-x", b"\xc3\x01 not avro")
    assert "undecodable task record" in letter["reason"]
    p, last = placed[1]
    wait_for(lambda: committed(kafka_bootstrap, ns)[p] == last + 1, what="the commit")


def test_an_error_quoting_a_lone_surrogate_is_answered_cleaned_and_committed_past(
    kafka_bootstrap, ns, setup
):
    """Issue 19, defect 2: the result's error text could not be encoded, so the task was
    never answered and its partition's commit point stuck at it."""
    _, _, serve = setup
    cut = dataclasses.replace(_task("same-run", "quotes", []), args=b'["A\\ud83d"]')
    after = _task("same-run", "add", [1, 2], seq=2)
    placed = produce(kafka_bootstrap, ns, [cut, after])
    serve()
    got = results_for(kafka_bootstrap, ns, 2)
    r = got[cut.attempt_id]
    assert (r["ok"], r["retryable"], r["error"]) == (False, True, "ValueError: cannot take A\ufffd")
    assert "\ufffd" in r["traceback"]
    assert payload.loads(got[after.attempt_id]["output"]) == 3
    p, last = placed[1]
    assert placed[0][0] == p  # one partition: the commit must pass the first task
    wait_for(lambda: committed(kafka_bootstrap, ns)[p] == last + 1, what="the commit")


def test_heartbeats_arrive_throttled_to_a_third_of_the_interval(kafka_bootstrap, ns, setup):
    _, _, serve = setup
    serve()
    task = _task("hb-run", "beats", [60], heartbeat_ms=600)  # 60 calls over ~1.2 s
    big = _task("hb-big", "big_beat", [2_000_000], heartbeat_ms=10_000)
    produce(kafka_bootstrap, ns, [task, big])
    got = results_for(kafka_bootstrap, ns, 2)
    assert got[task.attempt_id]["ok"] and got[big.attempt_id]["ok"]
    beats = commands(kafka_bootstrap, ns, "Heartbeat")
    mine = sorted(
        (r for r, _ in beats if r["attempt_id"] == task.attempt_id), key=lambda r: r["sent_at_ms"]
    )
    assert payload.loads(mine[0]["details"]) == {"i": 0}  # the first goes at once
    body_ms = got[task.attempt_id]["duration_ms"]  # ~1.2 s, longer on a busy machine
    assert 3 <= len(mine) <= body_ms // 200 + 1 < 60  # one per 0.2 s at most, not one per call
    gaps = [b["sent_at_ms"] - a["sent_at_ms"] for a, b in itertools.pairwise(mine)]
    assert min(gaps) >= 190, gaps
    assert {(r["run_id"], r["seq"]) for r in mine} == {("hb-run", 1)}
    for r, msg in beats:
        assert msg.partition() == partition_for(r["run_id"].encode(), PARTITIONS)
    (oversize,) = [r for r, _ in beats if r["attempt_id"] == big.attempt_id]
    assert oversize["details"] is None  # dropped; the heartbeat itself still went


def test_a_stop_lets_the_running_body_finish_and_commits_it(kafka_bootstrap, ns, setup):
    _, bodies, serve = setup
    task = _task("stopping", "slow", [1.5])
    ((p, offset),) = produce(kafka_bootstrap, ns, [task])
    worker = serve()
    assert bodies.started.wait(60)
    worker.stop()
    assert worker.worker.stats["results"] == 1
    got = results_for(kafka_bootstrap, ns, 1, timeout=5)
    assert got[task.attempt_id]["ok"]
    assert committed(kafka_bootstrap, ns)[p] == offset + 1


@pytest.mark.slow
def test_a_sigkilled_worker_loses_no_task_and_reruns_only_uncommitted_ones(
    kafka_bootstrap, ns, tmp_path, monkeypatch
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS, task_groups=[GROUP])
    log = tmp_path / "steps.log"
    tasks = [_task(f"run-{i}", "logged", [f"t{i}", 0.2]) for i in range(50)]
    placed = dict(
        zip((t.attempt_id for t in tasks), produce(kafka_bootstrap, ns, tasks), strict=True)
    )
    env = {
        **os.environ,
        "RUNSTREAM_TEST_NS": ns,
        "RUNSTREAM_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "RUNSTREAM_TEST_STEP_LOG": str(log),
        "RUNSTREAM_SESSION_TIMEOUT_MS": "6000",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
    }
    # `runstream tasks serve`, with the tasks group alone (the CLI wiring is not ours)
    serve = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); "
        "from runstream.cli.tasks_cmd import tasks; tasks(sys.argv[1:])"
    )
    argv = ["serve", "tests.kafka.test_task_worker:app", "--group", GROUP, "--concurrency", "4"]

    def lines() -> list[list[str]]:  # [tag, pid, "begin" | "end"]
        return [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []

    with open(tmp_path / "worker.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", serve, *argv], env=env, cwd=ROOT, stdout=out, stderr=out
        )
    try:
        wait_for(
            lambda: sum(1 for ln in lines() if ln[2] == "end") >= 20,
            timeout=60,
            what="20 tasks done by the first worker",
        )
    finally:
        kill(proc)
    at_kill = committed(kafka_bootstrap, ns)
    first = [(tag, what) for tag, pid, what in lines() if pid == str(proc.pid)]
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(log))  # the bodies of the worker below
    second = Served(make_app(ns, kafka_bootstrap, Bodies()), concurrency=4)
    try:
        got = results_for(kafka_bootstrap, ns, len(tasks), timeout=120)
    finally:
        second.stop()

    tag_of = {payload.loads(t.args)[0]: t for t in tasks}
    for tag, t in tag_of.items():  # every task answered, with its own output
        assert got[t.attempt_id]["ok"] and payload.loads(got[t.attempt_id]["output"]) == tag
    runs = Counter(tag for tag, _, what in lines() if what == "begin")
    twice = {tag for tag, n in runs.items() if n > 1}
    in_flight = {tag for tag, what in first if what == "begin"} - {
        tag for tag, what in first if what == "end"
    }
    partition, offset = {}, {}
    for tag, t in tag_of.items():
        partition[tag], offset[tag] = placed[t.attempt_id]
    uncommitted = {tag for tag in tag_of if offset[tag] >= at_kill[partition[tag]]}
    assert in_flight, "the kill came while no body ran: nothing was tested"
    assert in_flight <= twice  # what ran at the kill ran again
    assert twice <= uncommitted  # nothing committed ran again
    assert set(runs) == set(tag_of) and max(runs.values()) <= 2


def test_the_task_consumer_never_hands_a_task_over_twice_after_an_offset_reset(kafka_bootstrap, ns):
    # An out-of-range fetch resets the task consumer to the partition's start
    # (auto.offset.reset=earliest): a task handed over before must not run again.
    from runstream.topics.spec import Topics
    from runstream.topics.tasklog import open_task_log

    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    log = open_task_log(
        Settings(bootstrap_servers=kafka_bootstrap), Topics(ns), "default", "w1", lambda: False
    )
    assert log is not None
    tasks = Producer(client_config(kafka_bootstrap))
    try:
        for i in range(6):
            tasks.produce(log.topic, f"task {i}".encode(), b"run", partition=0)
        tasks.flush(30)
        log.subscribe(lambda ps: None, lambda ps, lost: None)
        first = _poll_tasks(log, 6)
        assert [r.offset for r in first if r.partition == 0] == list(range(6))
        log._consumer.seek(TopicPartition(log.topic, 0, 0))  # the reset, as librdkafka does
        tasks.produce(log.topic, b"task 6", b"run", partition=0)
        tasks.flush(30)
        assert [r.offset for r in _poll_tasks(log, 1)] == [6]
    finally:
        log.close()


def _poll_tasks(log: Any, count: int, timeout: float = 60) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out += log.poll(0.2, 100)
    time.sleep(0.5)  # and nothing more comes
    return out + log.poll(0.2, 100)
