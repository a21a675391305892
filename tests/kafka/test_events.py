"""Named events against the real broker: correlation by key, order, triggers."""

from __future__ import annotations

from collections import Counter

import pytest

import runstream
from runstream.audit.reader import audit
from runstream.topics.admin import ensure_topics

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, read_topic, wait_for
from .test_runs_ops import status_of

pytestmark = pytest.mark.kafka

RUNS, EACH = 100, 10


def test_1000_events_reach_100_waiting_runs_each_its_own_10_in_order(kafka_bootstrap, ns, tmp_path):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            for r in range(RUNS):
                client.start("listener", f"k{r}", run_id=f"l-{r}", wait=False)
            for n in range(EACH):  # kept for 10 minutes: a wait that comes later gets them
                for r in range(RUNS):
                    client.publish("tick", {"n": n}, key=f"k{r}", ttl="10m", wait=False)
                for stray in range(5):  # keys nobody waits on: they go nowhere
                    client.publish("tick", {"n": n}, key=f"nobody-{stray}", wait=False)
            client.flush()
            results = {r: client.result(f"l-{r}", timeout=180) for r in range(RUNS)}
            # the same event twice (a producer's retry), and another for the same key
            for event_id in ("e-1", "e-1", "e-2"):
                client.publish("order.placed", {"order": "o-1"}, event_id=event_id)
            wait_for(lambda: status_of(client, "placed:o-1") == "completed", what="trigger")
    finally:
        worker.stop()
    assert results == {r: list(range(EACH)) for r in range(RUNS)}
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=60)
    received = Counter(r["run_id"] for name, r, _ in journal if name == "EventReceived")
    assert received == {f"l-{r}": EACH for r in range(RUNS)}  # each exactly its own
    starts = Counter(r["run_id"] for name, r, _ in journal if name == "RunStarted")
    assert starts["placed:o-1"] == 1
    lifecycle = read_topic(kafka_bootstrap, f"{ns}.lifecycle", timeout=60)
    unmatched = [r for name, r, _ in lifecycle if r.get("type") == "event.unmatched"]
    assert len(unmatched) == 5 * EACH
    report = audit(kafka_bootstrap, ns, expect_finished=True)  # each match delivered once
    assert report.violations == [], report.violations
