"""Flow control on the real broker: limits hold across engine instances.

Two engine instances run in this process, so the step bodies of both can count what
runs at once and when each starts: the limits are global, not per instance. Each limit
is tested on local steps and on remote ones (a task group's own limit), whose bodies
two task workers, also in this process, run.
"""

from __future__ import annotations

import threading
import time

import pytest

import runstream
from runstream.errors import RunFailed

from .kit import PARTITIONS, ThreadWorker, owns, read_topic, results, wait_for

pytestmark = pytest.mark.kafka


class Gauge:
    """How many bodies run at once (and the most ever), and when each began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.began: list[float] = []

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.began.append(time.time())

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def _app(ns: str, bootstrap: str, gauge: Gauge) -> runstream.App:
    app = runstream.App(ns, bootstrap)
    app.limit("narrow", concurrency=5)
    app.limit("paced", rate=50)
    app.limit("narrowtasks", concurrency=5)  # the limits of these task groups
    app.limit("pacedtasks", rate=50)

    @app.step(queue="narrow")
    def slow(n: int) -> int:
        with gauge:
            time.sleep(0.05)
        return n

    @app.step(queue="paced")
    def ping(n: int) -> int:
        with gauge:
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


def _engines(app, tmp_path, ns):
    """Two instances, once both own partitions (a rebalance would pause the limits'
    owner for seconds, which a rate measured over 20 s would feel)."""
    state = tmp_path / "state"
    engines = [ThreadWorker(app, state, instance=f"w{i}") for i in (1, 2)]

    def settled() -> bool:
        w1, w2 = owns(state, ns, "w1"), owns(state, ns, "w2")
        return bool(w1 and w2) and sorted(w1 + w2) == list(range(PARTITIONS))

    wait_for(settled, timeout=60, what="both instances to own partitions")
    return engines


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


@pytest.fixture
def flow(kafka_bootstrap, ns, tmp_path):
    gauge = Gauge()
    app = _app(ns, kafka_bootstrap, gauge)
    engines = _engines(app, tmp_path, ns)
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the engines' topics")
    workers = [app.task_worker(g, concurrency=16) for g in ("narrowtasks", "pacedtasks")]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    yield client, gauge
    client.close()
    for worker, thread in zip(workers, threads, strict=True):
        worker.stop()
        thread.join(30)
    for engine in engines:
        engine.stop()


@pytest.mark.parametrize("workflow", ["narrow", "narrow_remote"])
def test_a_concurrency_limit_of_5_is_never_exceeded_across_two_instances(flow, workflow):
    client, gauge = flow
    run_ids = [client.start(workflow, n, run_id=f"n{n}") for n in range(100)]
    done = results(client, run_ids, timeout=120)
    assert done == {f"n{n}": n for n in range(100)}
    assert len(gauge.began) == 100
    assert gauge.most == 5  # reached, never passed


@pytest.mark.parametrize("workflow", ["paced", "paced_remote"])
def test_a_rate_limit_of_50_per_second_over_1000_steps_holds_within_10_percent(flow, workflow):
    client, gauge = flow
    run_ids = [client.start(workflow, n, run_id=f"p{n}") for n in range(1000)]
    done = results(client, run_ids, timeout=180)
    assert done == {f"p{n}": n for n in range(1000)}
    began = sorted(gauge.began)
    rate = (len(began) - 1) / (began[-1] - began[0])
    assert 45 <= rate <= 55, f"{rate:.1f} steps per second"


def test_runs_of_one_concurrency_key_go_one_at_a_time_and_a_full_queue_refuses(
    flow, kafka_bootstrap, ns
):
    client, _ = flow
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
