"""Interceptors on the pure core: the chains' order, ``is_replaying`` across cache misses
and a restart, and the headers that travel from a start (command field or Kafka record
header) to the run, its steps (local and remote), its children and its successor."""

from __future__ import annotations

from typing import Any

import pytest

from runstream.engine import payload
from runstream.engine.work import LogRecord, StepJob
from runstream.engine.workflow import Registry, StepPolicy, step_def, workflow_def
from runstream.errors import StepError
from runstream.interceptors import (
    ActivationInput,
    ChildInput,
    ContinueAsNewInput,
    ExecuteInput,
    Interceptor,
    QueryInput,
    SignalInput,
    SleepInput,
    StepBody,
    StepBodyInput,
    StepInput,
    UpdateInput,
    WorkflowInbound,
    WorkflowOutbound,
    kafka_headers,
    outgoing_headers,
)
from runstream.runtime.steps import execute
from runstream.schemas.records import (
    LiveQuery,
    Pause,
    QueryAnswer,
    Reason,
    Signal,
    StartRun,
    Unpause,
    Update,
)

from .corehelp import Core


def double(x: int) -> int:
    return 2 * x


def boom(x: int) -> int:
    raise ValueError(f"boom {x}")


def far(x: int) -> int:  # a remote step (group "far")
    return x


async def kid(ctx: Any, x: int) -> int:
    return await ctx.step(double, x)


async def saga(ctx: Any, x: int) -> int:
    a = await ctx.step(double, x)
    await ctx.sleep(5)
    got = await ctx.wait_for_signal("go")
    b = await ctx.child(kid, a + got)
    return int(b)


async def failing(ctx: Any, x: int) -> int:
    return int(await ctx.step(boom, x))


async def remote(ctx: Any, x: int) -> int:
    return int(await ctx.step(far, x))


async def counter(ctx: Any, n: int) -> int:
    """Takes updates "add" (each a step) and answers query "total"; ends on signal "stop"."""
    total = [n]

    async def add(k: int) -> int:
        total[0] += await ctx.step(double, k)
        return total[0]

    ctx.update_handler("add", add)
    ctx.query_handler("total")(lambda: total[0])
    await ctx.wait_for_signal("stop")
    return total[0]


async def looping(ctx: Any, n: int) -> int:
    await ctx.step(double, n)
    if n < 1:
        ctx.continue_as_new(n + 1)
    return n


class Recorder(Interceptor):
    """Writes what each link sees to ``log`` as (name, what, is_replaying)."""

    def __init__(self, name: str, log: list[tuple[str, str, bool]]) -> None:
        self.name, self.log = name, log

    def workflow_inbound(self, next: WorkflowInbound) -> WorkflowInbound:
        rec = self

        class In(WorkflowInbound):
            async def execute(self, input: ExecuteInput) -> Any:
                rec.log.append((rec.name, "execute", input.is_replaying))
                return await self.next.execute(input)

            def activate(self, input: ActivationInput) -> Any:
                rec.log.append((rec.name, "activate", input.is_replaying))
                return self.next.activate(input)

            def signal(self, input: SignalInput) -> Any:
                rec.log.append((rec.name, f"signal {input.name}", input.is_replaying))
                return self.next.signal(input) + 1  # an inbound link may change the payload

            async def update(self, input: UpdateInput) -> Any:
                rec.log.append((rec.name, f"update {input.name}", input.is_replaying))
                return await self.next.update(input) * 10  # and a handler's result

            def query(self, input: QueryInput) -> Any:
                rec.log.append((rec.name, f"query {input.name}", False))
                return self.next.query(input)

        return In(next)

    def workflow_outbound(self, next: WorkflowOutbound) -> WorkflowOutbound:
        rec = self

        class Out(WorkflowOutbound):
            async def step(self, input: StepInput) -> Any:
                rec.log.append((rec.name, f"step {input.name} {input.seq}", input.is_replaying))
                input.headers[f"{rec.name}-step"] = str(input.seq)
                result = await self.next.step(input)
                what = f"stepped {input.name} {input.run_id}"
                rec.log.append((rec.name, what, input.is_replaying))
                return result

            async def sleep(self, input: SleepInput) -> None:
                rec.log.append((rec.name, f"sleep {input.seconds:g}", input.is_replaying))
                await self.next.sleep(input)

            async def child(self, input: ChildInput) -> Any:
                rec.log.append((rec.name, f"child {input.workflow}", input.is_replaying))
                input.headers[f"{rec.name}-child"] = "yes"
                return await self.next.child(input)

            def continue_as_new(self, input: ContinueAsNewInput) -> Any:
                rec.log.append((rec.name, "continue_as_new", input.is_replaying))
                input.headers["generation"] = str(input.input)
                return self.next.continue_as_new(input)

        return Out(next)


def registry(*interceptors: Interceptor) -> Registry:
    reg = Registry()
    for wf in (saga, kid, failing, remote, looping, counter):
        reg.add_workflow(workflow_def(wf))
    reg.add_step(step_def(far, StepPolicy(group="far"), None))
    reg.interceptors.extend(interceptors)
    return reg


def start(core: Core, run_id: str, workflow: str, value: Any, **headers: str) -> None:
    core.command(StartRun(run_id, workflow, input=payload.dumps(value), headers=headers))


def deliver(core: Core) -> None:
    """Deliver the commands the core sent to other runs, and run the steps, until none."""
    sent = 0
    while sent < len(core.commands) or core.queued:
        if core.queued:
            core.run_step(core.queued.pop(0))
        else:
            sent += 1
            core.command(core.commands[sent - 1])


def test_chains_run_outermost_first_and_see_every_operation() -> None:
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log), Recorder("b", log)))
    start(core, "r", "saga", 3)
    core.advance(5)
    core.signal("r", "go", 10)
    deliver(core)
    st = core.state("r")
    assert st.status == "completed"
    # the inbound signal links each added 1: the child got 6 + 12, doubled
    assert payload.loads(st.output) == 36
    first = [what for name, what, _ in log if name == "a"]
    assert first[:6] == [
        "activate",
        "execute",
        "step double 1",
        "activate",  # the step's outcome: the coroutine goes on
        "stepped double r",
        "sleep 5",
    ]
    assert "signal go" in first and "child kid" in first
    # for each call, a's link runs before b's (a is outermost)
    pairs = [(log[i], log[i + 1]) for i in range(len(log) - 1)]
    assert (("a", "activate", False), ("b", "activate", False)) in pairs
    assert (("a", "step double 1", False), ("b", "step double 1", False)) in pairs


def test_is_replaying_is_true_only_for_what_an_earlier_activation_settled() -> None:
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log)))
    core.auto_run_steps = False
    start(core, "r", "saga", 3)
    core.run_step(core.queued.pop(0))  # double settles: the cached coroutine goes on
    core.decider.forget(["r"])  # a cache miss: the next activation replays from the start
    core.advance(5)
    core.decider.forget(["r"])
    core.signal("r", "go", 1)
    core.decider.forget(["r"])
    deliver(core)  # the child runs, and its end reaches its parent
    assert core.state("r").status == "completed"
    stepped = [r for _, what, r in log if what == "stepped double r"]
    # once live (it settled then), then only in replays
    assert stepped[0] is False and all(stepped[1:]) and len(stepped) >= 3
    signals = [r for _, what, r in log if what == "signal go"]
    assert signals[0] is False and all(signals[1:])
    activations = [r for name, what, r in log if what == "activate"]
    assert activations[0] is False and True in activations


@pytest.mark.parametrize("restored", [False, True])
def test_a_runs_start_and_a_handlers_start_are_live_once_though_nothing_settled_yet(
    restored: bool,
) -> None:
    """The run's code and an update's handler each began in an earlier decision and wait
    on a step still running: the next activation (after a cache miss, or by a new owner
    from the journal) replays their starts. Nothing of theirs settled before it."""
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log)))
    core.auto_run_steps = False
    start(core, "r", "counter", 1)  # waits for "stop"
    core.command(Update("r", "add", update_id="u1", arg=payload.dumps(2), reply_to="c"))
    start(core, "s", "saga", 3)  # its first step is running
    for run_id in ("r", "s"):
        core.decider.forget([run_id])  # a cache miss, or a new owner: no coroutine cached
        mark = len(log)
        if restored:
            core.recover(run_id)  # as after a crash: the journal folded, the run recovered
        core.run_step(next(j for j in core.queued if j.run_id == run_id))  # a replay
        assert next(r for _, what, r in log[mark:] if what == "activate") is True
    assert [r for _, what, r in log if what == "execute"].count(False) == 2  # r's, s's
    assert [r for _, what, r in log if what == "update add"] == [False, True]


def test_a_runs_start_is_live_once_though_a_later_command_of_its_batch_was_undone() -> None:
    """One batch starts the run, refuses an oversize signal for it (its decision undone,
    the run's cached coroutine dropped) and then takes the signal the code waits for: that
    activation replays the start, which the batch's first activation ran live."""
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log)))
    huge = payload.dumps("x" * (2 << 20))  # more than the largest record
    core.commands_in_one_batch(
        StartRun("r", "counter", input=payload.dumps(1)),
        Signal("r", "other", payload=huge, signal_id="s1"),
        Signal("r", "stop", payload=payload.dumps(0), signal_id="s2"),
    )
    assert [d.code for d in core.dead] == [Reason.OVERSIZE]
    assert core.state("r").status == "completed"
    assert [r for _, what, r in log if what == "execute"] == [False, True]
    assert [r for _, what, r in log if what == "activate"] == [False, True]


def test_a_restart_replays_what_the_journal_holds() -> None:
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log)))
    core.auto_run_steps = False
    start(core, "r", "saga", 3)
    core.run_step(core.queued.pop(0))
    log.clear()
    core.decider.forget(["r"])  # a new owner has no coroutine cached
    core.recover("r")  # as a new owner after a crash: fold the journal, replay
    core.advance(5)
    assert ("a", "stepped double r", True) in log
    assert ("a", "stepped double r", False) not in log


def test_headers_travel_from_the_start_to_steps_children_and_the_successor() -> None:
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log)))
    core.auto_run_steps = False
    start(core, "r", "saga", 3, traceparent="tp", tenant="t1")
    assert core.facts("r", "RunStarted")[0].headers == {"traceparent": "tp", "tenant": "t1"}
    job = core.queued[0]
    assert job.headers == {"traceparent": "tp", "tenant": "t1", "a-step": "1"}
    core.run_step(core.queued.pop(0))
    core.advance(5)
    core.signal("r", "go", 1)
    child_start = next(c for c in core.commands if isinstance(c, StartRun))
    # a step's headers are its own: the child gets the run's, and what its link added
    assert child_start.headers == {"traceparent": "tp", "tenant": "t1", "a-child": "yes"}
    core.command(child_start)
    assert core.state(child_start.run_id).headers == child_start.headers  # type: ignore[union-attr]

    core = Core(registry(Recorder("a", log)))
    start(core, "loop", "looping", 0, tenant="t2")
    successor = [c for c in core.commands if isinstance(c, StartRun)][-1]
    assert successor.continued_from == "loop"
    assert successor.headers == {"tenant": "t2", "generation": "1"}


def test_a_remote_step_carries_its_headers_in_the_task() -> None:
    core = Core(registry(Recorder("a", [])))
    start(core, "r", "remote", 1, traceparent="tp")
    assert core.tasks[0].headers == {"traceparent": "tp", "a-step": "1"}


def test_kafka_record_headers_of_a_start_become_the_runs_headers() -> None:
    core = Core(registry())
    cmd = StartRun("r", "remote", input=b"1", headers={"tenant": "field wins"})
    headers = (
        ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("tenant", b"from kafka"),
        ("runstream-redrive", b"1"),  # Runstream's own: not an interceptor header
        ("binary", b"\xff\xfe"),  # not text: left out, the start goes on
    )
    core.offset += 1
    core.handle(LogRecord("t.commands", 0, core.offset, b"r", core.codec.encode(cmd), headers))
    assert core.facts("r", "RunStarted")[0].headers == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tenant": "field wins",
    }


def test_kafka_headers_keep_text_only_and_none_of_runstreams_own() -> None:
    raw = [("a", b"1"), ("runstream-redrive", b"2"), ("b", b"\xff")]
    assert kafka_headers(raw) == {"a": "1"}


def test_outgoing_headers_add_the_current_span_and_the_callers_win() -> None:
    otel = pytest.importorskip("opentelemetry.sdk.trace")
    tracer = otel.TracerProvider().get_tracer("t")
    assert outgoing_headers({"x": "1"}) == {"x": "1"}  # no span current: nothing added
    with tracer.start_as_current_span("client") as span:
        out = outgoing_headers({"x": "1"})
        ctx = span.get_span_context()
        assert out["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
        assert outgoing_headers({"traceparent": "mine"})["traceparent"] == "mine"


class Doubler(Interceptor):
    """A step-body link that doubles the first argument and records the outcome."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, str]] = []

    def step_body(self, next: StepBody) -> StepBody:
        seen = self.seen

        class Body(StepBody):
            def execute(self, input: StepBodyInput) -> Any:
                input.args = (input.args[0] * 2, *input.args[1:])
                try:
                    result = self.next.execute(input)
                except Exception as exc:
                    seen.append((input.name, f"raised {exc}", input.headers["h"]))
                    raise
                seen.append((input.name, result, input.headers["h"]))
                return result

        return Body(next)


def test_step_body_links_wrap_each_attempt_and_see_its_outcome() -> None:
    reg = registry()
    doubler = Doubler()
    ok = StepJob(0, "r", 1, 1, reg.step(double), (5,), headers={"h": "v"})
    outcome = execute(ok, None, [doubler])
    assert outcome.ok and payload.loads(outcome.output) == 20
    bad = StepJob(0, "r", 2, 1, reg.step(boom), (1,), headers={"h": "v"})
    outcome = execute(bad, None, [doubler])
    assert not outcome.ok and outcome.error == "ValueError: boom 2"
    assert doubler.seen == [("double", 20, "v"), ("boom", "raised boom 2", "v")]


def test_a_failed_step_reaches_the_outbound_link_as_its_error() -> None:
    errors: list[str] = []

    class Catch(Interceptor):
        def workflow_outbound(self, next: WorkflowOutbound) -> WorkflowOutbound:
            class Out(WorkflowOutbound):
                async def step(self, input: StepInput) -> Any:
                    try:
                        return await self.next.step(input)
                    except StepError as exc:
                        if not input.is_replaying:
                            errors.append(f"{input.name} attempt {input.attempt}: {exc}")
                        raise

            return Out(next)

    reg = registry(Catch())
    reg.add_step(step_def(boom, StepPolicy(retries=0), None))
    core = Core(reg)
    start(core, "r", "failing", 1)
    assert core.state("r").status == "failed"
    assert len(errors) == 1 and errors[0].startswith("boom attempt 1:")


def test_oversized_kafka_headers_dead_letter_the_start_with_its_reason() -> None:
    from runstream.engine.limits import Limits

    core = Core(registry(), limits=Limits(max_record=200_000))
    cmd = StartRun("r", "remote", input=b"1")
    big = (("baggage", b"x" * 250_000),)
    core.offset += 1
    core.handle(LogRecord("t.commands", 0, core.offset, b"r", core.codec.encode(cmd), big))
    assert [d.code for d in core.dead] == ["oversize"]
    assert "StartRun command is 250,0" in core.dead[0].reason
    assert core.names("r") == ["RunRejected"]


def test_a_duplicate_start_keeps_the_headers_of_the_first() -> None:
    core = Core(registry())
    start(core, "r", "remote", 1, traceparent="first")
    start(core, "r", "remote", 1, traceparent="second")
    assert core.state("r").headers == {"traceparent": "first"}
    assert [f.headers for f in core.facts("r", "RunStarted")] == [{"traceparent": "first"}]


def test_a_misrouted_start_is_forwarded_with_its_kafka_headers_in_it() -> None:
    from runstream.engine.decide import Decider
    from runstream.engine.partitioner import partition_for
    from runstream.engine.state import new_state
    from runstream.engine.work import Batch
    from runstream.schemas.codec import Codec

    decider, codec = Decider(registry(), partitions=4, journal_topic="t.journal"), Codec.default()
    run_id = next(f"r{i}" for i in range(100) if partition_for(f"r{i}".encode(), 4) != 0)
    cmd = StartRun(run_id, "remote", input=b"1")
    b = Batch(lambda _p, rid: new_state(rid), 1)
    header = (("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
    decider.handle(b, LogRecord("t.commands", 0, 7, run_id.encode(), codec.encode(cmd), header))
    (forward,) = b.effects.forwards
    assert forward.partition == partition_for(run_id.encode(), 4)
    forwarded = codec.decode(forward.value)
    assert isinstance(forwarded, StartRun)
    assert forwarded.headers == {"traceparent": header[0][1].decode()}


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_inbound_link_that_raises_around_an_activation_changes_nothing(when: str) -> None:
    class Broken(Interceptor):
        def workflow_inbound(self, next: WorkflowInbound) -> WorkflowInbound:
            class In(WorkflowInbound):
                def activate(self, input: ActivationInput) -> Any:
                    if when == "before":
                        raise RuntimeError("exporter down")
                    self.next.activate(input)
                    raise RuntimeError("exporter down")

            return In(next)

    core = Core(registry(Broken()))
    start(core, "r", "remote", 1)
    assert core.names("r") == ["RunStarted", "StepStarted"]  # the code ran, once
    core.answer(core.tasks[0], 7)
    assert core.state("r").status == "completed" and not core.dead


def test_a_step_that_settles_while_its_run_is_paused_is_live_to_the_code_at_unpause() -> None:
    """The code first sees the step's result after the unpause: not a replay, so a tracing
    interceptor emits its span then (and once)."""
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log)))
    core.auto_run_steps = False
    start(core, "r", "saga", 3)
    core.command(Pause("r", "hold"))
    core.run_step(core.queued.pop(0))  # double settles while paused: no code runs
    assert not [what for _, what, _ in log if what == "stepped double r"]
    core.decider.forget(["r"])  # a cache miss: the unpause replays from the start
    core.command(Unpause("r"))
    core.advance(5)  # and once more, from the cached coroutine
    stepped = [r for _, what, r in log if what == "stepped double r"]
    assert stepped == [False]


def test_an_update_refused_while_a_step_runs_keeps_that_step_live_to_interceptors() -> None:
    """The refusal replays the code to evaluate the update (no handler here): that replay
    must not mark the step in flight as a replay, or its span is never emitted."""
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log)))
    core.auto_run_steps = False
    start(core, "r", "saga", 3)
    core.decider.forget(["r"])  # a cache miss: the update replays the code from the start
    core.command(Update("r", "bump", update_id="u1", arg=payload.dumps(1), reply_to="c"))
    core.run_step(core.queued.pop(0))
    assert [r for _, what, r in log if what == "stepped double r"] == [False]


def test_a_querys_inbound_link_sees_the_callers_headers_over_the_runs() -> None:
    seen: list[dict[str, str]] = []

    class Peek(Interceptor):
        def workflow_inbound(self, next: WorkflowInbound) -> WorkflowInbound:
            class In(WorkflowInbound):
                def query(self, input: QueryInput) -> Any:
                    seen.append(dict(input.headers))
                    return self.next.query(input)

            return In(next)

    core = Core(registry(Peek()))
    start(core, "r", "counter", 1, tenant="the run's", trace="t1")
    asked = {"tenant": "the caller's"}
    core.command(LiveQuery("r", "q1", reply_to="me", name="total", arg=b"null", headers=asked))
    (answer,) = [a for _, a in core.replies if isinstance(a, QueryAnswer)]
    assert payload.loads(answer.value) == 1
    assert seen == [{"tenant": "the caller's", "trace": "t1"}]


def test_kafka_record_headers_of_a_query_reach_its_inbound_links() -> None:
    """A plain producer in any language sets Kafka record headers only: a live query's
    are merged into its headers as a start's are (the command's field wins)."""
    seen: list[dict[str, str]] = []

    class Peek(Interceptor):
        def workflow_inbound(self, next: WorkflowInbound) -> WorkflowInbound:
            class In(WorkflowInbound):
                def query(self, input: QueryInput) -> Any:
                    seen.append(dict(input.headers))
                    return self.next.query(input)

            return In(next)

    core = Core(registry(Peek()))
    start(core, "r", "counter", 1)
    cmd = LiveQuery("r", "q1", reply_to="me", name="total", arg=b"null", headers={"a": "field"})
    headers = (("a", b"kafka"), ("b", b"kafka"), ("runstream-redrive", b"1"), ("bin", b"\xff"))
    core.offset += 1
    core.handle(LogRecord("t.commands", 0, core.offset, b"r", core.codec.encode(cmd), headers))
    assert seen == [{"a": "field", "b": "kafka"}]


def test_updates_and_queries_pass_through_the_inbound_links() -> None:
    """An update's handler and a live query's handler each go through the inbound chain,
    outermost first; the update's handler is live once, then a replay."""
    log: list[tuple[str, str, bool]] = []
    core = Core(registry(Recorder("a", log), Recorder("b", log)))
    start(core, "r", "counter", 1)
    core.command(Update("r", "add", update_id="u1", arg=payload.dumps(2), reply_to="c"))
    (done,) = [a for _, a in core.replies if getattr(a, "stage", "") == "completed"]
    assert payload.loads(done.output) == 500  # 1 + 2 * 2, then * 10 by each link
    updates = [(name, r) for name, what, r in log if what == "update add"]
    assert updates[:2] == [("a", False), ("b", False)]
    core.decider.forget(["r"])
    core.signal("r", "stop", 0)  # a replay from the start runs the handler again
    assert [r for name, what, r in log if what == "update add" and name == "a"][-1] is True
    assert payload.loads(core.state("r").output) == 5  # the workflow's own total
    log.clear()
    core.command(LiveQuery("r", "q1", reply_to="me", name="total", arg=b"null"))
    (answer,) = [a for _, a in core.replies if isinstance(a, QueryAnswer)]
    assert payload.loads(answer.value) == 5
    assert [(n, w) for n, w, _ in log if w.startswith("query")] == [
        ("a", "query total"),
        ("b", "query total"),
    ]
