"""Named events on the pure core: the correlation entity, waits, time to live, triggers."""

from __future__ import annotations

import pytest

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.workflow import Registry, workflow_def
from runstream.errors import EventTimeout
from runstream.schemas.records import (
    IdKind,
    PublishEvent,
    StartRun,
    Subscribe,
    correlation_id,
    id_kind,
    limit_id,
    run_id_problem,
    schedule_id,
)

from .corehelp import Core


async def settle(ctx, order: str) -> dict:
    return await ctx.wait_for_event("paid", key=order)


async def collect(ctx, order: str) -> list:
    return [(await ctx.wait_for_event("tick", key=order))["n"] for _ in range(3)]


async def patient(ctx, order: str) -> str:
    try:
        await ctx.wait_for_event("paid", key=order, timeout="1m")
    except EventTimeout:
        return "gave up"
    return "paid"


async def ticks(ctx, key: str) -> list:
    """Waits for "tick" three times, each for a minute at most, as a polling loop would."""
    got = []
    for _ in range(3):
        try:
            got.append((await ctx.wait_for_event("tick", key=key, timeout="1m"))["n"])
        except EventTimeout:
            got.append("timeout")
    return got


async def ticks_later(ctx, key: str) -> list:
    """Waits for "tick" a minute, then again after an hour's sleep."""
    got = []
    for _ in range(2):
        try:
            got.append((await ctx.wait_for_event("tick", key=key, timeout="1m"))["n"])
        except EventTimeout:
            got.append("timeout")
        await ctx.sleep(3600)
    return got


async def fulfil(ctx, ev: dict) -> str:
    return f"fulfilled {ev['order']}"


def _core() -> Core:
    reg = Registry()
    for wf in (settle, collect, patient, ticks, ticks_later):
        reg.add_workflow(workflow_def(wf))
    reg.add_workflow(workflow_def(fulfil, on_event="placed", key=lambda ev: ev["order"]))
    return Core(reg)


def pump(core: Core) -> None:
    while core.commands:
        core.command(core.commands.pop(0))


def publish(core: Core, name: str, value, key: str = "", event_id: str = "", ttl_ms: int = 0):
    event_id = event_id or f"e{len(core.journal)}"
    cmd = PublishEvent(
        correlation_id(name, key),
        name,
        event_id=event_id,
        payload=payload.dumps(value),
        key=key,
        ttl_ms=ttl_ms,
    )
    core.command(cmd)
    pump(core)


def test_a_wait_gets_the_event_published_after_it():
    core = _core()
    core.start("r", "settle", "o-1")
    pump(core)  # the subscription reaches the entity of ("paid", "o-1")
    publish(core, "paid", {"amount": 5}, key="o-2")  # another key: not for r
    assert core.state("r").status == "running"
    publish(core, "paid", {"amount": 10}, key="o-1")
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == {"amount": 10}
    corr = correlation_id("paid", "o-1")
    assert [type(f).__name__ for f in core.facts(corr)] == [
        "EventSubscribed",
        "EventPublished",
        "EventMatched",
    ]
    assert check_run(core.facts("r"), expect_finished=True) == []
    assert fold(corr, core.facts(corr)).subscriptions == []


def test_an_event_whose_payload_is_not_json_is_refused_and_the_wait_goes_on():
    """A foreign producer's bytes: delivered, they would fail the waiting run at its
    replay, for good. Refused to the dead-letter topic instead, as a signal's are."""
    core = _core()
    core.start("r", "settle", "o-1")
    pump(core)
    before = len(core.journal)
    corr = correlation_id("paid", "o-1")
    core.command(PublishEvent(corr, "paid", event_id="bad", payload=b"{x", key="o-1"))
    pump(core)
    assert core.journal[before:] == [] and [d.code for d in core.dead] == ["invalid-input"]
    assert "not JSON" in core.dead[0].reason
    publish(core, "paid", {"amount": 10}, key="o-1")
    assert payload.loads(core.state("r").output) == {"amount": 10}


def test_an_event_published_before_the_wait_counts_only_within_its_time_to_live():
    core = _core()
    publish(core, "paid", {"n": 1}, key="a", ttl_ms=60_000)
    publish(core, "paid", {"n": 2}, key="b")  # ttl 0: only waits that exist
    core.start("ra", "settle", "a")
    core.start("rb", "settle", "b")
    pump(core)
    assert payload.loads(core.state("ra").output) == {"n": 1}
    assert core.state("rb").status == "running"
    core.now += 61_000
    core.start("late", "settle", "a")  # past its time to live
    pump(core)
    assert core.state("late").status == "running"


def test_a_wait_in_a_loop_gets_each_event_once_in_publish_order():
    core = _core()
    for n in (1, 2):
        publish(core, "tick", {"n": n}, key="k", ttl_ms=600_000)
    core.start("c", "collect", "k")
    pump(core)
    publish(core, "tick", {"n": 3}, key="k")
    publish(core, "tick", {"n": 4}, key="k")
    assert payload.loads(core.state("c").output) == [1, 2, 3]
    assert check_run(core.facts("c"), expect_finished=True) == []


def test_a_retried_publish_counts_once():
    core = _core()
    core.start("c", "collect", "k")
    pump(core)
    for _ in range(3):
        publish(core, "tick", {"n": 1}, key="k", event_id="same")
    publish(core, "tick", {"n": 2}, key="k")
    assert core.state("c").status == "running"  # it got 1 and 2, waits for a third
    assert len(core.facts("c", "EventReceived")) == 2


def test_a_wait_times_out_and_a_later_event_is_not_for_it():
    core = _core()
    core.start("p", "patient", "o-9")
    pump(core)
    core.advance(60)
    pump(core)  # the entity drops the subscription
    assert payload.loads(core.state("p").output) == "gave up"
    publish(core, "paid", {}, key="o-9")
    assert core.names("p")[-1] == "RunCompleted"
    corr = correlation_id("paid", "o-9")
    assert fold(corr, core.facts(corr)).subscriptions == []
    assert check_run(core.facts("p"), expect_finished=True) == []


@pytest.mark.parametrize("ttl_ms", [0, 600_000])
def test_an_event_matched_to_a_wait_that_timed_out_first_goes_to_the_next_wait(ttl_ms):
    """The entity matches the event to the wait, but the run's timeout fires before the
    delivery arrives: the run gives the event back and its next wait gets it."""
    core = _core()
    core.start("t", "ticks", "k")
    pump(core)
    event = PublishEvent(
        correlation_id("tick", "k"),
        "tick",
        event_id="e1",
        payload=b'{"n": 1}',
        key="k",
        ttl_ms=ttl_ms,
    )
    core.command(event)  # matched: its DeliverEvent is on its way to the run...
    core.advance(60)  # ...when the wait times out, and the next wait subscribes
    pump(core)
    assert core.state("t").status == "running"
    publish(core, "tick", {"n": 2}, key="k")
    assert payload.loads(core.state("t").output) == ["timeout", 1, 2]
    assert check_run(core.facts("t"), expect_finished=True) == []
    corr = correlation_id("tick", "k")
    matched = [(f.seq, f.event_id) for f in core.facts(corr, "EventMatched") if f.event_id]
    received = [(f.seq, f.event_id) for f in core.facts("t", "EventReceived")]
    assert received == [(2, "e1"), (3, received[1][1])]
    assert set(received) <= set(matched)  # each event received where it was matched


def test_an_event_given_back_by_a_timed_out_wait_is_kept_for_a_later_wait_within_its_ttl():
    core = _core()
    core.start("t", "ticks_later", "k")
    pump(core)
    event = PublishEvent(
        correlation_id("tick", "k"),
        "tick",
        event_id="e1",
        payload=b'{"n": 1}',
        key="k",
        ttl_ms=7_200_000,
    )
    core.command(event)
    core.advance(60)  # timed out; the run sleeps an hour before it waits again
    pump(core)
    core.advance(3600)
    pump(core)
    core.advance(3600)
    pump(core)
    assert payload.loads(core.state("t").output) == ["timeout", 1]
    assert check_run(core.facts("t"), expect_finished=True) == []


def test_an_event_triggered_workflow_starts_once_per_key():
    core = _core()
    publish(core, "placed", {"order": "o-1"}, event_id="a")
    publish(core, "placed", {"order": "o-1"}, event_id="a")  # a producer's retry
    publish(core, "placed", {"order": "o-1"}, event_id="b")  # same key: same run
    publish(core, "placed", {"order": "o-2"}, event_id="c")
    runs = sorted(r for r in core.states if r.startswith("fulfil:"))
    assert runs == ["fulfil:o-1", "fulfil:o-2"]
    assert payload.loads(core.state("fulfil:o-1").output) == "fulfilled o-1"
    assert core.names("fulfil:o-1").count("RunStarted") == 1


def test_an_event_nobody_wants_is_counted_in_the_lifecycle_stream_not_dead_lettered():
    core = _core()
    publish(core, "nobody.cares", {"x": 1}, key="z")
    assert core.dead == []
    (ev,) = [e for e in core.lifecycle if e.type == "event.unmatched"]
    assert ev.run_id == correlation_id("nobody.cares", "z") and "nobody.cares" in ev.reason


def test_entity_ids_are_reserved_and_long_pairs_are_hashed():
    assert run_id_problem("~event/x/y", new=True) is not None
    core = _core()
    core.command(StartRun("~mine", "settle", input=b'"o"'))
    assert [d.code for d in core.dead] == ["bad-run-id"]
    corr = correlation_id("n" * 200, "k" * 200)
    assert len(corr.encode()) <= 255 and corr.startswith("~event/")


def test_an_ids_kind_comes_from_its_prefix_hashed_or_not():
    assert id_kind(correlation_id("paid", "o-1")) is IdKind.EVENT
    assert id_kind(correlation_id("n" * 200, "k" * 200)) is IdKind.EVENT
    assert id_kind(limit_id("payments")) is IdKind.LIMIT
    assert id_kind(limit_id("checkout", "k" * 300)) is IdKind.LIMIT
    assert id_kind(schedule_id("nightly")) is IdKind.SCHEDULE
    assert id_kind("order-1") is id_kind("order-1~2") is id_kind("~mine") is IdKind.RUN


@pytest.mark.parametrize("key", ["", "o-1"])
def test_the_entitys_facts_pass_the_audit(key):
    core = _core()
    core.start("r", "settle", key)
    pump(core)
    publish(core, "paid", {"ok": True}, key=key)
    corr = correlation_id("paid", key)
    assert check_run(core.facts(corr), expect_finished=True) == []


def test_the_testing_kit_delivers_events_published_by_the_test():
    import runstream
    from runstream.testing import WorkflowTester

    app = runstream.App("kit")

    @app.workflow
    async def shipping(ctx, order: str) -> dict:
        return await ctx.wait_for_event("shipped", key=order, timeout="7d")

    t = WorkflowTester(app)
    t.publish("shipped", {"carrier": "early"}, key="o-1", ttl="1h")  # before the wait
    run = t.start("shipping", "o-1")
    assert run.result() == {"carrier": "early"}
    late = t.start("shipping", "o-2")
    t.publish("shipped", {"carrier": "ups"}, key="o-2")
    assert late.result() == {"carrier": "ups"}


async def summarise(ctx, events: list) -> int:
    return sum(e["n"] for e in events)


def _batching_core(**kw) -> Core:
    reg = Registry()
    reg.add_workflow(workflow_def(summarise, on_event="click", **kw))
    return Core(reg)


def test_a_batch_trigger_starts_one_run_per_full_batch_of_one_key():
    core = _batching_core(batch=3)
    for n in range(7):
        publish(core, "click", {"n": n}, key="page-1", event_id=f"c{n}")
    publish(core, "click", {"n": 100}, key="page-2", event_id="other")
    runs = sorted(r for r in core.states if r.startswith("summarise:"))
    assert runs == ["summarise:page-1:c0", "summarise:page-1:c3"]  # c6 waits for two more
    assert payload.loads(core.state("summarise:page-1:c0").output) == 0 + 1 + 2
    assert payload.loads(core.state("summarise:page-1:c3").output) == 3 + 4 + 5


def test_a_window_trigger_starts_the_batch_when_its_window_closes():
    core = _batching_core(window="5s", batch=100)
    publish(core, "click", {"n": 1}, key="k", event_id="a")
    core.advance(2)
    publish(core, "click", {"n": 2}, key="k", event_id="b")
    assert not any(r.startswith("summarise:") for r in core.states)
    core.advance(3)  # five seconds after the first event
    pump(core)
    assert payload.loads(core.state("summarise:k:a").output) == 3
    publish(core, "click", {"n": 5}, key="k", event_id="c")  # a new batch, a new window
    core.advance(5)
    pump(core)
    assert payload.loads(core.state("summarise:k:c").output) == 5
    corr = correlation_id("click", "k")
    assert check_run(core.facts(corr)) == [] and fold(corr, core.facts(corr)).batches == {}


def test_batch_and_window_need_on_event():
    with pytest.raises(TypeError, match="need on_event"):
        workflow_def(summarise, batch=3)


def test_a_wait_that_subscribes_twice_holds_one_subscription():
    """A run that failed while subscribed, retried, subscribes the same wait (run, seq)
    again: the entity keeps one subscription, so the wait's timeout cancel finds the match
    of the event on its way, not a second subscription (found by the model's long run: the
    next wait skipped that event for a later one)."""
    core = _core()
    corr = correlation_id("tick", "k")
    wait = Subscribe(corr, "tick", subscriber="t", seq=2, key="k")
    core.command(wait)
    core.command(wait)  # the retried run's wait, at the same seq
    assert len(core.facts(corr, "EventSubscribed")) == 1
    core.command(PublishEvent(corr, "tick", event_id="e1", payload=b"1", key="k", ttl_ms=60_000))
    core.command(Subscribe(corr, "tick", subscriber="t", seq=2, key="k", cancel=True))
    undone = [f for f in core.facts(corr, "EventMatched") if f.undone]
    assert [(f.seq, f.event_id) for f in undone] == [(2, "e1")]  # kept for the next wait
    assert fold(corr, core.facts(corr)) == core.state(corr)
