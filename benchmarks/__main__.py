"""``python -m benchmarks W1|..|W7|floor|all [--repeat N] [flags]``

Starts a local single-node Kafka (or uses ``--bootstrap``), runs the workload(s),
writes ``benchmarks/results/<W>.json`` and prints one summary line per workload.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from . import floor, workloads
from .harness import Bench, log, write_result

WORKLOADS = {
    "floor": floor.floor,
    "W1": workloads.w1,
    "W2": workloads.w2,
    "W3": workloads.w3,
    "W4": workloads.w4,
    "W5": workloads.w5,
    "W6": workloads.w6,
    "W7": workloads.w7,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Runstream benchmarks (BENCHMARKS.md). Defaults follow BENCHMARKS.md; "
        "flags change sizes. Results: benchmarks/results/<W>.json.",
    )
    p.add_argument("workload", choices=[*WORKLOADS, "all"], type=_workload)
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
        "--keep", action="store_true", help="keep the work dir (broker data, engine state and logs)"
    )
    return p


def _workload(value: str) -> str:
    return value if value in ("floor", "all") else value.upper()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    failed = []
    with Bench(args.bootstrap, keep=args.keep) as bench:
        if args.warmup_seconds > 0:
            workloads.warm_broker(bench, args.warmup_seconds)
        for name in names:
            log(f"{name}: starting")
            try:
                record, summary = WORKLOADS[name](bench, args, _argv_for(argv, name))
                record["invoked_as"] = "python -m benchmarks " + " ".join(argv)
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
    return [name if a.lower() == "all" else a for a in argv]


if __name__ == "__main__":
    sys.exit(main())
