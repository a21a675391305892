"""A run's history cap, set through Settings, on the real broker: the run fails with
``history-too-large`` and the client raises `HistoryTooLarge`; the lifecycle topic
carries the warning once. (The rules themselves: tests/unit/test_history_caps.py.)"""

from __future__ import annotations

import pytest

import runstream
from runstream.schemas.codec import Codec
from runstream.schemas.records import Kind, LifecycleEvent
from runstream.topics.admin import client_config, ensure_topics
from runstream.topics.kafka import read_to_end

from .kit import PARTITIONS, ThreadWorker

pytestmark = pytest.mark.kafka


def test_a_runaway_loop_fails_at_its_history_cap_and_the_client_says_why(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    app = runstream.App(ns, bootstrap=kafka_bootstrap)

    @app.step
    def tick(i: int) -> int:
        return i

    @app.workflow
    async def runaway(ctx: runstream.Context) -> None:
        i = 0
        while True:  # a loop that never continues as new
            await ctx.step(tick, i)
            i += 1

    worker = ThreadWorker(app, tmp_path / "state", history_warn_events=50, history_max_events=100)
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("runaway", run_id="loop-1")
            with pytest.raises(runstream.HistoryTooLarge, match="continue_as_new"):
                client.result("loop-1", timeout=60)
            assert client.get_run("loop-1").code == "history-too-large"
    finally:
        worker.stop()
    codec = Codec.default()
    events = [
        e
        for batch in read_to_end(client_config(kafka_bootstrap), f"{ns}.lifecycle")
        for r in batch
        if isinstance(e := codec.decode(r.value or b""), LifecycleEvent)
    ]
    warned = [e for e in events if e.type == Kind.RUN_HISTORY_LARGE]
    assert [e.run_id for e in warned] == ["loop-1"]
