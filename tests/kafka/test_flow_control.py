"""Flow control on the real broker: limits hold across engine instances.

Two engine instances run as two processes (``runstream worker`` subprocesses importing
``tests.kafka.test_flow_control:app``), and every step body, whichever process runs it,
appends when it began and ended to one step log: the limits are global, not per
instance. Each limit is tested on local steps and on remote ones (a task group's own
limit), whose bodies two task workers, on threads of this process, run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

import runstream
from runstream.errors import RunFailed

from .kit import PARTITIONS, owns, read_topic, results, spawn_worker, terminate, wait_for

pytestmark = pytest.mark.kafka

APP = "tests.kafka.test_flow_control:app"


@contextmanager
def _body() -> Iterator[None]:
    """Log the body's beginning and end (one short O_APPEND write each: atomic enough)."""
    path = os.environ["RUNSTREAM_TEST_STEP_LOG"]
    with open(path, "a") as f:
        f.write(f"begin {time.time()!r} {os.getpid()}\n")
    try:
        yield
    finally:
        with open(path, "a") as f:
            f.write(f"end {time.time()!r} {os.getpid()}\n")


class Gauge:
    """What the step log says: when each body began (and in which process), and how
    many ran at once at most."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _lines(self) -> list[tuple[str, float, int]]:
        if not self.path.exists():
            return []
        lines = (line.split() for line in self.path.read_text().splitlines())
        return [(kind, float(at), int(pid)) for kind, at, pid in lines]

    @property
    def began(self) -> list[float]:
        return sorted(at for kind, at, _ in self._lines() if kind == "begin")

    @property
    def pids(self) -> set[int]:
        return {pid for _, _, pid in self._lines()}

    @property
    def most(self) -> int:
        now = most = 0
        # by time; at a tie an end counts first (a body that began as another ended)
        for kind, _, _ in sorted(self._lines(), key=lambda x: (x[1], x[0] == "begin")):
            now += 1 if kind == "begin" else -1
            most = max(most, now)
        return most


def _app(ns: str, bootstrap: str | None = None) -> runstream.App:
    app = runstream.App(ns, bootstrap)
    app.limit("narrow", concurrency=5)
    app.limit("paced", rate=50)
    app.limit("narrowtasks", concurrency=5)  # the limits of these task groups
    app.limit("pacedtasks", rate=50)

    @app.step(queue="narrow")
    def slow(n: int) -> int:
        with _body():
            time.sleep(0.05)
        return n

    @app.step(queue="paced")
    def ping(n: int) -> int:
        with _body():
            return n

    @app.step(group="narrowtasks")
    def slow_task(n: int) -> int:
        return slow(n)

    @app.step(group="pacedtasks")
    def ping_task(n: int) -> int:
        return ping(n)

    @app.workflow
    async def narrow(ctx: runstream.Context, n: int) -> int:
        return await ctx.step(slow, n)

    @app.workflow
    async def paced(ctx: runstream.Context, n: int) -> int:
        return await ctx.step(ping, n)

    @app.workflow
    async def narrow_remote(ctx: runstream.Context, n: int) -> int:
        return await ctx.step(slow_task, n)

    @app.workflow
    async def paced_remote(ctx: runstream.Context, n: int) -> int:
        return await ctx.step(ping_task, n)

    @app.workflow(concurrency_key=lambda order: order["customer"], max_queued=2)
    async def checkout(ctx: runstream.Context, order: dict) -> str:
        await ctx.wait_for_signal("paid")
        return order["id"]

    return app


# The App the engine processes run (namespace and broker from their environment).
app = _app(os.environ.get("RUNSTREAM_TEST_NS", "tunused"))


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


@pytest.fixture
def flow(kafka_bootstrap, ns, tmp_path, monkeypatch):
    """Two engine processes, once both own partitions (a rebalance would pause the limits'
    owner for seconds, which a rate measured over 20 s would feel), and the two task
    workers on threads; the client and the gauge of the step log."""
    log, state = tmp_path / "steps.log", tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("RUNSTREAM_TEST_STEP_LOG", str(log))  # for the task workers' bodies
    engines = [spawn_worker(kafka_bootstrap, ns, state, f"w{i}", log, APP) for i in (1, 2)]
    local = _app(ns, kafka_bootstrap)
    workers = [local.task_worker(g, concurrency=16) for g in ("narrowtasks", "pacedtasks")]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    # The task workers join their groups while the engines start: tasks granted before a
    # worker took its partitions would wait in the topic, and then run in a burst.
    for thread in threads:
        thread.start()
    try:

        def settled() -> bool:
            w1, w2 = owns(state, ns, "w1"), owns(state, ns, "w2")
            return bool(w1 and w2) and sorted(w1 + w2) == list(range(PARTITIONS))

        wait_for(settled, timeout=90, what="both instances to own partitions")
        client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engines' topics")
        yield client, Gauge(log), {e.pid for e in engines}
        client.close()
    finally:
        for worker, thread in zip(workers, threads, strict=True):
            worker.stop()
            thread.join(30)
        for engine in engines:
            if engine.poll() is None:
                terminate(engine)


def _engine_pids(supervisors: set[int]) -> set[int]:
    """The engine processes below the ``runstream worker`` supervisors."""
    return {c.pid for s in supervisors for c in psutil.Process(s).children()}


@pytest.mark.parametrize("workflow", ["narrow", "narrow_remote"])
def test_a_concurrency_limit_of_5_is_never_exceeded_across_two_instances(flow, workflow):
    client, gauge, supervisors = flow
    run_ids = [client.start(workflow, n, run_id=f"n{n}") for n in range(100)]
    done = results(client, run_ids, timeout=120)
    assert done == {f"n{n}": n for n in range(100)}
    assert len(gauge.began) == 100
    assert gauge.most == 5  # reached, never passed
    # local steps ran in both engine processes; remote ones in this one's task worker
    ran_in = _engine_pids(supervisors) if workflow == "narrow" else {os.getpid()}
    assert gauge.pids == ran_in and len(ran_in) == (2 if workflow == "narrow" else 1)


@pytest.mark.parametrize("workflow", ["paced", "paced_remote"])
def test_a_rate_limit_of_50_per_second_over_1000_steps_holds_within_10_percent(flow, workflow):
    client, gauge, supervisors = flow
    run_ids = [client.start(workflow, n, run_id=f"p{n}") for n in range(1000)]
    done = results(client, run_ids, timeout=180)
    assert done == {f"p{n}": n for n in range(1000)}
    began = gauge.began
    assert len(began) == 1000
    rate = (len(began) - 1) / (began[-1] - began[0])
    assert 45 <= rate <= 55, f"{rate:.1f} steps per second"
    ran_in = _engine_pids(supervisors) if workflow == "paced" else {os.getpid()}
    assert gauge.pids == ran_in


def test_runs_of_one_concurrency_key_go_one_at_a_time_and_a_full_queue_refuses(
    flow, kafka_bootstrap, ns
):
    client, _, _ = flow
    for i in range(4):
        client.start("checkout", {"id": f"a{i}", "customer": "ann"}, run_id=f"a{i}")
        if i < 3:  # each run's request reaches the limit from its own partition: in order
            what = f"the limit to have a{i}'s request"
            wait_for(lambda i=i: _asked(kafka_bootstrap, ns, f"a{i}"), timeout=60, what=what)
    client.start("checkout", {"id": "b0", "customer": "bob"}, run_id="b0")
    with pytest.raises(RunFailed, match="QueueFull: 2 runs wait for ~limit/checkout/ann"):
        client.result("a3", timeout=60)
    for i in range(3):  # one at a time, in start order: each waits for its signal
        wait_for(lambda i=i: _waits(kafka_bootstrap, ns, f"a{i}"), what=f"a{i} running")
        assert not any(_waits(kafka_bootstrap, ns, f"a{j}") for j in range(i + 1, 3))
        client.signal(f"a{i}", "paid", None)
        assert client.result(f"a{i}", timeout=60) == f"a{i}"
    client.signal("b0", "paid", None)  # another key: never waited for ann's runs
    assert client.result("b0", timeout=60) == "b0"


def _waits(bootstrap: str, ns: str, run_id: str) -> bool:
    journal = read_topic(bootstrap, f"{ns}.journal", timeout=2)
    return any(n == "SignalAwaited" and r["run_id"] == run_id for n, r, _ in journal)


def _asked(bootstrap: str, ns: str, run_id: str) -> bool:
    journal = read_topic(bootstrap, f"{ns}.journal", timeout=2)
    answers = ("PermitGranted", "PermitQueued")
    return any(n in answers and r.get("holder") == run_id for n, r, _ in journal)
