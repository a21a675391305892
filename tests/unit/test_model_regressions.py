"""Failures the model-based tier (test_core_model.py) found, shrunk to small named cases.

Each fails on the engine as it is when it was written; the docstring says the defect in
one sentence and the issue-19 defect it matches, if any. `Shell` (modeldriver.py) is used
where the shell's timer heap, a restore or an empty batch matter; `Core` elsewhere.
"""

from __future__ import annotations

from typing import Any

from runstream import App
from runstream.audit import check_run
from runstream.engine import payload
from runstream.errors import TIMED_OUT, ChildFailed, EventTimeout
from runstream.schemas.records import (
    EventReceived,
    PublishEvent,
    Retry,
    RunFailed,
    StartRun,
    StepFailed,
    correlation_id,
)

from .corehelp import Core
from .modeldriver import Shell
from .test_core_model import CoreModel

app = App("regressions")


@app.step(retries=0)
def work(n: int) -> int:
    return n


@app.step(group="remote", retries=0, timeout="20s", heartbeat="5s")
def remote(n: int) -> int:
    raise AssertionError("a remote step never runs in the engine")


@app.workflow
async def hop(ctx: Any, n: int) -> Any:
    """Continues as new once (0 as 1, 2 as 3); then 1 runs a step, 3 waits for a signal."""
    if n in (0, 2):
        ctx.continue_as_new(n + 1)
    if n == 1:
        return await ctx.step(work, n)
    return await ctx.wait_for_signal("go")


@app.workflow
async def parent_of_hop(ctx: Any, n: int) -> Any:
    return await ctx.child("hop", n)


@app.workflow
async def far(ctx: Any, n: int) -> int:
    return int(await ctx.step(remote, n))


@app.workflow
async def ticks(ctx: Any, n: int) -> list[Any]:
    """Two waits for an event, each with a timeout."""
    got = []
    for _ in range(2):
        try:
            got.append(await ctx.wait_for_event("tick", key="k", timeout="5s"))
        except EventTimeout:
            got.append(None)
    return got


@app.workflow(timeout="3s")
async def tick_once(ctx: Any, n: int) -> Any:
    """One wait for an event, longer than the run's own timeout."""
    return await ctx.wait_for_event("tick", key="k", timeout="10s")


@app.workflow
async def parent_of_named(ctx: Any, n: int) -> Any:
    """Awaits a child under a chosen run id, which another parent may have taken."""
    try:
        return await ctx.child("hop", 3, run_id="named")
    except ChildFailed as exc:
        return exc.status


@app.workflow(concurrency_key=lambda n: "one", timeout="30s")
async def single(ctx: Any, n: int) -> int:
    return int(await ctx.step(work, n))


def pump(core: Core) -> None:
    while core.commands:
        core.command(core.commands.pop(0))


def settle(shell: Shell) -> None:
    """Deliver every command pending (no time passes)."""
    while shell.pending():
        shell.deliver(next(p for p, q in enumerate(shell.queues) if q))


def test_a_parent_hears_of_a_child_that_continued_as_new():
    """The end of an awaited child that continued as new comes back from `<child>~1`,
    which the parent refuses ("awaits no child"), so the parent waits for ever. Not in
    issue 19's list; the same gap as its defect 5 (continue-as-new breaks the link
    between a parent and its child), for results instead of cancels."""
    core = Core(app.registry)
    core.start("p", "parent_of_hop", 0)
    pump(core)
    assert core.state("p/1~1").status == "completed"
    assert not core.dead, [d.reason for d in core.dead]
    assert core.state("p").status == "completed"


def test_an_event_matched_to_a_wait_that_timed_out_first_reaches_the_next_wait():
    """The entity matches a kept event to a wait and marks it delivered; the wait times
    out before the delivery arrives, the run drops it, and its next wait (within the
    event's ttl) skips it as delivered: the event is lost (issue 19, defect 3)."""
    shell = Shell(app.registry, partitions=1)
    shell.send(StartRun("r", "ticks", input=b"0"))
    shell.deliver(0)  # the run waits; its subscription is on its way
    corr = correlation_id("tick", "k")
    shell.send(PublishEvent(corr, "tick", event_id="e1", payload=b"1", key="k", ttl_ms=60_000))
    shell.deliver(0)  # the subscription
    shell.deliver(0)  # e1, matched to the first wait: its delivery is on its way
    shell.now += 6_000
    shell.fire_due()  # the first wait times out first; the second one subscribes
    settle(shell)
    received = [f.event_id for f in shell.facts("r") if isinstance(f, EventReceived)]
    assert received == ["e1"]


def test_an_event_in_flight_to_a_timed_out_wait_reaches_the_next_wait_before_a_later_one():
    """A wait times out while the event matched to it is on its way; the run's next wait
    subscribes before that delivery comes back, skips the event (marked delivered) and
    takes a later one: the kept event is lost to the run, and the order broken. (Defect
    3's fix gives the event back, but only to a wait still open when it returns.)"""
    shell = Shell(app.registry, partitions=1)
    shell.send(StartRun("r", "ticks", input=b"0"))
    shell.deliver(0)  # the run waits (wait 1); its subscription is on its way
    corr = correlation_id("tick", "k")
    shell.send(PublishEvent(corr, "tick", event_id="e1", payload=b"1", key="k", ttl_ms=60_000))
    shell.now += 6_000
    shell.fire_due()  # wait 1 times out before anything reaches the entity: wait 2 subscribes
    shell.send(PublishEvent(corr, "tick", event_id="e2", payload=b"2", key="k", ttl_ms=60_000))
    # The entity: e1 kept, wait 1 subscribes (gets e1), wait 1 cancelled, wait 2 subscribes,
    # e2; the run then gets e1 for wait 1 (timed out: given back) and e2 for wait 2.
    settle(shell)
    received = [f.event_id for f in shell.facts("r") if isinstance(f, EventReceived)]
    assert received == ["e1"]


def test_an_event_matched_to_the_wait_of_a_run_that_failed_reaches_it_after_its_retry():
    """A run fails (its timeout) while its wait's subscription is on its way; the entity
    matches a kept event to that wait, and the failed run drops the delivery. Retried,
    the run waits again at the same seq, and the entity skips the event as delivered:
    the event is lost to the run though it is within its time to live."""
    shell = Shell(app.registry, partitions=1)
    shell.send(StartRun("r", "tick_once", input=b"0"))
    shell.deliver(0)  # the run waits; its subscription is on its way
    shell.now += 4_000
    shell.fire_due()  # the run times out
    corr = correlation_id("tick", "k")
    shell.send(PublishEvent(corr, "tick", event_id="e1", payload=b"1", key="k", ttl_ms=60_000))
    settle(shell)  # the subscription, e1 (matched to it), its delivery (the run failed)
    assert shell.run_state("r").status == "failed"
    shell.send(Retry("r", "again", retry_id="t1"))
    settle(shell)
    received = [f.event_id for f in shell.facts("r") if isinstance(f, EventReceived)]
    assert received == ["e1"]
    assert shell.run_state("r").status == "completed"


def test_a_parent_hears_that_its_child_could_not_start_because_its_id_is_taken():
    """A child whose run id already exists is refused on its own partition, and nothing
    tells its parent, which waits for ever (issue 19, defect 4)."""
    core = Core(app.registry)
    core.start("p1", "parent_of_named", 1)
    core.start("p2", "parent_of_named", 2)
    pump(core)
    assert core.state("named").status == "running"  # p1's child, waiting for its signal
    assert core.names("p2")[-2:] == ["ChildEnded", "RunCompleted"]
    assert core.state("p2").output == payload.dumps("rejected")  # the ChildFailed's status


def test_a_cancel_reaches_the_run_a_finished_run_continued_as():
    """A cancel of a run that continued as new stops at the finished run, while its
    continuation runs on (issue 19, defect 5)."""
    core = Core(app.registry)
    core.start("c", "hop", 2)
    pump(core)
    assert core.state("c~1").status == "running"
    core.cancel("c")
    pump(core)
    assert core.state("c~1").status == "cancelled"


def test_a_remote_step_times_out_after_its_partition_is_restored():
    """After a takeover the liveness timer of an open remote attempt fires once into an
    empty batch, which the shell drops, and is never armed again: the attempt never
    times out (issue 19, defect 1)."""
    shell = Shell(app.registry, partitions=1)
    shell.send(StartRun("r", "far", input=b"1"))
    settle(shell)
    shell.now += 1_000
    shell.restore(0)  # a new owner, 1 s into the attempt
    for _ in range(60):  # a minute passes, second by second: past every liveness due time
        shell.now += 1_000
        shell.fire_due()
    failed = [f.error for f in shell.facts("r") if isinstance(f, StepFailed)]
    assert failed, "the attempt never timed out"
    assert "StepTimeout" in failed[0]


def test_a_retried_run_is_not_timed_out_again_by_the_deadline_it_had_passed():
    """A run that failed by its run timeout and is retried keeps its expired deadline, so
    the next timer fails it again at once (issue 19, defect 6)."""
    shell = Shell(app.registry, partitions=1)
    shell.send(StartRun("holder", "single", input=b"1"))  # takes the key's one permit
    shell.send(StartRun("r", "single", input=b"2"))  # waits for it
    settle(shell)
    shell.now += 31_000
    shell.fire_due()
    settle(shell)
    assert shell.state("r").error.startswith(TIMED_OUT)
    shell.send(Retry("r", "again"))
    settle(shell)
    shell.now += 1_000
    shell.fire_due()
    fails = [f for f in shell.facts("r") if isinstance(f, RunFailed)]
    assert len(fails) == 1, [f.error for f in fails]


def test_the_audit_accepts_a_retried_run_asking_again_for_its_permit():
    """A run with a concurrency_key that timed out while waiting for its permit asks for
    it again when retried (as the engine now does), and the audit calls that second
    PermitRequested a violation: the audit and the engine disagree. Not in issue 19's
    list; found beside its defect 6."""
    shell = Shell(app.registry, partitions=1)
    shell.send(StartRun("holder", "single", input=b"1"))
    shell.send(StartRun("r", "single", input=b"2"))
    settle(shell)
    shell.now += 31_000
    shell.fire_due()
    settle(shell)
    shell.send(Retry("r", "again"))
    settle(shell)
    names = [type(f).__name__ for f in shell.facts("r")]
    assert names[-2:] == ["RunRetried", "PermitRequested"]
    assert check_run(shell.facts("r")) == []


def test_a_retry_delivered_twice_retries_the_run_once():
    """A retry resent by its client (the same `retry_id`, as `client.retry` sets one) after
    the run failed again retries it once, not twice. A Retry with no id is a new retry by
    design (an older client's, or one with new input), so this one carries an id. Not in
    issue 19's list."""
    core = Core(app.registry)
    core.start("r", "far", 1)
    [task] = core.tasks
    core.answer(task, error="boom", retryable=False)
    retry = Retry("r", "again", retry_id="once")
    core.command(retry)
    core.answer(core.tasks[-1], error="boom again", retryable=False)
    assert core.state("r").status == "failed"
    core.command(retry)  # the same command, delivered again
    assert core.names("r").count("RunRetried") == 1


def test_a_retried_runs_wait_timing_out_frees_the_event_matched_to_its_first_incarnation():
    """A run fails by its run timeout while its event wait (seq 2) is matched to e1, and is
    retried: its new wait at seq 2 subscribes again, then times out before e1's delivery
    arrives. The cancel removed only the new subscription and left e1 marked delivered, so
    the next wait skipped e1 (within its ttl) for a later event. Found by the model's long
    run at about 16,000 examples; these are its shrunk steps."""
    model = CoreModel()
    model.begin(starts=[("saga", 0), ("waiter", 1)])
    model.advance(seconds=61)  # r1 times out while waiting for its event
    model.publish(key="1", ttl_ms=3000)  # e1, matched to r1's wait
    model.retry(i=1)
    model.abort_and_redo(p=0)
    model.advance(seconds=0)
    model.publish(key="1", ttl_ms=0)  # e2
    model.teardown()  # checks that no wait skipped an event within its ttl


def test_a_retry_after_the_ttl_of_an_event_that_reached_the_failed_run_waits_for_a_new_one():
    """The model's invariant, not the engine, was wrong here. A run fails (its timeout)
    with its wait's subscription on its way; an event with a 3 s ttl is matched to that
    wait and given back by the failed run; the run is retried 5 s later. The event had
    expired before the retried wait began, so the retried wait takes the next event, as
    for any wait that begins after an event's ttl. The invariant took the first
    incarnation's subscription as the wait's start and called the event skipped (the
    model's long run, at 26,605 examples; these are its shrunk steps, checked at the end
    by the corrected invariant)."""
    model = CoreModel()
    model.begin(starts=[("saga", 0), ("parent", 0), ("waiter", 0)])
    model.step_outcome(i=0, how="ok")
    model.abort_and_redo(p=0)  # r2 (waiter) starts
    model.advance(seconds=61)  # r2 times out, its event wait's subscription on its way
    model.publish(key="0", ttl_ms=3000)  # e1, kept till 64 s
    for _ in range(3):
        model.start(workflow="saga", n=0)
        model.abort_and_redo(p=0)
    model.advance(seconds=0)  # 66 s
    model.retry(i=135)  # r2, after e1 expired
    model.publish(key="0", ttl_ms=3000)  # e2
    model.quiescent_point()
    got = [f.event_id for f in model.shell.facts("r2") if isinstance(f, EventReceived)]
    assert got == ["e2"]


def test_a_retried_run_subscribing_again_to_a_wait_already_matched_takes_no_second_event():
    """A run fails (its timeout) with its event wait (seq 2) subscribing; it is retried and
    waits again at seq 2, subscribing again. The entity matches a kept event e1 to the
    first subscription, then took the second as a new wait of the same seq: a second
    event e2 was matched to that one wait, the wait's timeout undid e2 instead of e1, and
    the run's next wait took e2, skipping e1 within its ttl. Found by the model's long
    run at about 20,000 examples; these are its shrunk steps."""
    model = CoreModel()
    model.begin(starts=[])
    model.publish(key="0", ttl_ms=3000)  # e1, on its way to the entity
    model.start(n=0, workflow="saga")
    model.start(n=0, workflow="waiter")  # r1
    model.deliver(p=0)  # r1 waits for its signal
    model.retry(i=1)
    model.advance(seconds=61)  # r1's signal wait and run time out; its event wait subscribes
    model.deliver(p=0)  # the retry: r1 waits at seq 2 again, and subscribes again
    model.retry(i=1)
    model.publish(key="0", ttl_ms=3000)  # e2
    model.advance(seconds=61)  # r1's wait 2 and the run time out again
    model.teardown()  # checks that no wait skipped an event within its ttl


def test_a_step_that_settles_while_its_run_is_paused_stays_live_across_a_run_timeout_and_retry():
    """r1 is paused; its step settles while paused (live to the code only at the unpause);
    the run's timeout ends it, and a retry starts it again. The retry's first activation
    replays that step, yet no live activation had seen it, so the interceptors never saw
    it settle (the model's long run at about 31,000 examples; these are its shrunk steps)."""
    model = CoreModel()
    steps: list[Any] = [
        lambda: model.begin(starts=[("saga", 0), ("promised", 1)]),
        lambda: model.pause(i=1, unpause=False),
        lambda: model.abort_and_redo(p=0),
        lambda: model.advance(seconds=0),
        lambda: model.retry(i=1),
        lambda: model.abort_and_redo_outcome(how="terminal", i=0),
        lambda: model.step_outcome(how="ok", i=0),
        lambda: model.advance(seconds=0),
    ]
    for step in steps:
        step()
        model.after_every_step()
    model.teardown()
