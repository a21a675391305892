"""``runstream runs tail`` and the dashboard over a namespace whose lifecycle topic is
written as ``json`` or ``avro-registry`` (Apicurio Registry on loopback, `tests/registry`)
show the same runs and events as over one written as ``avro``.

The same runs (steps, a failure that compensates, a signal, a pause, children,
continue-as-new, a rejected start) go through an engine of each format, each in its own
namespace, while a ``runs tail --json`` process and a dashboard follow it live, and a
foreign producer adds odd bytes; what they show is compared with the avro namespace's,
times left aside.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from starlette.testclient import TestClient

import runstream
from runstream.cli.ui_cmd import dashboard
from runstream.topics.admin import client_config, ensure_topics
from runstream.ui.server import Filters, create_app
from tests.registry.registry import running

from .flows import make_app
from .kit import PARTITIONS, ROOT, ThreadWorker, wait_for

pytestmark = pytest.mark.kafka

FORMATS = ("avro", "json", "avro-registry")
TIMES = ("at_ms", "duration_ms", "started_at_ms", "updated_at_ms", "ended_at_ms")


@dataclass
class Seen:
    """What the readers of one namespace showed."""

    tail: dict[str, list[dict[str, Any]]]  # run -> its events, as `runs tail --json` printed
    rows: dict[str, dict[str, Any]]  # run -> the dashboard's row of it
    live: dict[str, list[tuple[str, str]]]  # run -> (type, status) of its live events
    pages: dict[str, str]  # run -> its page's status and output, as text


class _Tail:
    """``runstream runs tail --json`` in its own process, its lines collected."""

    def __init__(self, ns: str, bootstrap: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        argv = [sys.executable, "-m", "runstream", "runs", "tail", "-n", ns]
        self.proc = subprocess.Popen(
            [*argv, "--bootstrap", bootstrap, "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def of(self, run_id: str) -> list[dict[str, Any]]:
        return [ev for ev in list(self.lines) if ev["run_id"] == run_id]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.thread.join(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _drive(client: runstream.Client) -> list[str]:
    """The runs every namespace goes through; the ids of those that end."""
    client.start("three_steps", 1, run_id="steps", tags={"team": "a", "note": "ünïcode ✓"})
    client.start("checkout", {"id": 7, "amount": -1}, run_id="declined")
    client.start("approval", None, run_id="approved")
    client.start("approval", None, run_id="held")
    client.start("doubles", 2, run_id="family")
    client.start("countdown", 1, run_id="count")
    client.start("three_steps", "not a number", run_id="bad-input")
    assert client.result("steps", timeout=60) == 4
    with pytest.raises(runstream.RunFailed):
        client.result("declined", timeout=60)
    with pytest.raises(runstream.RunRejected):
        client.result("bad-input", timeout=60)
    wait_for(lambda: client.get_run("held").steps == 0, what="held to wait")
    client.pause("held", reason="checking")
    wait_for(lambda: client.get_run("held").status == "paused", what="the pause")
    client.unpause("held")
    for run_id in ("approved", "held"):
        client.signal(run_id, "approve", {"by": "ånn"})
        assert client.result(run_id, timeout=60) == {"approved": True, "by": {"by": "ånn"}}
    assert len(client.result("family", timeout=60)) == 2
    client.result("count", timeout=60)
    return ["steps", "declined", "approved", "held", "family", "count", "bad-input"]


def _page(http: TestClient, run_id: str) -> str:
    html = http.get(f"/runs/{run_id}").text
    status = re.search(r'id="run-status">([^<]*)<', html)
    output = re.search(r'id="run-output">([^<]*)<', html)
    return f"{status and status[1]} {output and output[1]}"


def _seen(fmt: str, bootstrap: str, tmp: Path, registry: str | None) -> Seen:
    ns = f"t{uuid.uuid4().hex[:10]}"
    ensure_topics(bootstrap, ns, PARTITIONS)
    kw: dict[str, Any] = {"lifecycle_format": fmt}
    if registry is not None:
        kw["schema_registry_url"] = registry
    app = make_app(ns, bootstrap)

    @app.workflow
    async def double(ctx: runstream.Context, n: int) -> int:
        return 2 * n

    @app.workflow
    async def doubles(ctx: runstream.Context, n: int) -> list[int]:  # children, by their ids
        return [await ctx.child(double, i) for i in range(n)]

    worker = ThreadWorker(app, tmp / fmt / "state", **kw)
    tail = _Tail(ns, bootstrap)
    dash = dashboard(ns, bootstrap, tmp / fmt / "cache")
    try:
        dash.start()
        with runstream.Client(ns, bootstrap) as client:
            n = 0  # tail begins at the topic's end once connected: start runs until it sees one

            def tail_ready() -> bool:
                nonlocal n
                n += 1
                client.start("three_steps", n, run_id=f"probe-{n}", wait=False)
                time.sleep(0.5)
                return any(ev["run_id"].startswith("probe-") for ev in list(tail.lines))

            wait_for(tail_ready, timeout=60, what="runs tail to follow")
            ended = _drive(client)
        producer = Producer(client_config(bootstrap))  # a foreign producer's odd bytes
        for odd in (b'{"oops": true}', b'{"type": "run.started", "run_id": 7}', b"\x00\x00?"):
            producer.produce(f"{ns}.lifecycle", odd, b"steps")
        assert producer.flush(30) == 0
        runs = set(ended)
        wait_for(lambda: runs <= {r.run_id for r in dash.find(Filters())[0]}, what="the list")
        # the children and the successor, each on the partition of its own id: found by
        # prefix, once the dashboard has read that far on every partition
        later = {"family/": 2, "count~": 1}

        def found(prefix: str) -> set[str]:
            return {r.run_id for r in dash.find(Filters(prefix=prefix))[0]}

        wait_for(lambda: all(len(found(p)) == n for p, n in later.items()), what="children")
        for prefix in later:
            runs |= found(prefix)

        def all_shown() -> bool:
            rows = {r: dash.get(r) for r in runs}
            return all(row and len(tail.of(r)) == row.events for r, row in rows.items())

        wait_for(all_shown, timeout=60, what="tail and the dashboard to show every event")
        assert tail.proc.poll() is None and dash.error is None  # the odd bytes skipped
        recent = [ev for _, ev in dash.events_since(0)]
        with TestClient(create_app(dash)) as http:
            pages = {r: _page(http, r) for r in sorted(runs)}
            listed = http.get("/runs").text
        assert all(f">{r}<" in listed for r in ended)
        rows = {r: asdict(row) for r in runs if (row := dash.get(r)) is not None}
        return Seen(
            tail={r: tail.of(r) for r in runs},
            rows=rows,
            live={r: [(e["type"], e["status"]) for e in recent if e["run_id"] == r] for r in runs},
            pages=pages,
        )
    finally:
        tail.stop()
        dash.close()
        worker.stop()


@pytest.fixture(scope="module")
def seen(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("lifecycle-readers")
    out = {}
    with running(tmp / "registry.log") as registry:
        for fmt in FORMATS:
            out[fmt] = _seen(
                fmt, kafka_bootstrap, tmp, registry if fmt == "avro-registry" else None
            )
    yield out


def _timeless(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in TIMES}


@pytest.mark.parametrize("fmt", ["json", "avro-registry"])
def test_runs_tail_prints_the_same_events_as_over_avro(seen: dict[str, Seen], fmt: str) -> None:
    avro, other = seen["avro"], seen[fmt]
    assert set(other.tail) == set(avro.tail)
    assert len([r for r in avro.tail if r.startswith("family/")]) == 2 and "count~1" in avro.tail
    for run_id, events in avro.tail.items():
        assert events, run_id
        assert [_timeless(e) for e in other.tail[run_id]] == [_timeless(e) for e in events], run_id


@pytest.mark.parametrize("fmt", ["json", "avro-registry"])
def test_the_dashboard_shows_the_same_runs_events_and_pages_as_over_avro(
    seen: dict[str, Seen], fmt: str
) -> None:
    avro, other = seen["avro"], seen[fmt]
    assert set(other.rows) == set(avro.rows)
    for run_id, row in avro.rows.items():
        assert _timeless(other.rows[run_id]) == _timeless(row), run_id
    assert other.live == avro.live
    assert other.pages == avro.pages
    assert avro.pages["steps"] == "completed 4"
    assert avro.rows["steps"]["tags"] == {"team": "a", "note": "ünïcode ✓"}
    assert avro.rows["declined"]["status"] == "failed"
    assert ("run.paused", "paused") in avro.live["held"]
