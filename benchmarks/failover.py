"""W11, failover: two engine instances under W2-style load, one SIGKILLed; how long until
every partition it owned makes progress again, with and without standby replicas
(`runstream.standby`), interleaved repeat by repeat on one broker.

Per repeat and variant: a fresh namespace, two instances (``RUNSTREAM_STANDBYS`` 0 or 1,
session timeout ``--session-timeout-ms``, 6 s by default: the least a default broker
allows; the local broker allows 1 s), a history of W1 runs (the facts
a takeover without a warm copy must read again), then W1 runs kept in flight while the
first instance is SIGKILLed. At the kill one probe W1 run is started per partition the
victim owned; the failover time is from the kill until the last probe completed. The
survivor's log says how many facts its takeover restored. A transaction the victim left
open holds the offsets and the journal of its partitions until the coordinator aborts it,
``--transaction-timeout-ms`` (10 s by default) after it began.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from typing import Any

import runstream
from runstream.engine.partitioner import partition_for

from .harness import (
    PARTITIONS,
    Bench,
    Lifecycle,
    base_record,
    finish_record,
    fmt_spread,
    log,
    spread,
)
from .workloads import _new_rep, _settings, engines, throughput

RESTORED = re.compile(
    r"^(\S+ \S+) INFO runstream.worker: partitions \[([\d, ]+)\] restored: (\d+) facts in "
    r"([\d.]+)s(?: \(claim ([\d.]+)s, offsets ([\d.]+)s, stores ([\d.]+)s, journal ([\d.]+)s\))?",
    re.M,
)
PHASES = ("claim", "offsets", "stores", "journal")
SESSION_TIMEOUT_MS = 6000  # the default: the least a default broker allows
TRANSACTION_TIMEOUT_MS = 10_000  # the engine's default


def w11(bench: Bench, args: Any, argv: list[str]) -> tuple[dict[str, Any], str]:
    history = args.runs or 20_000
    session_ms = args.session_timeout_ms or SESSION_TIMEOUT_MS
    txn_ms = args.transaction_timeout_ms or TRANSACTION_TIMEOUT_MS
    record = base_record(bench, "W11", "failover with and without standby replicas", argv)
    record["instances"] = 2
    record["params"] = {
        "history_runs": history,
        "repeat": args.repeat,
        "session_timeout_ms": session_ms,
        "transaction_timeout_ms": txn_ms,
        "measure": "fill a history of W1 runs, keep 64 W1 runs in flight, SIGKILL the first "
        "instance, start one probe W1 run per partition it owned; time from the kill to the "
        "last probe completed, and the facts the survivor's takeover restored",
    }
    reps: list[dict[str, Any]] = []
    for r in range(args.repeat):
        for standbys in (0, 1):
            ns = bench.namespace("W11", 2 * r + standbys)
            _settings(record, bench, ns)
            rep = _new_rep(ns, r)
            rep["standbys"] = standbys
            reps.append(rep)
            env = {
                "RUNSTREAM_STANDBYS": str(standbys),
                "RUNSTREAM_SESSION_TIMEOUT_MS": str(session_ms),
                "RUNSTREAM_TRANSACTION_TIMEOUT_MS": str(txn_ms),
            }
            with engines(bench, ns, rep, instances=2, env=env) as (victim, survivor):
                log(f"W11 repeat {r + 1}, standbys {standbys}: {history} runs of history")
                rep["fill"] = throughput(bench, ns, history, 256, f"w11h-{r}-", timeout=120)
                time.sleep(3)  # the standby copies tail the journal: let them reach its end
                rep.update(_kill_and_probe(bench, ns, victim, survivor, f"w11-{r}-{standbys}"))
            log(
                f"W11 repeat {r + 1}, standbys {standbys}: failover "
                f"{rep.get('kill_to_all_partitions_progress_s')} s, "
                f"{rep.get('facts_restored_at_takeover')} facts restored"
            )
    summary = {
        f"standbys_{n}": {
            k: spread(rep.get(k) for rep in reps if rep["standbys"] == n)
            for k in (
                "kill_to_all_partitions_progress_s",
                "kill_to_restored_s",
                "facts_restored_at_takeover",
            )
        }
        for n in (0, 1)
    }
    record["summary"] = summary
    record["reps"] = reps
    record = finish_record(record)
    without, with_ = (summary[f"standbys_{n}"] for n in (0, 1))
    line = (
        "W11 failover (kill -> every partition of the victim progresses): without standbys "
        f"{fmt_spread(without['kill_to_all_partitions_progress_s'], ' s', 2)} "
        f"({fmt_spread(without['facts_restored_at_takeover'], ' facts', 0)} restored), with "
        f"{fmt_spread(with_['kill_to_all_partitions_progress_s'], ' s', 2)} "
        f"({fmt_spread(with_['facts_restored_at_takeover'], ' facts', 0)}); "
        f"{history} runs of history x {args.repeat}, session timeout {session_ms} ms, "
        f"transaction timeout {txn_ms} ms"
    )
    return record, line


def _kill_and_probe(bench: Bench, ns: str, victim: Any, survivor: Any, tag: str) -> dict[str, Any]:
    health = victim.state_dir / ns / victim.instance / "health.json"
    owned = sorted(json.loads(health.read_text())["partitions"])
    load = threading.Thread(
        target=lambda: _swallow(lambda: throughput(bench, ns, 4000, 64, f"{tag}-load-", 60)),
        daemon=True,
    )
    load.start()
    time.sleep(2)  # under load
    probes, i = {}, 0
    while len(probes) < len(owned):
        rid = f"{tag}-probe-{i}"
        p = partition_for(rid.encode(), PARTITIONS)
        if p in owned and p not in probes.values():
            probes[rid] = p
        i += 1
    lc = Lifecycle(bench.bootstrap, ns, f"{tag}-probe-".encode())
    try:
        with runstream.Client(ns, bench.bootstrap) as client:
            t_kill, wall_kill = time.perf_counter(), time.time()
            victim.kill()
            for rid in probes:
                client.start("w1", 1, run_id=rid, wait=False)
        done = lc.wait_count("terminal", len(probes), 120)
        t_done = max((t for _, _, t in lc.terminal.values()), default=t_kill)
    finally:
        lc.stop()
    load.join(120)
    takeovers = [
        (_wall(m[1]), int(m[3]), float(m[4]), m.groups()[4:])
        for m in RESTORED.finditer(survivor.log_text())
        if {int(p) for p in m[2].split(",")} & set(owned)
    ]
    restored_at, facts, seconds, phases = takeovers[-1] if takeovers else (None,) * 4
    return {
        "victim_partitions": owned,
        "kill_to_all_partitions_progress_s": round(t_done - t_kill, 3) if done else None,
        "facts_restored_at_takeover": facts,
        "takeover_restore_s": seconds,
        # where the restore's time went (the survivor's log line): the standby's claim, the
        # group's offsets (they wait for a transaction the victim left open), the stores,
        # the journal's tail
        "takeover_phases_s": {
            k: float(v) for k, v in zip(PHASES, phases or (), strict=False) if v is not None
        },
        # the survivor's log clock (ms): detection and rebalance, then the restore
        "kill_to_restored_s": None if restored_at is None else round(restored_at - wall_kill, 3),
    }


def _wall(stamp: str) -> float:
    """A log line's local time stamp (``2026-12-02 11:52:37,138``) in seconds since the epoch."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _swallow(fn: Any) -> None:
    try:
        fn()
    except Exception as exc:  # the load may lose runs' completions to the kill's timing
        log(f"  load: {exc}")
