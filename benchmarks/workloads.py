"""The workloads of BENCHMARKS.md. Each takes the session and the parsed arguments, and
returns the JSON record and the one-line summary."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import runstream
from runstream.engine import payload
from runstream.schemas.records import promise_id

from .harness import (
    RESULTS,
    Bench,
    BenchError,
    Engine,
    Lifecycle,
    TopicWatcher,
    base_record,
    cpu_used,
    finish_record,
    floor_figures,
    fmt_spread,
    latency_stats,
    log,
    run_ids_per_partition,
    spread,
    tail,
    tree_cpu,
    wait_ready,
)

STEPS_PER_RUN = 3  # the W1 workflow


@contextlib.contextmanager
def engines(
    bench: Bench,
    ns: str,
    rep: dict[str, Any],
    instances: int = 1,
    env: dict[str, str] | None = None,
) -> Iterator[list[Engine]]:
    """Engine processes for one repeat, ready (warm-up done); stopped afterwards, with
    their exit codes, CPU time, log problems and the peak RSS recorded in ``rep``."""
    bench.sampler.reset()
    began = time.perf_counter()
    started = bench.engines_for(ns, instances, env, warm=False)
    try:
        from .harness import wait_ready

        wait_ready(bench, ns, started)
        rep["ready_s"] = round(time.perf_counter() - began, 2)
        yield started
    finally:
        bench.sampler.sample()
        rep["engine_cpu_s"] = round(bench.sampler.cpu_seconds("engine"), 2)
        rep["engine_processes"] = len(bench.sampler.seen.get("engine", ()))
        rep["peak_rss_mb"] = bench.sampler.peaks_mb()
        rep["engine_exit_codes"] = [e.stop() for e in bench.engines]
        problems = [p for e in bench.engines for p in e.problems()]
        if problems:
            rep["engine_log_problems"] = problems
        bench.engines = []
        rep["dlq_end_offsets"] = _end_offset_sum(bench.bootstrap, f"{ns}.dlq")


def _end_offset_sum(bootstrap: str, topic: str) -> int | None:
    """Sum of a topic's end offsets (0: nothing was ever written to it)."""
    from .harness import end_offsets

    try:
        return sum(tp.offset for tp in end_offsets(bootstrap, topic))
    except Exception as exc:  # a report, not a reason to lose the workload's figures
        log(f"could not read the end offsets of {topic}: {exc!r}")
        return None


def _new_rep(ns: str, repeat: int) -> dict[str, Any]:
    return {"repeat": repeat, "namespace": ns}


def _peak(reps: list[dict[str, Any]], group: str) -> float | None:
    vals = [r.get("peak_rss_mb", {}).get(group) for r in reps]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def _record_common(record: dict[str, Any], reps: list[dict[str, Any]]) -> None:
    record["repeats"] = reps
    record["peak_rss_mb"] = {
        "engine": _peak(reps, "engine"),
        "engine_largest_process": _peak(reps, "engine_largest_process"),
        "broker": _peak(reps, "broker"),
        "note": "max over repeats of the sampled peak (every 100 ms) of the summed RSS "
        "of the engine processes (each `runstream worker` and its descendants: the "
        "supervisor and the engine child) / of the largest single engine process / of "
        "the broker JVM",
    }


# ----------------------------------------------------------------- W1


def w1(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    runs = args.runs or 200
    warmup = 20 if args.warmup is None else args.warmup
    record = base_record(bench, "W1", "latency of a short workflow", argv)
    record["instances"] = 1
    record["params"] = {
        "runs": runs,
        "warmup": warmup,
        "repeat": args.repeat,
        "workflow": "w1: 3 sequential local steps (x + 1)",
        "measure": "one Client, sequentially: perf_counter before "
        "client.start('w1', 1) (wait=True) until client.result() returned",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W1", r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        with engines(bench, ns, rep), runstream.Client(ns, bench.bootstrap) as client:
            rep.update(_w1_latency(client, warmup, runs))
        log(
            f"W1 repeat {r + 1}: p50 {rep['latency_ms']['p50']:.1f} ms, "
            f"p99 {rep['latency_ms']['p99']:.1f} ms"
        )
    _record_common(record, reps)
    summary = {
        k: spread(rep["latency_ms"][k] for rep in reps) for k in ("p50", "p90", "p99", "mean")
    }
    record["summary"] = {"latency_ms": summary}
    floor = floor_figures()
    if floor is not None:
        txn = floor["summary"]["txn_commit_ms"]["p50"]["median"]
        hop = floor["summary"]["hop_ms"]["p50"]["median"]
        p50 = summary["p50"]["median"] if summary["p50"] else None
        record["floor_ratio"] = {
            "definition": "W1 p50 / floor txn-commit p50 (one transactional produce+commit "
            "of one record); the engine commits 4 transactions per W1 run (start, 3 steps) "
            "in sequence, plus the client's command and reply hops",
            "floor_txn_commit_p50_ms": txn,
            "floor_hop_p50_ms": hop,
            "ratio": round(p50 / txn, 2) if p50 else None,
            "floor_date": floor["date"],
        }
    record = finish_record(record)
    line = (
        f"W1: p50 {fmt_spread(summary['p50'], ' ms')}, p90 {fmt_spread(summary['p90'], ' ms')}, "
        f"p99 {fmt_spread(summary['p99'], ' ms')}, mean {fmt_spread(summary['mean'], ' ms')}; "
        f"{runs} runs x {args.repeat}"
    )
    if "floor_ratio" in record:
        line += f"; {record['floor_ratio']['ratio']}x floor txn p50"
    return record, line


def _settings(record: dict[str, Any], bench: Bench, ns: str) -> None:
    """Record the engine's settings once per workload (from its first namespace)."""
    from .harness import engine_settings

    if "settings" not in record:
        record["settings"] = engine_settings(bench.bootstrap, ns)


# ----------------------------------------------------------------- W2 / W6


def throughput(
    bench: Bench,
    ns: str,
    runs: int,
    in_flight: int,
    tag: str,
    timeout: float = 60,
    task_worker: Engine | None = None,
) -> dict[str, Any]:
    """Keep ``in_flight`` W1 runs started and not finished until ``runs`` finished;
    completions come from one read_committed consumer of the lifecycle topic. The CPU
    of ``task_worker`` (W8), over the same window, counts in the total."""
    lc = Lifecycle(bench.bootstrap, ns, tag.encode())
    client = runstream.Client(ns, bench.bootstrap)
    engine_pids = [e.pid for e in bench.engines if e.pid is not None]
    broker_pids, broker_source = bench.broker_pids()
    worker_pids = [task_worker.pid] if task_worker and task_worker.pid is not None else []
    try:
        ids = [f"{tag}{i}" for i in range(runs)]
        started = done = wrong = 0
        failed: list[str] = []
        cpu0 = (tree_cpu(engine_pids), tree_cpu(broker_pids), tree_cpu(worker_pids))
        t0 = time.perf_counter()
        t_last = t_said = t0
        while started < min(in_flight, runs):
            client.start("w1", 1, run_id=ids[started], wait=False)
            started += 1
        while done < runs:
            try:
                rid, kind, rec, now = lc.completions.get(timeout=timeout)
            except Exception as exc:
                raise BenchError(
                    f"no run finished for {timeout}s: {done}/{runs} done, {started} started"
                ) from exc
            done += 1
            t_last = now
            if now - t_said > 15:
                log(f"  {done}/{runs} runs finished, {done / (now - t0):.0f} runs/s")
                t_said = now
            if kind != "run.completed":
                failed.append(f"{rid}: {kind} {rec.get('error') or rec.get('reason')}")
            elif payload.loads(rec["output"]) != 4:
                wrong += 1
            if started < runs:
                client.start("w1", 1, run_id=ids[started], wait=False)
                started += 1
        wall = t_last - t0
        # CPU over the same window (to the last completion seen, a few ms after the fact)
        engine = cpu_used(cpu0[0], tree_cpu(engine_pids))
        broker = cpu_used(cpu0[1], tree_cpu(broker_pids)) if broker_pids else None
        cpu: dict[str, float | None] = {"engine": engine, "broker": broker}
        if task_worker is not None:
            cpu["task_worker"] = worker = cpu_used(cpu0[2], tree_cpu(worker_pids))
            engine += worker
        cpu["total"] = engine + broker if broker is not None else None
        dupes = sum(1 for n in lc.terminal_count.values() if n > 1)
        return {
            "runs": runs,
            "in_flight": in_flight,
            "wall_s": round(wall, 3),
            "runs_per_s": round(runs / wall, 1),
            "steps_per_s": round(runs * STEPS_PER_RUN / wall, 1),
            "not_completed": failed[:20],
            "not_completed_count": len(failed),
            "wrong_results": wrong,
            "duplicate_terminal_events": dupes,
            "cpu_s": {k: None if v is None else round(v, 3) for k, v in cpu.items()},
            "cpu_s_per_1000_runs": {
                k: None if v is None else round(1000 * v / runs, 3) for k, v in cpu.items()
            },
            "cpu_broker_source": broker_source,
        }
    finally:
        client.close()
        lc.stop()


def w2(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    runs, in_flight = args.runs or 2000, args.in_flight or 64
    record = base_record(bench, "W2", "throughput of the W1 workflow", argv)
    record["instances"] = 1
    record["params"] = {
        "runs": runs,
        "in_flight": in_flight,
        "repeat": args.repeat,
        "measure": "wall time from the first start to the last terminal "
        "lifecycle event seen by one read_committed consumer of all "
        "lifecycle partitions; starts are client.start(wait=False)",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W2", r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        with engines(bench, ns, rep):
            rep.update(throughput(bench, ns, runs, in_flight, f"w2-{r}-"))
        log(f"W2 repeat {r + 1}: {rep['runs_per_s']} runs/s ({rep['wall_s']} s)")
    _record_common(record, reps)
    summary: dict[str, Any] = {
        k: spread(rep[k] for rep in reps) for k in ("runs_per_s", "steps_per_s", "wall_s")
    }
    summary["cpu_s_per_1000_runs"] = {
        k: spread(rep["cpu_s_per_1000_runs"][k] for rep in reps)
        for k in ("engine", "broker", "total")
    }
    record["cpu_note"] = (
        "user+system CPU seconds from /proc (psutil cpu_times) of every `runstream worker` "
        "and its descendants (engine) and of the broker JVM (broker), over each repeat's "
        "measured window (first start to last completion), per 1,000 completed runs; broker: "
        + reps[-1]["cpu_broker_source"]
    )
    record["summary"] = summary
    floor = floor_figures()
    rps = summary["runs_per_s"]["median"] if summary["runs_per_s"] else None
    if floor is not None and rps:
        tps = floor["summary"]["batch_txns_per_s"]["median"]
        record["floor_ratio"] = {
            "definition": "W2 runs/s / floor txns/s (sequential transactions of "
            f"{floor['params']['batch_records']} records each from one producer); "
            "below 1 means fewer runs per second than the bare broker commits transactions",
            "floor_txns_per_s": tps,
            "floor_records_per_s": floor["summary"]["batch_records_per_s"]["median"],
            "ratio": round(rps / tps, 3),
            "floor_date": floor["date"],
        }
    record = finish_record(record)
    line = (
        f"W2: {fmt_spread(summary['runs_per_s'], ' runs/s')}, "
        f"{fmt_spread(summary['steps_per_s'], ' steps/s', 0)}; {runs} runs, "
        f"{in_flight} in flight x {args.repeat}; CPU per 1,000 runs: engine "
        f"{fmt_spread(summary['cpu_s_per_1000_runs']['engine'], ' s', 2)}, broker "
        f"{fmt_spread(summary['cpu_s_per_1000_runs']['broker'], ' s', 2)}"
    )
    if "floor_ratio" in record:
        line += f"; {record['floor_ratio']['ratio']}x floor txns/s"
    return record, line


def w6(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    runs, in_flight = args.runs or 2000, args.in_flight or 64
    counts = args.instances or [1, 2, 4]
    record = base_record(bench, "W6", "scale-out: W2 with several engine instances", argv)
    record["instances"] = counts
    record["params"] = {
        "runs": runs,
        "in_flight": in_flight,
        "repeat": args.repeat,
        "instances": counts,
        "measure": "as W2; each instance a separate "
        "process of the same consumer group (instance ids bench-1..N)",
    }
    reps: list[dict[str, Any]] = []
    for r in range(args.repeat):
        for n in counts:
            ns = bench.namespace(f"W6-{n}", r)
            _settings(record, bench, ns)
            rep = _new_rep(ns, r) | {"instances": n}
            reps.append(rep)
            with engines(bench, ns, rep, instances=n):
                rep.update(throughput(bench, ns, runs, in_flight, f"w6-{r}-{n}-"))
            log(f"W6 repeat {r + 1}, {n} instance(s): {rep['runs_per_s']} runs/s")
    _record_common(record, reps)
    by_n = {n: spread(rep["runs_per_s"] for rep in reps if rep["instances"] == n) for n in counts}
    base = by_n.get(1)
    record["summary"] = {
        "runs_per_s": {str(n): s for n, s in by_n.items()},
        "ratio_to_1": {
            str(n): round(s["median"] / base["median"], 2) for n, s in by_n.items() if s and base
        }
        if base
        else None,
    }
    record = finish_record(record)
    parts = [f"{n}: {fmt_spread(s, ' runs/s')}" for n, s in by_n.items()]
    ratios = record["summary"]["ratio_to_1"] or {}
    line = (
        f"W6: {'; '.join(parts)}; ratio to 1 instance "
        f"{', '.join(f'{n}: {v}x' for n, v in ratios.items())}; {runs} runs x {args.repeat}"
    )
    return record, line


def warm_broker(bench: Bench, seconds: float) -> None:
    """Unmeasured W2 load (rounds of 2,000 W1 runs, 64 in flight) on a throwaway
    namespace for ``seconds``, once per broker: a freshly started broker JVM is markedly
    slower until its JIT has compiled the transaction, fetch and group-commit paths (W2
    repeats on a cold broker ran at 390, 470, then a steady 530-550 runs/s)."""
    ns = bench.namespace("warmup", 0)
    rep: dict[str, Any] = {"namespace": ns, "seconds": seconds}
    log(f"warming the broker up for {seconds:g} s with W2 rounds (unmeasured)")
    began, rounds = time.monotonic(), []
    with engines(bench, ns, rep):
        while time.monotonic() - began < seconds:
            rounds.append(throughput(bench, ns, 2000, 64, f"warm-{len(rounds)}-")["runs_per_s"])
    bench.warmup = {
        "namespace": ns,
        "seconds": round(time.monotonic() - began, 1),
        "w2_rounds_runs_per_s": rounds,
    }
    log(f"broker warm-up: W2 rounds at {rounds} runs/s")


# ----------------------------------------------------------------- W3


def w3(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    return _round_trip(
        bench,
        args,
        argv,
        "W3",
        "signal",
        "wait_signal: await ctx.wait_for_signal('go'), return it",
        lambda client, rid, seq, i: client.signal(rid, "go", i),
    )


def w3b(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    """W3 with a durable promise resolved by a client (Restate's awakeable, W3b)."""
    return _round_trip(
        bench,
        args,
        argv,
        "W3b",
        "promise",
        "wait_promise: p = ctx.promise(); return await p",
        lambda client, rid, seq, i: client.resolve(promise_id(rid, seq), i),
    )


def _round_trip(
    bench: Bench,
    args: Any,
    argv: list[str],
    name: str,
    what: str,
    workflow: str,
    send: Callable[[runstream.Client, str, int, int], object],
) -> tuple[dict[str, Any], str]:
    runs = args.runs or 100
    warmup = 10 if args.warmup is None else args.warmup
    record = base_record(bench, name, f"{what} round trip", argv)
    record["instances"] = 1
    record["params"] = {
        "runs": runs,
        "warmup": warmup,
        "repeat": args.repeat,
        "workflow": workflow,
        "measure": "per run, sequentially: start it, wait until the lifecycle "
        f"topic shows it suspended on the {what}, then perf_counter from "
        f"sending the {what} (flushed) until client.result() returned",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace(name, r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        tag = f"{name.lower()}-{r}-"
        lc = Lifecycle(bench.bootstrap, ns, tag.encode())
        try:
            with engines(bench, ns, rep), runstream.Client(ns, bench.bootstrap) as client:
                lat, engine_ms, each, wrong = [], [], [], 0
                for i in range(warmup + runs):
                    rid = client.start(workflow.split(":")[0], None, run_id=f"{tag}{i}")
                    if not lc.wait_run("suspended", rid, 30):
                        raise BenchError(f"run {rid} never suspended on its {what}")
                    seq = 1  # wait_promise's promise is its first operation
                    sent_ms = time.time() * 1000
                    t0 = time.perf_counter()
                    send(client, rid, seq, i)
                    out = client.result(rid, timeout=60)
                    dt = (time.perf_counter() - t0) * 1000
                    wrong += out != i
                    if i >= warmup:
                        lat.append(dt)
                        each.append(_timed_run(sent_ms, dt))
                        lc.wait_run("terminal", rid, 10)
                        if rid in lc.terminal:
                            engine_ms.append(lc.terminal[rid][1]["at_ms"] - sent_ms)
                rep["round_trip_ms"] = latency_stats(lat)
                rep[f"{what}_to_completed_fact_ms"] = latency_stats(engine_ms)
                rep["wrong_results"] = wrong
                rep["runs_ms"] = each
        finally:
            lc.stop()
        log(
            f"{name} repeat {r + 1}: p50 {rep['round_trip_ms']['p50']:.1f} ms, "
            f"p99 {rep['round_trip_ms']['p99']:.1f} ms"
        )
    _record_common(record, reps)
    summary = {
        k: spread(rep["round_trip_ms"][k] for rep in reps) for k in ("p50", "p90", "p99", "mean")
    }
    record["summary"] = {"round_trip_ms": summary}
    floor = floor_figures()
    bare = floor["summary"].get("round_trip_ms") if floor is not None else None
    p50 = summary["p50"]["median"] if summary["p50"] else None
    if floor is not None and bare and p50:
        record["floor_ratio"] = {
            "definition": f"{name} p50 / floor round trip p50 (the same hops and transaction "
            "with no engine: a command consumed, a journal, a lifecycle and a reply record "
            "and the consumed offset committed in one transaction, the reply read)",
            "floor_round_trip_p50_ms": bare["p50"]["median"],
            "ratio": round(p50 / bare["p50"]["median"], 2),
            "floor_date": floor["date"],
        }
    record = finish_record(record)
    line = (
        f"{name}: {what} round trip p50 {fmt_spread(summary['p50'], ' ms')}, "
        f"p99 {fmt_spread(summary['p99'], ' ms')}; {runs} runs x {args.repeat}"
    )
    if "floor_ratio" in record:
        line += f"; {record['floor_ratio']['ratio']}x floor round trip p50"
    return record, line


# ----------------------------------------------------------------- W4


def w4(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    runs = args.runs or 200
    nap = args.sleep or 2.0
    record = base_record(bench, "W4", "crash while sleeping", argv)
    if args.supervisor_restart:
        record["result_name"] = "W4-supervisor"  # its own file: W4.json stays the default
    record["instances"] = 1
    record["params"] = {
        "runs": runs,
        "sleep_s": nap,
        "repeat": args.repeat,
        "workflow": "nap: step note(1), durable sleep, step note(2)",
        "kill": "the engine child only; its supervisor starts it again"
        if args.supervisor_restart
        else "`runstream worker` and every process below it; the harness starts it again",
        "measure": "start all runs; once the lifecycle topic shows every run "
        "suspended on its timer, SIGKILL the engine and start it again at "
        "once (same --instance and --state-dir); time from that restart "
        "(Popen, or the supervisor's new child seen) until the last terminal lifecycle event",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W4", r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        tag = f"w4-{r}-"
        step_log = bench.work / f"{ns}.steps.log"
        env = {"RUNSTREAM_BENCH_STEP_LOG": str(step_log)}
        lc = Lifecycle(bench.bootstrap, ns, tag.encode())
        journal = _JournalFacts(bench.bootstrap, ns, tag.encode())
        try:
            with (
                engines(bench, ns, rep, env=env) as (engine,),
                runstream.Client(ns, bench.bootstrap) as client,
            ):
                ids = [f"{tag}{i}" for i in range(runs)]
                t0 = time.perf_counter()
                for rid in ids:
                    client.start("nap", nap, run_id=rid, wait=False)
                client.close()  # flush
                all_asleep = lc.wait_count("suspended", runs, 60)
                t_kill, kill_ms = time.perf_counter(), time.time() * 1000
                asleep, done_before = len(lc.suspended), len(lc.terminal)
                asleep_ids = set(lc.suspended)
                rep["engine_rss_before_kill_mb"] = round(bench.sampler.rss("engine") / 2**20, 1)
                if args.supervisor_restart:
                    t_restart = _kill_engine_child(engine, rep)
                else:
                    rep["killed_exit_code"] = engine.kill()
                    t_restart = time.perf_counter()
                    engine.start()
                restart_ms = time.time() * 1000 - (time.perf_counter() - t_restart) * 1000
                rep["killed_after_s"] = round(t_kill - t0, 3)
                rep["asleep_at_kill"] = asleep
                rep["all_asleep_at_kill"] = all_asleep
                rep["completed_before_kill"] = done_before
                finished = lc.wait_count("terminal", runs, args.timeout or 180)
                t_done = max((t for _, _, t in lc.terminal.values()), default=t_restart)
                rep["restart_to_all_completed_s"] = (
                    round(t_done - t_restart, 3) if finished else None
                )
                rep["kill_to_all_completed_s"] = round(t_done - t_kill, 3) if finished else None
                journal.settle()
        finally:
            lc.stop()
            journal.stop()
        kinds = Counter(kind for kind, _, _ in lc.terminal.values())
        lines = step_log.read_text().splitlines() if step_log.exists() else []
        bodies = Counter(lines)
        dup_bodies = {k: n for k, n in bodies.items() if n > 1}
        rep.update(
            {
                "runs": runs,
                "completed": kinds.get("run.completed", 0),
                "runs_lost": runs - len(lc.terminal),
                "not_completed": {k: n for k, n in kinds.items() if k != "run.completed"},
                "runs_with_duplicate_terminal_events": sum(
                    n > 1 for n in lc.terminal_count.values()
                ),
                "step_bodies_run": len(lines),
                "step_bodies_expected": 2 * runs,
                "duplicated_step_executions": sum(n - 1 for n in dup_bodies.values()),
                "duplicated_step_examples": sorted(dup_bodies)[:10],
                "journal": journal.report(),
            }
        )
        # The restart cannot finish the runs before their timers are due: how late after
        # its due time did each run complete (RunCompleted at_ms - TimerScheduled due_ms)?
        due = {r["run_id"]: r["due_ms"] for n, r in journal.facts if n == "TimerScheduled"}
        late = [
            float(rec["at_ms"] - due[rid]) for rid, (_, rec, _) in lc.terminal.items() if rid in due
        ]
        rep["completed_after_due_ms"] = latency_stats(late)
        # Restart -> first decision: the first fact the new process recorded; on the way,
        # when its log said it was connecting (start-up and imports done) and restored.
        after = [at for _, rec in journal.facts if (at := rec.get("at_ms", 0)) >= restart_ms]
        rep["restart_to_first_decision_s"] = (
            round((min(after) - restart_ms) / 1000, 3) if after else None
        )
        rep["restart_to_s"] = _restart_phases(engine.logs[-1], restart_ms)
        # The recovery cost: restart -> all completed minus the sleep still due at the kill
        # (the latest timer of a run asleep then); the rest is the workload's own sleep.
        dues = [due[rid] for rid in asleep_ids if rid in due]
        rep["sleep_due_at_kill_s"] = (
            round(max(0.0, (max(dues) - kill_ms) / 1000), 3) if dues else None
        )
        rep["recovery_cost_s"] = (
            round(rep["restart_to_all_completed_s"] - rep["sleep_due_at_kill_s"], 3)
            if rep["restart_to_all_completed_s"] is not None and dues
            else None
        )
        log(
            f"W4 repeat {r + 1}: lost {rep['runs_lost']}, duplicated step executions "
            f"{rep['duplicated_step_executions']}, restart->first decision "
            f"{rep['restart_to_first_decision_s']} s, restart->all completed "
            f"{rep['restart_to_all_completed_s']} s"
        )
    _record_common(record, reps)
    keys = (
        "restart_to_first_decision_s",
        "restart_to_all_completed_s",
        "recovery_cost_s",
        "sleep_due_at_kill_s",
        "kill_to_all_completed_s",
        "runs_lost",
        "duplicated_step_executions",
    )
    summary = {k: spread(rep[k] for rep in reps) for k in keys}
    summary["completed_after_due_ms"] = {
        k: spread(rep["completed_after_due_ms"][k] for rep in reps) for k in ("p50", "max")
    }
    record["summary"] = summary
    record = finish_record(record)
    line = (
        f"W4: runs lost {fmt_spread(summary['runs_lost'], '', 0)}, duplicated step "
        f"executions {fmt_spread(summary['duplicated_step_executions'], '', 0)}, restart "
        f"-> first decision {fmt_spread(summary['restart_to_first_decision_s'], ' s', 2)}, "
        f"restart -> all completed {fmt_spread(summary['restart_to_all_completed_s'], ' s', 2)}, "
        f"recovery cost {fmt_spread(summary['recovery_cost_s'], ' s', 2)} "
        f"(kill -> all completed {fmt_spread(summary['kill_to_all_completed_s'], ' s', 2)}; "
        f"completed after due: max "
        f"{fmt_spread(summary['completed_after_due_ms']['max'], ' ms', 0)}); "
        f"{runs} runs x {args.repeat}"
        + ("; the supervisor restarted the engine" if args.supervisor_restart else "")
    )
    return record, line


def _kill_engine_child(engine: Engine, rep: dict[str, Any]) -> float:
    """SIGKILL only the engine process below `runstream worker`'s supervisor and wait
    until the supervisor has started a new one; returns when it did (perf_counter)."""
    children = engine.children()
    if not children:
        raise BenchError(
            "`runstream worker` has no child process to kill: is it running "
            "without its supervisor (--no-supervise)?"
        )
    old = {c.pid for c in children}
    for child in children:
        child.kill()
    rep["killed_engine_pids"] = sorted(old)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        fresh = [c for c in engine.children() if c.pid not in old]
        if fresh:
            return time.perf_counter()
        time.sleep(0.01)
    raise BenchError("the supervisor did not start a new engine process within 120 s")


_PHASES = {
    "connecting": re.compile(r"^(\S+ \S+) INFO runstream.worker: instance \S+: connecting"),
    "started": re.compile(r"^(\S+ \S+) INFO runstream.worker: instance \S+ of \S+ started"),
    "restored": re.compile(r"^(\S+ \S+) INFO runstream.worker: partitions .* restored"),
}


def _restart_phases(logfile: Path, restart_ms: float) -> dict[str, float]:
    """Seconds from the restart to the first of each `_PHASES` line the engine logged
    after it (its log's timestamps, ms)."""
    out: dict[str, float] = {}
    for line in logfile.read_text(errors="replace").splitlines():
        for phase, pattern in _PHASES.items():
            m = pattern.match(line)
            if m and phase not in out:
                at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
                if at >= restart_ms:
                    out[phase] = round((at - restart_ms) / 1000, 3)
    return out


class _JournalFacts:
    """Facts of runs with a key prefix, from ``<ns>.journal`` (from its end offsets now)."""

    def __init__(self, bootstrap: str, ns: str, key_prefix: bytes) -> None:
        self.facts: list[tuple[str, dict[str, Any]]] = []
        self.watcher = TopicWatcher(bootstrap, f"{ns}.journal", key_prefix, self._on)
        self._last = time.monotonic()

    def _on(self, name: str, rec: dict[str, Any], _now: float) -> None:
        self.facts.append((name, rec))
        self._last = time.monotonic()

    def settle(self, quiet: float = 1.0, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() - self._last < quiet and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        self.watcher.stop()

    def report(self) -> dict[str, Any]:
        completed = Counter((r["run_id"], r["seq"]) for n, r in self.facts if n == "StepCompleted")
        ended = Counter(r["run_id"] for n, r in self.facts if n == "RunCompleted")
        names = Counter(n for n, _ in self.facts)
        return {
            "facts": dict(sorted(names.items())),
            "step_completed_twice": sum(n > 1 for n in completed.values()),
            "run_completed_twice": sum(n > 1 for n in ended.values()),
            "runs_recovered": len({r["run_id"] for n, r in self.facts if n == "RunRecovered"}),
        }


# ----------------------------------------------------------------- W5

FACTS_PER_W1_RUN = 8  # RunStarted, 3 x (StepStarted, StepCompleted), RunCompleted
_RESTORED = re.compile(r"^(\S+ \S+) .*partition (\d+) restored: (\d+) facts in ([\d.]+)s")


def w5(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    runs = args.runs or -(-1_000_000 // FACTS_PER_W1_RUN)
    in_flight = args.in_flight or 256
    record = base_record(bench, "W5", "rebuild the projections from the journal", argv)
    record["instances"] = 1
    record["params"] = {
        "runs": runs,
        "facts_target": runs * FACTS_PER_W1_RUN,
        "fill_in_flight": in_flight,
        "repeat": args.repeat,
        "measure": "fill the journal with W1 runs through the engine (as W2, more in flight); "
        "stop the engine (SIGTERM), delete its state dir, start it again and at once send "
        "one new W1 run per partition. facts/s = facts restored / the sum of the "
        "per-partition restore times the engine logs; the wall figures run from the "
        "restart (Popen) to the last partition restored / the new runs completed",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W5", r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        with engines(bench, ns, rep) as (engine,):
            log(f"W5 repeat {r + 1}: filling the journal with {runs} W1 runs")
            rep["fill"] = throughput(bench, ns, runs, in_flight, f"w5-{r}-", timeout=120)
            log(
                f"W5 repeat {r + 1}: filled in {rep['fill']['wall_s']} s "
                f"({rep['fill']['runs_per_s']} runs/s)"
            )
            rep["stop_exit_code"] = engine.stop()
            state = engine.state_dir / ns / engine.instance
            rep["state_mb"] = _du_mb(state)
            shutil.rmtree(state)
            rep.update(_rebuild(bench, ns, engine, r, args.timeout or 1800))
        log(
            f"W5 repeat {r + 1}: {rep['facts_restored']} facts restored at "
            f"{rep['facts_per_s']} facts/s; new commands after "
            f"{rep['restart_to_all_new_runs_completed_s']} s"
        )
    _record_common(record, reps)
    keys = (
        "facts_restored",
        "facts_per_s",
        "facts_per_s_wall",
        "restore_wall_s",
        "restart_to_first_new_run_completed_s",
        "restart_to_all_new_runs_completed_s",
    )
    summary = {k: spread(rep.get(k) for rep in reps) for k in keys}
    record["summary"] = summary
    record = finish_record(record)
    line = (
        f"W5: {fmt_spread(summary['facts_restored'], ' facts', 0)} restored at "
        f"{fmt_spread(summary['facts_per_s'], ' facts/s', 0)} (wall "
        f"{fmt_spread(summary['facts_per_s_wall'], ' facts/s', 0)}); restart -> new commands "
        f"processed on every partition "
        f"{fmt_spread(summary['restart_to_all_new_runs_completed_s'], ' s', 2)}; "
        f"{runs} runs x {args.repeat}"
    )
    return record, line


def _rebuild(bench: Bench, ns: str, engine: Engine, r: int, timeout: float) -> dict[str, Any]:
    probes = run_ids_per_partition(f"w5probe-{r}")
    lc = Lifecycle(bench.bootstrap, ns, b"w5probe-")
    client = runstream.Client(ns, bench.bootstrap)
    try:
        t_wall, t0 = time.time(), time.perf_counter()
        engine.start()
        for rid in probes:
            client.start("w1", 1, run_id=rid, wait=False)
        client._producer.flush(30)
        done = lc.wait_count("terminal", len(probes), timeout)
        times = sorted(t for _, _, t in lc.terminal.values())
        out: dict[str, Any] = {
            "new_runs": len(probes),
            "new_runs_completed": sum(k == "run.completed" for k, _, _ in lc.terminal.values()),
            "restart_to_first_new_run_completed_s": round(times[0] - t0, 3) if times else None,
            "restart_to_all_new_runs_completed_s": round(times[-1] - t0, 3) if done else None,
        }
        # the rebuilt projection answers for old runs
        sample = [f"w5-{r}-{i}" for i in (0, 1, 2)]
        out["old_runs_status"] = {rid: client.get_run(rid, timeout=30).status for rid in sample}
    finally:
        client.close()
        lc.stop()
    restored = []
    for line in engine.logs[-1].read_text(errors="replace").splitlines():
        m = _RESTORED.match(line)
        if m:
            at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            restored.append((at, int(m[2]), int(m[3]), float(m[4])))
    facts = sum(f for _, _, f, _ in restored)
    work = sum(s for _, _, _, s in restored)
    wall = max((at for at, *_ in restored), default=t_wall) - t_wall
    out.update(
        {
            "partitions_restored": len({p for _, p, _, _ in restored}),
            "facts_restored": facts,
            "restore_work_s": round(work, 3),
            "facts_per_s": round(facts / work) if work else None,
            "restore_wall_s": round(wall, 3),
            "facts_per_s_wall": round(facts / wall) if wall > 0 else None,
            "per_partition": [{"partition": p, "facts": f, "s": s} for _, p, f, s in restored],
        }
    )
    return out


def _du_mb(path: Path) -> float:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return round(total / 2**20, 1)


# ----------------------------------------------------------------- W7


def w7(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    sleepers = 100_000 if args.sleepers is None else args.sleepers
    timers = args.timers or 1000
    short = args.timer_seconds or 5.0
    rate = 200.0  # short timers started per second
    record = base_record(bench, "W7", "many sleepers", argv)
    record["instances"] = 1
    record["params"] = {
        "sleepers": sleepers,
        "sleeper_timer_s": 600,
        "timers": timers,
        "timer_s": short,
        "timer_start_rate_per_s": rate,
        "repeat": args.repeat,
        "measure": "engine RSS (psutil) after warm-up vs after every sleeper is suspended "
        "(median of 10 samples over 2 s, after 5 s settling), divided by the sleepers; "
        "then, with the sleepers held, start the shorter timers at a steady rate and "
        "take TimerFired.at_ms - TimerScheduled.due_ms from the journal",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W7", r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        tag = f"w7-{r}-"
        lc = Lifecycle(bench.bootstrap, ns, tag.encode())
        try:
            with engines(bench, ns, rep), runstream.Client(ns, bench.bootstrap) as client:
                time.sleep(3)
                before = _rss_median(bench)
                t0 = time.perf_counter()
                window = 5000  # started but not yet suspended, at most
                t_said = t0
                for i in range(sleepers):
                    if time.perf_counter() - t_said > 15:
                        log(f"  {len(lc.suspended)}/{sleepers} sleepers suspended")
                        t_said = time.perf_counter()
                    if i - len(lc.suspended) >= window:
                        lc.wait_count("suspended", i - window + 1, 120)
                    _start(client, "sleeper", 600, f"{tag}s{i}")
                client._producer.flush(60)
                ok = lc.wait_count("suspended", sleepers, 300)
                rep["sleepers_suspended"] = len(lc.suspended)
                rep["all_suspended"] = ok
                fill = time.perf_counter() - t0
                rep["sleepers_fill_s"] = round(fill, 2)
                rep["sleepers_per_s"] = round(sleepers / fill, 1) if sleepers else None
                time.sleep(5)
                after = _rss_median(bench)
                rep["engine_rss_before_mb"] = round(before / 2**20, 1)
                rep["engine_rss_with_sleepers_mb"] = round(after / 2**20, 1)
                rep["rss_per_suspended_run_bytes"] = (
                    round((after - before) / sleepers) if sleepers else None
                )
                rep.update(_short_timers(bench, ns, client, lc, tag, timers, short, rate))
                rep["sleepers_ended_early"] = sum(
                    1 for rid in lc.terminal if rid.startswith(f"{tag}s")
                )
        finally:
            lc.stop()
        log(
            f"W7 repeat {r + 1}: {rep['rss_per_suspended_run_bytes']} B per suspended run; "
            f"timers late p50 {rep['timer_late_ms']['p50']} ms, "
            f"p99 {rep['timer_late_ms']['p99']} ms"
        )
    _record_common(record, reps)
    summary = {
        "rss_per_suspended_run_bytes": spread(r["rss_per_suspended_run_bytes"] for r in reps),
        "engine_rss_with_sleepers_mb": spread(r["engine_rss_with_sleepers_mb"] for r in reps),
        "timer_late_ms": {k: spread(r["timer_late_ms"][k] for r in reps) for k in ("p50", "p99")},
        "timer_fact_seen_committed_late_ms": {
            k: spread(r["timer_fact_seen_committed_late_ms"][k] for r in reps)
            for k in ("p50", "p99")
        },
        "sleepers_per_s": spread(r["sleepers_per_s"] for r in reps),
    }
    record["summary"] = summary
    seen = summary["timer_fact_seen_committed_late_ms"]
    record = finish_record(record)
    line = (
        f"W7: {fmt_spread(summary['rss_per_suspended_run_bytes'], ' B', 0)} engine RSS per "
        f"suspended run ({sleepers} sleepers, engine "
        f"{fmt_spread(summary['engine_rss_with_sleepers_mb'], ' MB')}); {timers} x {short:g} s "
        f"timers fired late (TimerFired.at_ms - due_ms) p50 "
        f"{fmt_spread(summary['timer_late_ms']['p50'], ' ms')}, p99 "
        f"{fmt_spread(summary['timer_late_ms']['p99'], ' ms')}; seen committed p50 "
        f"{fmt_spread(seen['p50'], ' ms')}, p99 {fmt_spread(seen['p99'], ' ms')}; "
        f"x {args.repeat}"
    )
    return record, line


def _start(client: runstream.Client, workflow: str, arg: Any, rid: str) -> None:
    while True:
        try:
            client.start(workflow, arg, run_id=rid, wait=False)
            return
        except BufferError:  # the client's local queue is full: let it send
            client._producer.poll(0.1)


def _rss_median(bench: Bench, samples: int = 10, every: float = 0.2) -> float:
    values = []
    for _ in range(samples):
        values.append(bench.sampler.rss("engine"))
        time.sleep(every)
    return statistics.median(values)


def _short_timers(
    bench: Bench,
    ns: str,
    client: runstream.Client,
    lc: Lifecycle,
    tag: str,
    timers: int,
    seconds: float,
    rate: float,
) -> dict[str, Any]:
    journal = _JournalFacts(bench.bootstrap, ns, f"{tag}t".encode())
    try:
        t0 = time.perf_counter()
        for i in range(timers):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            _start(client, "sleeper", seconds, f"{tag}t{i}")
        client._producer.flush(30)
        ids = {f"{tag}t{i}" for i in range(timers)}
        lc.wait(lambda: ids <= lc.terminal.keys(), seconds + timers / rate + 120)
        journal.settle()
    finally:
        journal.stop()
    due = {r["run_id"]: r["due_ms"] for n, r in journal.facts if n == "TimerScheduled"}
    fired = {r["run_id"]: r for n, r in journal.facts if n == "TimerFired"}
    late = [fired[rid]["at_ms"] - due[rid] for rid in fired if rid in due]
    produced = [fired[rid]["_produced_ms"] - due[rid] for rid in fired if rid in due]
    seen = [fired[rid]["_seen_ms"] - due[rid] for rid in fired if rid in due]
    done_late = [
        lc.terminal[rid][1]["at_ms"] - due[rid] for rid in ids if rid in lc.terminal and rid in due
    ]
    return {
        "timers_started": timers,
        "timers_fired": len(late),
        "timers_completed": sum(1 for rid in ids if rid in lc.terminal),
        "timer_late_ms": latency_stats([float(x) for x in late]),
        "timer_fact_produced_late_ms": latency_stats([float(x) for x in produced]),
        "timer_fact_seen_committed_late_ms": latency_stats(seen),
        "timer_run_completed_late_ms": latency_stats([float(x) for x in done_late]),
    }


# ----------------------------------------------------------------- W9


W9_SIZES = (500, 1000, 5000)


def w9(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    """One run of N sequential local steps per size: the cost per step must not grow."""
    sizes = (args.runs,) if args.runs else W9_SIZES
    record = base_record(bench, "W9", "long history: one run of N sequential local steps", argv)
    record["instances"] = 1
    record["params"] = {
        "sizes": list(sizes),
        "repeat": args.repeat,
        "workflow": "long: N sequential local steps (x + 1)",
        "measure": "perf_counter before client.start('long', N) (wait=True) until "
        "client.result() returned; each size on a fresh namespace and engine",
    }
    reps = []
    for r in range(args.repeat):
        for n in sizes:
            ns = bench.namespace(f"W9-{n}", r)
            _settings(record, bench, ns)
            rep = _new_rep(ns, r) | {"steps": n}
            reps.append(rep)
            with engines(bench, ns, rep), runstream.Client(ns, bench.bootstrap) as client:
                t0 = time.perf_counter()
                rid = client.start("long", n)
                out = client.result(rid, timeout=600)
                took = time.perf_counter() - t0
            rep.update(
                total_s=round(took, 3),
                steps_per_s=round(n / took, 1),
                us_per_step=round(took / n * 1e6, 1),
                wrong_result=out != n,
            )
            log(f"W9 repeat {r + 1}, {n} steps: {took:.2f} s, {n / took:.0f} steps/s")
    _record_common(record, reps)
    summary = {
        str(n): {
            k: spread(rep[k] for rep in reps if rep["steps"] == n)
            for k in ("total_s", "steps_per_s", "us_per_step")
        }
        for n in sizes
    }
    first, last = summary[str(sizes[0])], summary[str(sizes[-1])]
    if first["us_per_step"] and last["us_per_step"]:
        summary["growth"] = {
            "definition": f"us per step at {sizes[-1]} steps / at {sizes[0]} steps "
            "(1: the cost per step does not grow with the history)",
            "ratio": round(last["us_per_step"]["median"] / first["us_per_step"]["median"], 2),
        }
    record["summary"] = summary
    record = finish_record(record)
    line = "W9: " + "; ".join(
        f"{n} steps {fmt_spread(summary[str(n)]['total_s'], ' s', 2)} "
        f"({fmt_spread(summary[str(n)]['steps_per_s'], ' steps/s', 0)})"
        for n in sizes
    )
    if "growth" in summary:
        line += f"; cost per step x{summary['growth']['ratio']} from {sizes[0]} to {sizes[-1]}"
    return record, line


# ----------------------------------------------------------------- W8


class _RemoteEngine(Engine):
    """An engine instance of ``benchmarks.flows:remote_app``: w1 with remote steps."""

    @property
    def command(self) -> list[str]:
        cmd = super().command  # [python, -m, runstream, worker, benchmarks.flows:app, ...]
        return [*cmd[:4], "benchmarks.flows:remote_app", *cmd[5:]]


class _TaskWorkerProcess(Engine):
    """``runstream tasks serve benchmarks.flows:remote_app --group bench``: one task-worker
    process, sampled apart from the engines (RSS and CPU group ``taskworker``)."""

    sampled_as = "taskworker"

    def __init__(self, bench: Bench, ns: str, concurrency: int) -> None:
        super().__init__(bench, ns, "tasks-1", bench.state_dir(ns))
        self.concurrency = concurrency

    @property
    def command(self) -> list[str]:
        from .flows import REMOTE_GROUP

        return [
            sys.executable,
            "-m",
            "runstream",
            "tasks",
            "serve",
            "benchmarks.flows:remote_app",
            "--group",
            REMOTE_GROUP,
            "--concurrency",
            str(self.concurrency),
        ]

    def start(self) -> _TaskWorkerProcess:
        self._spawn()  # not one of the bench's engines
        return self


#: W8's task worker: `runstream tasks serve`'s default concurrency.
W8_CONCURRENCY = 16


@contextlib.contextmanager
def remote_processes(bench: Bench, ns: str, rep: dict[str, Any]) -> Iterator[Engine]:
    """W8: a task-worker process serving group ``bench`` (yielded) and one engine instance
    of ``remote_app``, ready (the harness's warm-up runs went through both); stopped
    afterwards, with their exit codes, CPU time, log problems and peak RSS in ``rep``."""
    bench.sampler.reset()
    began = time.perf_counter()
    worker = _TaskWorkerProcess(bench, ns, W8_CONCURRENCY).start()
    try:
        engine = _RemoteEngine(bench, ns, "bench-1", bench.state_dir(ns)).start()
        wait_ready(bench, ns, [engine])
        if not worker.alive():
            raise BenchError("the task worker exited during start-up:\n" + tail(worker.log_text()))
        rep["ready_s"] = round(time.perf_counter() - began, 2)
        yield worker
    finally:
        bench.sampler.sample()
        rep["engine_cpu_s"] = round(bench.sampler.cpu_seconds("engine"), 2)
        rep["task_worker_cpu_s"] = round(bench.sampler.cpu_seconds("taskworker"), 2)
        rep["peak_rss_mb"] = bench.sampler.peaks_mb()
        rep["engine_exit_codes"] = [e.stop() for e in bench.engines]
        rep["task_worker_exit_code"] = worker.stop()
        problems = [p for e in [*bench.engines, worker] for p in e.problems()]
        if problems:
            rep["log_problems"] = problems
        bench.engines = []
        rep["dlq_end_offsets"] = _end_offset_sum(bench.bootstrap, f"{ns}.dlq")


def _w1_latency(client: runstream.Client, warmup: int, runs: int) -> dict[str, Any]:
    """W1 (and W8-W1): sequential runs of ``w1``, from before start() until result()
    returned."""
    lat, each, wrong = [], [], 0
    for i in range(warmup + runs):
        at_ms = time.time() * 1000
        t0 = time.perf_counter()
        rid = client.start("w1", 1)
        out = client.result(rid, timeout=60)
        dt = (time.perf_counter() - t0) * 1000
        wrong += out != 4
        if i >= warmup:
            lat.append(dt)
            each.append(_timed_run(at_ms, dt))
    return {"latency_ms": latency_stats(lat), "wrong_results": wrong, "runs_ms": each}


def _timed_run(at_ms: float, dt: float) -> list[float]:
    """One run as kept in the JSON: its wall-clock start (epoch ms, to match the engine's
    log and the broker's) and its latency, so a slow run can be located afterwards."""
    return [round(at_ms), round(dt, 2)]


def _local_figures() -> dict[str, Any]:
    """The medians of the last W1 and W2 results (benchmarks/results/), to set W8 beside."""
    out: dict[str, Any] = {}
    figures = (
        ("W1", ("latency_ms", "p50")),
        ("W2", ("runs_per_s",)),
        ("W2_cpu", ("cpu_s_per_1000_runs", "total")),
    )
    for name, path in figures:
        try:
            data = json.loads((RESULTS / f"{name[:2]}.json").read_text())
            value = data["summary"]
            for key in path:
                value = value[key]
            out[name] = {"median": value["median"], "date": data["date"]}
        except (OSError, ValueError, KeyError, TypeError):
            out[name] = None
    return out


def w8(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    """W1 and W2 with the three steps remote, served by one task-worker process."""
    runs1, runs2 = args.runs or 200, args.runs or 2000
    warmup, in_flight = (20 if args.warmup is None else args.warmup), args.in_flight or 64
    record = base_record(bench, "W8", "remote steps: W1 and W2 served by a task worker", argv)
    record["instances"] = {"engines": 1, "task_workers": 1}
    record["params"] = {
        "w1_runs": runs1,
        "w1_warmup": warmup,
        "w2_runs": runs2,
        "w2_in_flight": in_flight,
        "repeat": args.repeat,
        "task_worker_concurrency": W8_CONCURRENCY,
        "workflow": "remote_app's w1: 3 sequential remote steps (x + 1), group 'bench', "
        "served by `runstream tasks serve benchmarks.flows:remote_app --group bench`",
        "measure": "W8-W1 as W1 and W8-W2 as W2, each on its own fresh namespace with a "
        "fresh engine process and task-worker process",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W8-W1", r)
        _settings(record, bench, ns)
        rep1 = _new_rep(ns, r) | {"part": "W1"}
        reps.append(rep1)
        with remote_processes(bench, ns, rep1), runstream.Client(ns, bench.bootstrap) as client:
            rep1.update(_w1_latency(client, warmup, runs1))
        ns = bench.namespace("W8-W2", r)
        rep2 = _new_rep(ns, r) | {"part": "W2"}
        reps.append(rep2)
        with remote_processes(bench, ns, rep2) as worker:
            rep2.update(throughput(bench, ns, runs2, in_flight, f"w8-{r}-", task_worker=worker))
        log(
            f"W8 repeat {r + 1}: W1 p50 {rep1['latency_ms']['p50']:.1f} ms, "
            f"W2 {rep2['runs_per_s']} runs/s"
        )
    _record_common(record, reps)
    lat = [rep for rep in reps if rep["part"] == "W1"]
    thr = [rep for rep in reps if rep["part"] == "W2"]
    summary: dict[str, Any] = {
        "latency_ms": {
            k: spread(rep["latency_ms"][k] for rep in lat) for k in ("p50", "p90", "p99", "mean")
        },
        **{k: spread(rep[k] for rep in thr) for k in ("runs_per_s", "steps_per_s", "wall_s")},
        "cpu_s_per_1000_runs": {
            k: spread(rep["cpu_s_per_1000_runs"][k] for rep in thr)
            for k in ("engine", "task_worker", "broker", "total")
        },
    }
    local = _local_figures()
    cpu = summary["cpu_s_per_1000_runs"]["total"]
    p50, rps = summary["latency_ms"]["p50"], summary["runs_per_s"]
    summary["beside_local"] = {
        "definition": "W8-W2 runs/s as a share of W2 runs/s, W8-W1 p50 over W1 p50, and "
        "W8-W2's CPU s per 1,000 runs (engine, task worker and broker) over W2's (medians; "
        "W1 and W2 as last written to benchmarks/results/: run them in the same "
        "invocation, `python -m benchmarks W1 W2 W8`)",
        "W1": local["W1"],
        "W2": local["W2"],
        "W2_cpu": local["W2_cpu"],
        "w2_share": round(rps["median"] / local["W2"]["median"], 3)
        if rps and local["W2"]
        else None,
        "w1_p50_ratio": round(p50["median"] / local["W1"]["median"], 2)
        if p50 and local["W1"]
        else None,
        "cpu_ratio": round(cpu["median"] / local["W2_cpu"]["median"], 2)
        if cpu and local["W2_cpu"]
        else None,
    }
    record["summary"] = summary
    record = finish_record(record)
    beside = summary["beside_local"]
    line = (
        f"W8: W1 p50 {fmt_spread(p50, ' ms')}, p99 "
        f"{fmt_spread(summary['latency_ms']['p99'], ' ms')}; W2 {fmt_spread(rps, ' runs/s')}, "
        f"{fmt_spread(summary['steps_per_s'], ' steps/s', 0)}; x {args.repeat}"
    )
    if beside["w2_share"] is not None:
        line += f"; W2 at {beside['w2_share']:.0%} of local"
    if beside["w1_p50_ratio"] is not None:
        line += f", W1 p50 {beside['w1_p50_ratio']}x local"
    if cpu is not None:
        line += f"; CPU {cpu['median']:.2f} s per 1,000 runs"
        if beside["cpu_ratio"] is not None:
            line += f" ({beside['cpu_ratio']}x local)"
    return record, line


# ----------------------------------------------------------------- W10


def w10(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    """An update round trip on a waiting run: one run takes ``runs`` updates in turn."""
    runs = args.runs or 100
    warmup = 10 if args.warmup is None else args.warmup
    record = base_record(bench, "W10", "update round trip", argv)
    record["instances"] = 1
    record["params"] = {
        "runs": runs,
        "warmup": warmup,
        "repeat": args.repeat,
        "workflow": "counter: update handler 'add' (no awaits), waits for signal 'stop'",
        "measure": "one run, suspended on its signal wait (seen on the lifecycle topic); "
        "per update, sequentially: perf_counter around client.update(run, 'add', 1), "
        "which sends the Update (flushed) and returns the handler's result from <ns>.replies",
    }
    reps = []
    for r in range(args.repeat):
        ns = bench.namespace("W10", r)
        _settings(record, bench, ns)
        rep = _new_rep(ns, r)
        reps.append(rep)
        lc = Lifecycle(bench.bootstrap, ns, f"w10-{r}".encode())
        try:
            with engines(bench, ns, rep), runstream.Client(ns, bench.bootstrap) as client:
                rid = client.start("counter", None, run_id=f"w10-{r}")
                if not lc.wait_run("suspended", rid, 30):
                    raise BenchError(f"run {rid} never suspended on its signal wait")
                lat, each, wrong = [], [], 0
                for i in range(warmup + runs):
                    at_ms = time.time() * 1000
                    t0 = time.perf_counter()
                    out = client.update(rid, "add", 1, timeout=60)
                    dt = (time.perf_counter() - t0) * 1000
                    wrong += out != i + 1
                    if i >= warmup:
                        lat.append(dt)
                        each.append(_timed_run(at_ms, dt))
                client.signal(rid, "stop")
                wrong += client.result(rid, timeout=60) != warmup + runs
                rep["round_trip_ms"] = latency_stats(lat)
                rep["wrong_results"] = wrong
                rep["runs_ms"] = each
        finally:
            lc.stop()
        log(
            f"W10 repeat {r + 1}: p50 {rep['round_trip_ms']['p50']:.1f} ms, "
            f"p99 {rep['round_trip_ms']['p99']:.1f} ms"
        )
    _record_common(record, reps)
    summary = {
        k: spread(rep["round_trip_ms"][k] for rep in reps) for k in ("p50", "p90", "p99", "mean")
    }
    record["summary"] = {"round_trip_ms": summary}
    record = finish_record(record)
    line = (
        f"W10: update round trip p50 {fmt_spread(summary['p50'], ' ms')}, "
        f"p99 {fmt_spread(summary['p99'], ' ms')}; {runs} updates x {args.repeat}"
    )
    return record, line
