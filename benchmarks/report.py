"""``python -m benchmarks.report``: the figures in ``benchmarks/results/*.json`` as the
Markdown table of benchmarks/README.md (median, with min and max over repeats)."""

from __future__ import annotations

import json
import sys
from typing import Any

from .harness import RESULTS


def _s(spread: dict[str, float] | None, unit: str = "", digits: int = 1) -> str:
    if not spread:
        return "n/a"
    f = f"{{:,.{digits}f}}"
    med = f.format(spread["median"])
    if spread.get("n", 1) == 1:
        return f"{med}{unit}"
    return f"{med}{unit} ({f.format(spread['min'])}-{f.format(spread['max'])})"


def _rows(name: str, d: dict[str, Any]) -> list[tuple[str, str, str]]:
    s, p = d["summary"], d["params"]
    reps = p.get("repeat", len(d.get("repeats", [])))
    if name == "floor":
        size = (
            f"{p['iterations']} txns / hops; {p['batch_txns']} x {p['batch_records']}-record txns"
        )
        return [
            (
                "floor: txn commit p50 / p99",
                _s(s["txn_commit_ms"]["p50"], " ms", 2)
                + " / "
                + _s(s["txn_commit_ms"]["p99"], " ms", 2),
                f"{size}; x{reps}",
            ),
            (
                "floor: produce→consume hop p50 / p99",
                _s(s["hop_ms"]["p50"], " ms", 2) + " / " + _s(s["hop_ms"]["p99"], " ms", 2),
                f"x{reps}",
            ),
            (
                "floor: 64-record txns",
                _s(s["batch_txns_per_s"], " txns/s")
                + "; "
                + _s(s["batch_records_per_s"], " records/s", 0),
                f"x{reps}",
            ),
        ]
    if name == "W1":
        lat = s["latency_ms"]
        ratio = d.get("floor_ratio", {}).get("ratio")
        return [
            (
                "W1 latency p50 / p90",
                _s(lat["p50"], " ms") + " / " + _s(lat["p90"], " ms"),
                f"{p['runs']} runs (+{p['warmup']} warm-up); x{reps}",
            ),
            (
                "W1 latency p99 / mean",
                _s(lat["p99"], " ms") + " / " + _s(lat["mean"], " ms"),
                f"p50 = {ratio}x floor txn-commit p50" if ratio else "",
            ),
        ]
    if name == "W2":
        ratio = d.get("floor_ratio", {}).get("ratio")
        return [
            (
                "W2 throughput",
                _s(s["runs_per_s"], " runs/s") + "; " + _s(s["steps_per_s"], " steps/s", 0),
                f"{p['runs']} runs, {p['in_flight']} in flight; x{reps}"
                + (f"; {ratio}x floor txns/s" if ratio else ""),
            ),
        ]
    if name == "W3":
        rt = s["round_trip_ms"]
        return [
            (
                "W3 signal round trip p50 / p99",
                _s(rt["p50"], " ms") + " / " + _s(rt["p99"], " ms"),
                f"{p['runs']} runs (+{p['warmup']} warm-up); x{reps}",
            ),
        ]
    if name == "W4-supervisor":
        return [
            (
                "W4 variant: supervisor restarts the engine; kill -> all completed",
                _s(s["kill_to_all_completed_s"], " s", 2),
                f"{p['runs']} runs; lost {_s(s['runs_lost'], '', 0)}, duplicated steps "
                f"{_s(s['duplicated_step_executions'], '', 0)}; x{reps}",
            ),
        ]
    if name == "W4":
        return [
            (
                "W4 runs lost / duplicated step executions",
                _s(s["runs_lost"], "", 0) + " / " + _s(s["duplicated_step_executions"], "", 0),
                f"{p['runs']} runs, sleep {p['sleep_s']:g} s; x{reps}",
            ),
            (
                "W4 restart → all completed",
                _s(s["restart_to_all_completed_s"], " s", 2),
                "SIGKILL while all runs sleep; restart at once on the same state; the last "
                "run completed "
                + _s(s["completed_after_due_ms"]["max"], " ms", 0)
                + " after its timer was due",
            ),
        ]
    if name == "W5":
        return [
            (
                "W5 rebuild",
                _s(s["facts_per_s"], " facts/s", 0)
                + " (wall "
                + _s(s["facts_per_s_wall"], " facts/s", 0)
                + ")",
                f"{_s(s['facts_restored'], ' facts', 0)} ({p['runs']:,} W1 runs); x{reps}",
            ),
            (
                "W5 restart → new commands processed",
                _s(s["restart_to_all_new_runs_completed_s"], " s", 2),
                "state dir deleted; one new run per partition",
            ),
        ]
    if name == "W6":
        ratios = s.get("ratio_to_1") or {}
        return [
            (
                f"W6 {n} instance{'s' if n != '1' else ''}",
                _s(v, " runs/s"),
                f"{ratios.get(n, '?')}x one instance; {p['runs']} runs, {p['in_flight']} in "
                f"flight; x{reps}",
            )
            for n, v in s["runs_per_s"].items()
        ]
    if name == "W7":
        late, seen = s["timer_late_ms"], s["timer_fact_seen_committed_late_ms"]
        return [
            (
                "W7 engine RSS per suspended run",
                _s(s["rss_per_suspended_run_bytes"], " B", 0),
                f"{p['sleepers']:,} runs on a 600 s timer; engine "
                f"{_s(s['engine_rss_with_sleepers_mb'], ' MB')}; x{reps}",
            ),
            (
                "W7 timers late p50 / p99 (TimerFired.at_ms - due_ms)",
                _s(late["p50"], " ms") + " / " + _s(late["p99"], " ms"),
                f"{p['timers']:,} timers of {p['timer_s']:g} s",
            ),
            (
                "W7 timers late, fact visible (read_committed) p50 / p99",
                _s(seen["p50"], " ms") + " / " + _s(seen["p99"], " ms"),
                "",
            ),
        ]
    return []


def main() -> int:
    out = ["| figure | median (min-max) | size |", "|---|---|---|"]
    meta = []
    for name in ("floor", "W1", "W2", "W3", "W4", "W4-supervisor", "W5", "W6", "W7"):
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        d = json.loads(path.read_text())
        out += [f"| {a} | {b} | {c} |" for a, b, c in _rows(name, d)]
        v = d["versions"]
        rss = d["peak_rss_mb"]
        engine = (
            f"engine {rss['engine']} MB (largest process {rss.get('engine_largest_process')} MB), "
            if rss.get("engine")
            else ""
        )
        meta.append(
            f"{name}: {d['date']}, load {d['load_average_before']} → "
            f"{d['load_average_after']}, commit {(v['runstream_git_commit'] or '?')[:7]}"
            f"{' (+ uncommitted src changes)' if v.get('runstream_src_changes') else ''}, "
            f"peak RSS {engine}broker {rss.get('broker')} MB"
        )
    print("\n".join(out))
    print()
    print("\n".join(f"* {m}" for m in meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
