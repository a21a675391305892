"""``python -m chaos --minutes N [--seed S] [--rate R] [--out DIR]``: one chaos run (see
`chaos.suite`); exit status 0 when no invariant was violated, 1 otherwise."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .suite import run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="minutes of faults")
    parser.add_argument("--seed", type=int, default=None, help="the nemesis' random seed")
    parser.add_argument("--rate", type=float, default=2.0, help="runs started per second")
    parser.add_argument("--out", type=Path, default=None, help="where logs and state go")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="runstream-chaos-"))
    result = run(args.minutes, out, seed=args.seed, rate=args.rate)
    print(result.summary())
    for violation in result.violations[:50]:
        print(f"  violation: {violation}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
