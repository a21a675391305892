"""Where the time of one W1 or W3 run goes: ``python -m benchmarks.trace [W1|W3|W3b] [flags]``.

Runs one engine process with hooks around its Kafka calls (nothing is added to the
engine's code: the hooks wrap methods from outside, in this tool's process only), drives
sequential W1 or W3 runs from a client with a hook on its reply listener, and prints, for
the slowest runs and as percentiles over all, how long each hop took:

    send     client's start/signal until Kafka acknowledged it (the flush)
    to_poll  acknowledged until the engine's poll returned the command
    decide   poll returned until the transaction began (decide, and the chain of steps)
    commit   the transaction: begin, produce, send offsets, commit (each apart too)
    more     further transactions of the run (a chain that ran out of budget)
    reply    the last commit returned until the client's listener got the reply
    wake     reply received until result() returned

W8 (W1's three steps served by a task-worker process, hooked the same way) splits each
remote step instead, summed over the run's three steps:

    task     a transaction committed until the task worker's poll returned its task
    body     the task polled until its result was handed to the producer
    result   the result handed over until the engine's poll returned it
    decide2  the result polled until the next transaction began
    commit2  those transactions

Each engine event is a JSON line with its wall time (ms) in a file beside the work dir.
``--debug eos,fetch`` adds librdkafka's own debug contexts to the engine's log (kept with
``--keep``). Meant for a quiet machine: the hooks cost a little, not the tail.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

TRACE_ENV = "RUNSTREAM_TRACE_FILE"
TASKS_TRACE_ENV = "RUNSTREAM_TRACE_TASKS_FILE"


# ----------------------------------------------------------------- the engine side


def _emitter(path: str) -> Callable[..., None]:
    """``emit(ev, **fields)``: one JSON line with the wall time (ms) appended to ``path``."""
    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def emit(ev: str, **kw: Any) -> None:
        out.write(json.dumps({"t": time.time() * 1000, "ev": ev, **kw}) + "\n")

    return emit


def _unlogged(module: Any) -> None:
    """With RUNSTREAM_KAFKA_DEBUG, ``module``'s clients write librdkafka's own lines (with
    its timestamps) to stderr, not through Python logging."""
    if not os.environ.get("RUNSTREAM_KAFKA_DEBUG"):
        return
    config = module.client_config

    def unlogged(*a: Any, **kw: Any) -> dict[str, Any]:
        return {k: v for k, v in config(*a, **kw).items() if k != "logger"}

    module.client_config = unlogged


def _hooks(path: str) -> None:
    """Wrap the engine's poll, its transaction calls and its batch commit with events."""
    from runstream import worker
    from runstream.topics import kafka

    emit = _emitter(path)

    poll = kafka.KafkaLog.poll

    def traced_poll(self: kafka.KafkaLog, timeout: float, limit: int) -> list[Any]:
        t0 = time.time() * 1000
        records = poll(self, timeout, limit)
        if records:
            keys = [(r.key or b"").decode(errors="replace") for r in records]
            emit("poll", t0=t0, wait=timeout, keys=keys, ts=[r.timestamp_ms for r in records])
        return records

    kafka.KafkaLog.poll = traced_poll  # type: ignore[method-assign]

    _unlogged(kafka)

    for name in ("begin", "send_offsets", "commit"):
        call = getattr(kafka.KafkaLog, name)

        def timed(self: Any, *a: Any, _call: Callable[..., Any] = call, _n: str = name) -> Any:
            t0 = time.time() * 1000
            try:
                return _call(self, *a)
            finally:
                emit(_n, t0=t0)

        setattr(kafka.KafkaLog, name, timed)

    commit = worker.commit

    def traced_commit(engine_log: Any, b: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.time() * 1000
        try:
            return commit(engine_log, b, *a, **kw)
        finally:
            emit("txn", t0=t0, runs=list(b.runs), facts=len(b.effects.facts))

    worker.commit = traced_commit  # type: ignore[assignment]


def _task_hooks(path: str) -> None:
    """Wrap the task worker's poll and its result sends with events."""
    from runstream.topics import tasklog

    emit = _emitter(path)
    _unlogged(tasklog)
    poll, send = tasklog.TaskLog.poll, tasklog.TaskLog.send

    def traced_poll(self: tasklog.TaskLog, timeout: float, limit: int) -> list[Any]:
        t0 = time.time() * 1000
        records = poll(self, timeout, limit)
        if records:
            keys = [(r.key or b"").decode(errors="replace") for r in records]
            emit("task_poll", t0=t0, keys=keys)
        return records

    def traced_send(self: tasklog.TaskLog, topic: str, partition: Any, key: Any, *a: Any) -> None:
        emit("result_send", key=(key or b"").decode(errors="replace"), topic=topic)
        send(self, topic, partition, key, *a)

    tasklog.TaskLog.poll = traced_poll  # type: ignore[method-assign]
    tasklog.TaskLog.send = traced_send  # type: ignore[method-assign]


def tasks_main(argv: list[str]) -> None:
    """``python -m benchmarks.trace tasks <runstream tasks serve args>``: hooked."""
    _task_hooks(os.environ[TASKS_TRACE_ENV])
    from runstream.cli.main import cli

    cli.main(["tasks", "serve", *argv], prog_name="runstream")


def engine_main(argv: list[str]) -> None:
    """``python -m benchmarks.trace engine <runstream worker args>``: the worker, hooked."""
    _hooks(os.environ[TRACE_ENV])
    from runstream.cli.main import cli

    cli.main(["worker", *argv, "--no-supervise"], prog_name="runstream")


# ----------------------------------------------------------------- the client side


def _listen(events: list[tuple[float, str, int]]) -> None:
    """Record when the client's reply listener got each record (and its timestamp)."""
    from runstream.topics import kafka

    poll = kafka.Listener.poll

    def traced(self: kafka.Listener, timeout: float) -> list[Any]:
        records = poll(self, timeout)
        now = time.time() * 1000
        events.extend((now, (r.key or b"").decode(), r.timestamp_ms) for r in records)
        return records

    kafka.Listener.poll = traced  # type: ignore[method-assign]


def _drive(workload: str, client: Any, lc: Any, runs: int, warmup: int) -> Iterator[dict[str, Any]]:
    """Sequential runs; per run its client-side times (ms, wall)."""
    from runstream.schemas.records import promise_id

    for i in range(warmup + runs):
        if workload in ("W1", "W8"):
            t0 = time.time() * 1000
            rid = client.start("w1", 1)
            sent = time.time() * 1000
            client.result(rid, timeout=60)
        else:
            flow = "wait_promise" if workload == "W3b" else "wait_signal"
            rid = client.start(flow, None, run_id=f"trace-{time.time_ns()}")
            if not lc.wait_run("suspended", rid, 30):
                raise RuntimeError(f"run {rid} never suspended")
            t0 = time.time() * 1000
            if workload == "W3b":
                client.resolve(promise_id(rid, 1), i)  # wait_promise's first operation
            else:
                client.signal(rid, "go", i)
            sent = time.time() * 1000
            client.result(rid, timeout=60)
        if i >= warmup:
            yield {"run": rid, "t0": t0, "sent": sent, "done": time.time() * 1000}


def _breakdown(run: dict[str, Any], engine: list[dict[str, Any]], replies: list[Any]) -> None:
    """Fill in ``run``'s hops from the engine's events and the replies received."""
    rid, t0, done = run["run"], run["t0"], run["done"]
    window = [e for e in engine if t0 <= e["t"] <= done + 1]
    polled = next((e for e in window if e["ev"] == "poll" and rid in e["keys"]), None)
    txns = [e for e in window if e["ev"] == "txn" and rid in e["runs"]]
    got = next((t for t, key, _ in replies if t0 <= t <= done + 1), None)
    hops: dict[str, float | None] = {"send": run["sent"] - t0}
    if polled is None or not txns or got is None:
        run["hops"], run["missing"] = hops, True
        return
    first, last = txns[0], txns[-1]
    hops["to_poll"] = polled["t"] - run["sent"]
    hops["decide"] = first["t0"] - polled["t"]
    hops["commit"] = first["t"] - first["t0"]
    hops["more"] = last["t"] - first["t"]
    hops["reply"] = got - last["t"]
    hops["wake"] = done - got
    calls = [e for e in window if e["ev"] in ("begin", "send_offsets", "commit")]
    inside = [e for e in calls if first["t0"] <= e["t0"] <= first["t"]]
    run["calls"] = {e["ev"]: round(e["t"] - e["t0"], 1) for e in inside}
    run["poll_wait"] = polled["wait"]
    run["poll_blocked"] = round(polled["t"] - polled["t0"], 1)
    run["txns"] = len(txns)
    run["hops"] = hops


def _remote_breakdown(run: dict[str, Any], engine: list[dict[str, Any]], tasks: list[Any]) -> None:
    """Split ``run``'s remote steps (W8): after each but the last of its transactions,
    the task's way to the worker, the body, the result's way back, the next decision and
    its commit; summed over the steps into ``run["hops"]``."""
    rid, t0, done = run["run"], run["t0"], run["done"]
    txns = [e for e in engine if e["ev"] == "txn" and rid in e["runs"] and t0 <= e["t"] <= done]
    polls = [e for e in engine if e["ev"] == "poll" and rid in e["keys"] and t0 <= e["t"] <= done]
    took = [e for e in tasks if e["ev"] == "task_poll" and rid in e["keys"]]
    took = [e for e in took if t0 <= e["t"] <= done]
    sent = [e for e in tasks if e["ev"] == "result_send" and e["key"] == rid]
    sent = [e for e in sent if t0 <= e["t"] <= done]
    names = ("task", "body", "result", "decide2", "commit2")
    sums = dict.fromkeys(names, 0.0)
    steps = []
    for before, after in itertools.pairwise(txns):
        send = next((e for e in sent if before["t0"] <= e["t"] <= after["t0"]), None)
        polled = next(
            (e for e in polls if send is not None and send["t"] <= e["t"] <= after["t0"]), None
        )
        fetched = next(
            (e for e in took if before["t0"] <= e["t"] <= (send or after)["t"]), None
        )  # the worker's poll that returned this run's task
        if send is None or polled is None or fetched is None:
            run["missing"] = True
            return
        step = {
            "task": fetched["t"] - before["t"],
            "body": send["t"] - fetched["t"],
            "result": polled["t"] - send["t"],
            "decide2": after["t0"] - polled["t"],
            "commit2": after["t"] - after["t0"],
        }
        steps.append(step)
        for k in names:
            sums[k] += step[k]
    run["hops"].update(sums)
    run["steps"] = [{k: round(v, 1) for k, v in st.items()} for st in steps]


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["engine"]:
        engine_main(argv[1:])
        return 0
    if argv[:1] == ["tasks"]:
        tasks_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.trace", description=__doc__)
    p.add_argument("workload", nargs="?", choices=("W1", "W3", "W3b", "W8"), default="W1")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--bootstrap", default=None, help="an existing broker (default: a local one)")
    p.add_argument("--debug", default="", help="librdkafka debug contexts for the engine")
    p.add_argument("--slowest", type=int, default=12, help="slow runs shown in full")
    p.add_argument("--warmup-seconds", type=float, default=30, help="W2 load first (broker JIT)")
    p.add_argument(
        "--broker-metrics", action="store_true", help="the broker's request metrics beside"
    )
    p.add_argument("--keep", action="store_true", help="keep the work dir (engine log, events)")
    p.add_argument(
        "--broker-config", action="append", default=[], help="KEY=VALUE for the local broker"
    )
    args = p.parse_args(argv)

    import runstream

    from .harness import Bench, Engine, Lifecycle, latency_stats, log, wait_ready
    from .workloads import W8_CONCURRENCY, _TaskWorkerProcess

    remote = args.workload == "W8"

    class TracedEngine(Engine):
        @property
        def command(self) -> list[str]:
            cmd = super().command  # [python, -m, runstream, worker, benchmarks.flows:app, ...]
            target = ["benchmarks.flows:remote_app"] if remote else cmd[4:5]
            return [sys.executable, "-m", "benchmarks.trace", "engine", *target, *cmd[5:]]

    class TracedTasks(_TaskWorkerProcess):
        @property
        def command(self) -> list[str]:
            cmd = super().command  # [python, -m, runstream, tasks, serve, ...]
            return [sys.executable, "-m", "benchmarks.trace", "tasks", *cmd[5:]]

    replies: list[tuple[float, str, int]] = []
    _listen(replies)
    broker = None
    overrides = dict(kv.split("=", 1) for kv in args.broker_config)
    with Bench(
        args.bootstrap, args.keep, broker_metrics=args.broker_metrics, broker_config=overrides
    ) as bench:
        if args.warmup_seconds > 0:
            from .workloads import warm_broker

            warm_broker(bench, args.warmup_seconds)
        if bench.broker_stats is not None:
            bench.broker_stats.since_last()  # not the warm-up's
        ns = bench.namespace(f"trace{args.workload}", 0)
        events = bench.work / "engine-trace.jsonl"
        env = {TRACE_ENV: str(events)}
        if args.debug:
            env["RUNSTREAM_KAFKA_DEBUG"] = args.debug
        task_events = bench.work / "tasks-trace.jsonl"
        tasks = None
        if remote:
            tasks = TracedTasks(bench, ns, W8_CONCURRENCY)
            tasks.env = {TASKS_TRACE_ENV: str(task_events)}
            if args.debug:
                tasks.env["RUNSTREAM_KAFKA_DEBUG"] = args.debug
            tasks.start()
        engine = TracedEngine(bench, ns, "bench-1", bench.state_dir(ns), env).start()
        wait_ready(bench, ns, [engine])
        lc = Lifecycle(bench.bootstrap, ns, b"trace-")
        try:
            with runstream.Client(ns, bench.bootstrap) as client:
                runs = list(_drive(args.workload, client, lc, args.runs, args.warmup))
        finally:
            lc.stop()
        if bench.broker_stats is not None:
            broker = bench.broker_stats.since_last()  # with the traced warm-up runs
        engine.stop()
        if tasks is not None:
            tasks.stop()
        engine_events = [json.loads(line) for line in events.read_text().splitlines()]
        worker_events = (
            [json.loads(line) for line in task_events.read_text().splitlines()] if remote else []
        )
        log(f"work dir {bench.work}; engine log {engine.logs[-1]}")
    for run in runs:
        _breakdown(run, engine_events, replies)
        if remote and "missing" not in run:
            _remote_breakdown(run, engine_events, worker_events)
    if args.keep:
        (bench.work / "runs.json").write_text(json.dumps(runs))
    _report(runs, args.slowest, latency_stats, remote)
    if broker is not None:
        from .brokerstats import summary

        print(summary(broker))
    return 0


def _report(
    runs: list[dict[str, Any]], slowest: int, stats: Callable[..., Any], remote: bool = False
) -> None:
    total = [r["done"] - r["t0"] for r in runs]
    print(f"{len(runs)} runs: total {_fmt(stats(total))}")
    edges = (5, 10, 15, 20, 30, 40, 50, 75, 100, 1e9)
    counts = [sum(lo <= t < hi for t in total) for lo, hi in zip((0, *edges), edges, strict=False)]
    print("  ms <" + " ".join(f"{e:>5g}" for e in edges[:-1]) + "  more")
    print("  runs" + " ".join(f"{c:>5}" for c in counts))
    names: tuple[str, ...] = ("send", "to_poll", "decide", "commit", "more", "reply", "wake")
    if remote:
        names = (*names[:4], "task", "body", "result", "decide2", "commit2", *names[5:])
    missing = sum(1 for r in runs if r.get("missing"))
    if missing:
        print(f"  {missing} runs not matched to their events (left out of the hops)")
    for name in names:
        values = [r["hops"][name] for r in runs if r["hops"].get(name) is not None]
        if values:
            print(f"  {name:8} {_fmt(stats(values))}")
    for call in ("begin", "send_offsets", "commit"):  # the first transaction's calls
        values = [r["calls"][call] for r in runs if call in r.get("calls", {})]
        if values:
            print(f"    {call:14} {_fmt(stats(values))}")
    print(f"slowest {slowest} (ms):")
    print("  total  " + " ".join(f"{n:>7}" for n in names) + "  txns  poll(wait, blocked)  calls")
    for r in sorted(runs, key=lambda r: r["t0"] - r["done"])[:slowest]:
        hops = " ".join(
            f"{r['hops'][n]:7.1f}" if r["hops"].get(n) is not None else "      -" for n in names
        )
        extra = f"{r.get('txns', '-'):>5}  ({r.get('poll_wait')}, {r.get('poll_blocked')})"
        print(f"  {r['done'] - r['t0']:5.1f}  {hops}  {extra}  {r.get('calls', {})}")
        if remote and r.get("steps"):
            print("         steps: " + "  ".join(str(st) for st in r["steps"]))


def _fmt(s: dict[str, float]) -> str:
    return " ".join(f"{k} {s[k]:.1f}" for k in ("p50", "p90", "p99", "max") if k in s)


if __name__ == "__main__":
    raise SystemExit(main())
