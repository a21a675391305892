"""How fast the dashboard's pages answer with a big read model (a figure, not a test).

    .venv/bin/python -m benchmarks.ui_pages [--runs 100000] [--steps 5000]

Folds ``--runs`` runs' lifecycle events into a fresh runs model (in a temporary
directory, no broker), serves `runstream.ui.server` with uvicorn on a free port, and
prints the median time of 20 requests of each list page, and of the page of one run
whose journal has ``--steps`` steps (two facts each).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import uvicorn

from runstream.engine.work import LogRecord
from runstream.projections.runs import RunsModel
from runstream.schemas.codec import Codec
from runstream.schemas.records import LifecycleEvent, Record, RunStarted, StepCompleted, StepStarted
from runstream.settings import Settings
from runstream.ui.server import Dashboard, create_app

T0 = 1_700_000_000_000


def fill(path: Path, runs: int) -> None:
    codec, model = Codec.default(), RunsModel(path)
    batch: list[LogRecord] = []
    offset = 0
    for i in range(runs):
        run, workflow = f"run-{i:06}", f"w{i % 10}"
        events = [
            LifecycleEvent(
                "run.started",
                run,
                at_ms=T0 + i,
                workflow=workflow,
                version="1",
                status="running",
                tags={"customer": f"c-{i % 50}"},
            )
        ]
        if i % 3 == 0:
            events.append(
                LifecycleEvent(
                    "run.completed",
                    run,
                    at_ms=T0 + i + 5,
                    workflow=workflow,
                    version="1",
                    status="completed",
                )
            )
        for ev in events:
            batch.append(LogRecord("x.lifecycle", 0, offset, run.encode(), codec.encode(ev)))
            offset += 1
        if len(batch) >= 5000:
            model.apply(batch, {0: offset})
            batch = []
    model.apply(batch, {0: offset})
    model.close()


def journal(steps: int) -> list[Record]:
    facts: list[Record] = [RunStarted("big", T0, workflow="w0", version="1", input=b"{}")]
    for seq in range(1, steps + 1):
        at = T0 + seq * 10
        facts.append(StepStarted("big", at, seq=seq, name="work", attempt=1))
        facts.append(
            StepCompleted(
                "big", at + 7, seq=seq, name="work", output=b"1", attempt=1, duration_ms=7
            )
        )
    return facts


def median_ms(url: str, n: int = 20) -> float:
    times = []
    for _ in range(n):
        began = time.perf_counter()
        with urllib.request.urlopen(url) as answer:
            answer.read()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    facts = journal(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        began = time.perf_counter()
        fill(path, args.runs)
        print(f"folded {args.runs:,} runs in {time.perf_counter() - began:.1f} s")
        settings = Settings().with_bootstrap("127.0.0.1:1")  # never asked: no catch-up
        dash = Dashboard("bench", settings, path, lambda run_id: facts)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(create_app(dash), port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        page2 = f"/runs?after={T0 + args.runs - 51}.run-{args.runs - 51:06}"
        for label, path_ in [
            ("list, no filter", "/runs"),
            ("list, next page", page2),
            ("list, status", "/runs?status=completed"),
            ("list, workflow+version", "/runs?workflow=w3&version=1"),
            ("list, tag (count scans, capped)", "/runs?tag=customer%3Dc-7"),
            ("list, since 1h (none match)", "/runs?since=1h"),
            ("list, id prefix", "/runs?prefix=run-0421"),
            (f"run page, {args.steps:,} steps", "/runs/big"),
        ]:
            print(f"{label:<34} {median_ms(base + path_):8.1f} ms (median of 20)")
        server.should_exit = True
        thread.join(10)
        dash.close()


if __name__ == "__main__":
    main()
