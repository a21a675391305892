"""``python -m benchmarks W1|..|W7|floor|all [more workloads] [--repeat N] [flags]``

Starts a local single-node Kafka (or uses ``--bootstrap``), runs the workload(s) in the
order given, on that one broker, writes ``benchmarks/results/<W>.json`` and prints one
summary line per workload.

``python -m benchmarks compare [--peers DIR] [flags]`` runs this harness interleaved with
the peers' harnesses (see ``benchmarks/compare.py``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import traceback
from collections.abc import Callable
from typing import Any

# The harness (and with it runstream) is imported only when a workload runs, so that
# `compare`, which only starts subprocesses, does not load the engine's code.
WORKLOADS = (
    "floor",
    "W1",
    "W2",
    "W3",
    "W3b",
    "W4",
    "W5",
    "W5S",
    "W6",
    "W7",
    "W8",
    "W9",
    "W10",
    "W11",
)


def _functions() -> dict[str, Callable[..., Any]]:
    from . import failover, floor, w5s, workloads

    return {
        "floor": floor.floor,
        "W1": workloads.w1,
        "W2": workloads.w2,
        "W3": workloads.w3,
        "W3b": workloads.w3b,
        "W4": workloads.w4,
        "W5": workloads.w5,
        "W5S": w5s.w5s,
        "W6": workloads.w6,
        "W7": workloads.w7,
        "W8": workloads.w8,
        "W9": workloads.w9,
        "W10": workloads.w10,
        "W11": failover.w11,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Runstream benchmarks (BENCHMARKS.md). Defaults follow BENCHMARKS.md; "
        "flags change sizes. Results: benchmarks/results/<W>.json. Side by side with the "
        "peers: `python -m benchmarks compare --help`.",
    )
    p.add_argument(
        "workload",
        nargs="+",
        choices=[*WORKLOADS, "all"],
        type=_workload,
        help="one or more workloads, run in this order on one broker after one warm-up "
        "(`all`: floor, then W1..W7)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="repeats, each on a fresh namespace and fresh engine processes (default 3)",
    )
    p.add_argument(
        "--bootstrap", default=None, help="use this broker instead of starting a local one"
    )
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="runs per repeat (W1 200, W2/W6 2000, W3 100, W4 200, W5 100000 "
        "runs of W1 to fill the journal; floor: iterations, default 500)",
    )
    p.add_argument("--warmup", type=int, default=None, help="unmeasured runs (W1 20, W3 10)")
    p.add_argument("--in-flight", type=int, default=None, help="W2/W6: runs in flight (64)")
    p.add_argument(
        "--instances", type=int, nargs="+", default=None, help="W6: instance counts (1 2 4)"
    )
    p.add_argument("--sleep", type=float, default=None, help="W4: the durable sleep, s (2)")
    p.add_argument(
        "--session-timeout-ms",
        type=int,
        default=None,
        help="W11: the engines' group session timeout, ms (6000; heartbeat a third of it, "
        "3000 at most)",
    )
    p.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=None,
        help="W11: the engines' transaction timeout, ms (10000): how long a transaction the "
        "victim left open holds its partitions",
    )
    p.add_argument(
        "--supervisor-restart",
        action="store_true",
        help="W4: SIGKILL only the engine process below `runstream worker`'s supervisor and "
        "let the supervisor start it again; writes W4-supervisor.json (default: SIGKILL "
        "the whole `runstream worker` process tree, as a crash of its machine, and start "
        "it again)",
    )
    p.add_argument(
        "--sleepers", type=int, default=None, help="W7: runs on a 10-minute timer (100000)"
    )
    p.add_argument(
        "--timers",
        type=int,
        default=None,
        help="W7: shorter timers whose lateness is measured (1000)",
    )
    p.add_argument(
        "--timer-seconds",
        type=float,
        default=None,
        help="W7: duration of the shorter timers, s (5)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="floor: records per transaction in the batched throughput (64)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for runs to finish before calling them lost",
    )
    p.add_argument(
        "--warmup-seconds",
        type=float,
        default=60,
        help="unmeasured W2 load on a throwaway namespace before the first workload, to "
        "warm the broker's JIT up; 0 to skip (default 60)",
    )
    p.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a server.properties setting of the local broker beyond its defaults "
        "(repeatable), e.g. num.io.threads=4",
    )
    p.add_argument(
        "--broker-jvm",
        default="",
        help="JVM options of the local broker after its defaults, e.g. '-Xmx1g'",
    )
    p.add_argument(
        "--broker-metrics",
        action="store_true",
        help="the local broker's request metrics (JMX) and GC pauses per workload, in its "
        "JSON under broker.stats and as one line on stderr",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the work dir (broker data, engine state and logs)"
    )
    return p


def _workload(value: str) -> str:
    """``w3b`` is W3b: workload names are case-blind."""
    return next((w for w in (*WORKLOADS, "all") if w.lower() == value.lower()), value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        from . import compare  # imports no runstream code: it only runs subprocesses

        return compare.main(argv[1:])
    args = parser().parse_args(argv)
    from . import brokerstats, workloads
    from .harness import Bench, log, write_result

    functions = _functions()
    names: list[str] = []
    for w in args.workload:
        for name in WORKLOADS if w == "all" else [w]:
            if name not in names:
                names.append(name)
    failed = []
    config = dict(kv.split("=", 1) for kv in args.broker_config)
    jvm = shlex.split(args.broker_jvm)
    with Bench(args.bootstrap, args.keep, config, jvm, args.broker_metrics) as bench:
        if args.warmup_seconds > 0:
            workloads.warm_broker(bench, args.warmup_seconds)
        if bench.broker_stats is not None:
            bench.broker_stats.since_last()  # the warm-up's requests are not the workload's
        for name in names:
            bench.settle()  # the broker busy with the last workload's aftermath skews this one
            log(f"{name}: starting")
            try:
                record, summary = functions[name](bench, args, _argv_for(argv, name))
                record["invoked_as"] = "python -m benchmarks " + " ".join(argv)
                if bench.broker_stats is not None:
                    record["broker"]["stats"] = stats = bench.broker_stats.since_last()
                    log(f"{name} {brokerstats.summary(stats)}")
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:
                log(f"{name} failed: {exc!r}")
                traceback.print_exc(file=sys.stderr)
                print(f"{name}: FAILED: {exc}", flush=True)
                failed.append(name)
                bench.stop_engines()
                continue
            write_result(record.pop("result_name", name), record, summary)
    return 1 if failed else 0


def _argv_for(argv: list[str], name: str) -> list[str]:
    """The command line of one workload: ``name`` in place of the workload arguments."""
    out: list[str] = []
    for a in argv:
        if a.lower() == "all" or _workload(a) in WORKLOADS:
            if name not in out:
                out.append(name)
        else:
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
