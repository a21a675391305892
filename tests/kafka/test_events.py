"""Named events against the real broker: correlation by key, order, triggers."""

from __future__ import annotations

import time
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


def test_an_event_matched_to_a_wait_that_timed_out_first_reaches_the_next_wait(
    kafka_bootstrap, ns, tmp_path
):
    """No engine runs while a run waits in slices of 1 s, and an event (no ttl) is
    published then. When the engine is back, the entity matches the event to the open
    slice, whose timeout is due: the run times the slice out before the delivery arrives
    (the cancel and the next slice's subscription follow the publish on the entity's
    partition). The run gives the event back, and a later slice gets it."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    app, state = make_app(ns, kafka_bootstrap), tmp_path / "state"
    engine = ThreadWorker(app, state)
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("poller", {"key": "k", "events": 2, "slice": 1}, run_id="p")

            def journal(name: str) -> list[dict]:
                records = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=5)
                return [r for n, r, _ in records if n == name and r["run_id"] == "p"]

            wait_for(lambda: journal("EventAwaited"), what="the run's first wait")
            engine.stop()
            client.publish("tick", {"n": 1}, key="k")  # only waits that exist get it
            time.sleep(1.5)  # the open slice's time passes while no engine runs
            engine = ThreadWorker(app, state)
            wait_for(lambda: journal("EventReceived"), timeout=60, what="the first event")
            client.publish("tick", {"n": 2}, key="k", ttl="10m")
            assert client.result("p", timeout=60) == [1, 2]  # before the fix: waits for ever
    finally:
        engine.stop()
    commands = read_topic(kafka_bootstrap, f"{ns}.commands", timeout=30)
    given_back = [r for name, r, _ in commands if name == "Subscribe" and r["event_id"]]
    journal = read_topic(kafka_bootstrap, f"{ns}.journal", timeout=30)
    timed_out = [r["seq"] for name, r, _ in journal if name == "EventTimedOut"]
    # Given back at least once, each time by a different wait that had timed out: on a slow
    # machine the next 1 s slice may time out too before the delivery reaches it.
    assert given_back and {r["subscriber"] for r in given_back} == {"p"}
    seqs = [r["seq"] for r in given_back]
    assert len(set(seqs)) == len(seqs) and set(seqs) <= set(timed_out), (seqs, timed_out)
    report = audit(kafka_bootstrap, ns, expect_finished=True)  # each received where matched
    assert report.violations == [], report.violations
