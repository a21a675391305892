"""`runstream.otel.Tracing` on the pure core, spans collected by the SDK's in-memory
exporter: one trace from the start's traceparent, each span under the right parent, and a
replay (a new owner after a crash) emitting no step span again."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runstream.engine import payload
from runstream.engine.interceptors import ended
from runstream.engine.state import RunState
from runstream.engine.workflow import Registry, workflow_def
from runstream.otel import Tracing, run_span_id, run_trace_id, step_span_id
from runstream.runtime.steps import execute
from runstream.schemas.records import StartRun

from .corehelp import Core

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CLIENT_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE:032x}-{CLIENT_SPAN:016x}-01"


def charge(x: int) -> int:
    return x + 1


async def kid(ctx: Any, x: int) -> int:
    return int(await ctx.step(charge, x))


async def order(ctx: Any, x: int) -> int:
    a = await ctx.step(charge, x)
    await ctx.sleep(1)
    got = await ctx.wait_for_signal("ok")
    return int(await ctx.child(kid, a + got))


class Traced:
    """A Core whose step bodies and run ends go through the interceptors, as the shell's."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = Tracing(provider)
        reg = Registry()
        reg.add_workflow(workflow_def(order))
        reg.add_workflow(workflow_def(kid))
        reg.interceptors.append(self.tracing)
        self.reg, self.core = reg, Core(reg)
        self.core.auto_run_steps = False
        self.sent = 0
        self.ended: set[tuple[str, int]] = set()  # (run, retries) told

    def settle(self) -> None:
        """Run queued bodies and deliver sent commands until there are none; tell the ends."""
        core = self.core
        while self.sent < len(core.commands) or core.queued:
            if core.queued:
                core.handle(execute(core.queued.pop(0), None, self.reg.interceptors))
            else:
                self.sent += 1
                core.command(core.commands[self.sent - 1])
        for st in core.states.values():
            if (
                isinstance(st, RunState)
                and st.terminal
                and (st.run_id, st.retries) not in self.ended
            ):
                self.ended.add((st.run_id, st.retries))
                self.tracing.run_ended(ended(st, st.ended_at_ms or core.now))

    def spans(self, prefix: str = "") -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_a_saga_is_one_trace_with_each_span_under_its_parent() -> None:
    t = Traced()
    start = StartRun("o1", "order", input=payload.dumps(1), headers={"traceparent": TRACEPARENT})
    t.core.command(start)
    t.settle()
    t.core.advance(1)
    t.core.signal("o1", "ok", 10)
    t.settle()
    assert t.core.state("o1").status == "completed"
    spans = t.exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {TRACE}
    by_name = {s.name: s for s in spans}
    run = by_name["run order"]
    assert run.context.span_id == run_span_id("o1") and run.parent.span_id == CLIENT_SPAN
    assert run.attributes["workflow.name"] == "order" and run.attributes["workflow.run.id"] == "o1"
    steps = [s for s in spans if s.name == "step charge"]
    assert len(steps) == 2  # the parent's and the child's
    mine = next(s for s in steps if s.attributes["workflow.run.id"] == "o1")
    assert mine.context.span_id == step_span_id("o1", 1)
    assert mine.parent.span_id == run.context.span_id
    bodies = [s for s in spans if s.name == "charge"]
    assert {b.parent.span_id for b in bodies} == {s.context.span_id for s in steps}
    child = by_name["child kid"]
    assert child.parent.span_id == run.context.span_id
    assert by_name["run kid"].parent.span_id == child.context.span_id
    assert by_name["sleep"].parent.span_id == run.context.span_id
    assert by_name["signal ok"].parent.span_id == run.context.span_id
    assert t.spans("activation order")
    assert run.end_time >= run.start_time


def test_a_replay_on_a_new_owner_emits_no_step_span_again() -> None:
    t = Traced()
    t.core.command(StartRun("o1", "order", input=payload.dumps(1)))
    t.settle()
    assert len(t.spans("step charge")) == 1 and len(t.spans("charge")) == 1
    t.core.decider.forget(["o1"])  # the new owner has nothing cached: it replays
    t.core.recover("o1")
    t.core.advance(1)
    t.core.signal("o1", "ok", 1)
    t.settle()
    assert t.core.state("o1").status == "completed"
    assert len([s for s in t.spans("step charge") if s.attributes["workflow.run.id"] == "o1"]) == 1
    assert len(t.spans("run order")) == 1
    replays = [s for s in t.spans("activation order") if s.attributes["workflow.replaying"]]
    assert replays  # the replays are there as activations, marked
    # no traceparent at the start: the trace is the run's own, derived from its id
    assert {s.context.trace_id for s in t.exporter.get_finished_spans()} == {run_trace_id("o1")}


_declined: set[str] = set()


def flaky_card(order: str) -> str:
    if order not in _declined:  # fails for good the first time, then succeeds
        _declined.add(order)
        raise RuntimeError("card service down")
    return f"paid {order}"


async def pay(ctx: Any, order: str) -> str:
    await ctx.step(charge, 1)
    return str(await ctx.step(flaky_card, order))


def test_a_retried_run_gets_new_span_ids_and_its_settled_steps_no_span_again() -> None:
    from runstream.engine.workflow import StepPolicy, step_def
    from runstream.schemas.records import Retry

    t = Traced()
    t.reg.add_workflow(workflow_def(pay))
    t.reg.add_step(step_def(flaky_card, StepPolicy(retries=0), None))
    t.core.command(StartRun("p1", "pay", input=payload.dumps("o-9")))
    t.settle()
    assert t.core.state("p1").status == "failed"
    t.core.command(Retry("p1", "card is back", retry_id="x"))
    t.settle()
    assert t.core.state("p1").status == "completed"
    runs = t.spans("run pay")
    assert [r.attributes["workflow.run.attempt"] for r in runs] == [1, 2]
    assert [r.attributes["workflow.run.status"] for r in runs] == ["failed", "completed"]
    assert runs[0].context.span_id == run_span_id("p1")
    assert runs[1].context.span_id == run_span_id("p1", 2)
    assert len(t.spans("step charge")) == 1  # settled before the failure: not again
    cards = t.spans("step flaky_card")
    assert [c.parent.span_id for c in cards] == [run_span_id("p1"), run_span_id("p1", 2)]
    assert cards[0].status.status_code.name == "ERROR"
    bodies = t.spans("flaky_card")
    assert [b.parent.span_id for b in bodies] == [c.context.span_id for c in cards]


def test_the_workflow_tester_runs_the_interceptors_cancels_and_timeouts_included() -> None:
    import runstream
    from runstream.testing import WorkflowTester

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = runstream.App("traced", interceptors=[Tracing(provider)])

    @app.step(name="reserve")
    def reserve(order: str) -> str:
        return f"r-{order}"

    @app.workflow(timeout="1h")
    async def hold(ctx: runstream.Context, order: str) -> str:
        await ctx.step(reserve, order)
        return str(await ctx.wait_for_signal("go"))

    tester = WorkflowTester(app)
    done = tester.start(hold, "a", headers={"traceparent": TRACEPARENT})
    tester.signal(done.run_id, "go", "yes")
    cancelled = tester.start(hold, "b")
    tester.cancel(cancelled.run_id)
    timed_out = tester.start(hold, "c")
    tester.advance("2h")
    assert (done.status, cancelled.status, timed_out.status) == ("completed", "cancelled", "failed")
    spans = exporter.get_finished_spans()
    ends = {s.attributes["workflow.run.id"]: s for s in spans if s.name == "run hold"}
    assert {k: v.attributes["workflow.run.status"] for k, v in ends.items()} == {
        done.run_id: "completed",
        cancelled.run_id: "cancelled",
        timed_out.run_id: "failed",
    }
    assert ends[done.run_id].context.trace_id == TRACE
    assert ends[timed_out.run_id].status.status_code.name == "ERROR"
    # each step once, though the tester replays every activation from the start
    assert len([s for s in spans if s.name == "step reserve"]) == 3
    assert len([s for s in spans if s.name == "reserve"]) == 3


def test_a_step_handed_over_mid_body_has_two_body_spans_under_one_step_span() -> None:
    t = Traced()
    t.core.command(StartRun("h1", "order", input=payload.dumps(1)))
    job = t.core.queued.pop(0)
    execute(job, None, t.reg.interceptors)  # the body ran; the old owner let go before its outcome
    t.core.hand_over("h1", frozenset({job.seq}))
    t.core.decider.forget(["h1"])  # the new owner: nothing cached
    t.core.recover("h1")
    t.settle()
    assert t.core.names("h1").count("StepHandedOver") == 1
    assert len(t.spans("step charge")) == 1
    bodies = t.spans("charge")
    assert len(bodies) == 2  # one per execution of the body, as it happened
    assert {b.parent.span_id for b in bodies} == {step_span_id("h1", 1)}
