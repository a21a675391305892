"""OpenTelemetry traces as one interceptor: ``App("shop", interceptors=[Tracing()])``.

Needs the ``otel`` extra (``pip install runstream[otel]``: opentelemetry-api and -sdk);
nothing of Runstream imports this module, so without it tracing costs nothing.

One trace per saga, across processes: `Client.start` sends the current span's
``traceparent``/``tracestate`` (W3C) in the run's headers (a plain producer may set them
as Kafka record headers of its StartRun); the engine records them on the RunStarted fact,
so a run continued elsewhere after a crash keeps its trace. The spans:

- ``run <workflow>``: the run, from its start to its end, emitted once by the engine that
  commits the end (`Interceptor.run_ended`); its parent is the start's traceparent;
- ``activation <workflow>``: each run of the workflow code (replays included, marked);
- ``step <name>``: a step of the run, from its first request to its outcome (retries
  included), emitted by the activation that records the outcome, never by a replay;
- ``<name>``: each attempt of a step body, local (engine) or remote (the task worker's
  side, a Kafka consumer span); its parent is the step's span, by the ``traceparent``
  the step's headers carry to the body (a task worker in another language can do the
  same with the StepTask's ``headers``);
- ``child <workflow>``: an awaited child run (the child's own run span is under it);
- ``sleep``, ``signal <name>``: the waits.

The spans the engine emits later than they begin (run, step, child, waits) have ids
derived from the run id and the sequence number, so a step's body on a task worker can
name its parent before that parent is emitted, and any instance derives the same ones.
That needs the SDK's tracer (it takes ids from its ``id_generator``); with another one
the spans are emitted all the same, with ids of their own.

Attributes follow the OpenTelemetry messaging conventions (``messaging.system`` kafka,
``messaging.operation.type`` process, ``messaging.destination.name``) and the draft
workflow ones: ``workflow.name``, ``workflow.version``, ``workflow.run.id``,
``workflow.step.name``, ``workflow.step.seq``, ``workflow.step.attempt``,
``workflow.replaying``, ``workflow.run.status``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runstream.interceptors import (
    ActivationInput,
    ChildInput,
    Interceptor,
    RunEndedInput,
    SignalInput,
    SleepInput,
    StepBody,
    StepBodyInput,
    StepInput,
    WorkflowInbound,
    WorkflowOutbound,
)

__all__ = ["Tracing", "run_span_id", "run_trace_id", "step_span_id"]

_W3C = TraceContextTextMapPropagator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _id(text: str, size: int) -> int:
    value = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=size).digest(), "big")
    return value or 1  # 0 is the invalid id


def run_trace_id(run_id: str) -> int:
    """The trace id of a run started without a traceparent."""
    return _id(f"trace:{run_id}", 16)


def _attempt(run_attempt: int) -> str:
    return "" if run_attempt == 1 else f"#{run_attempt}"  # a retried run's spans: new ids


def run_span_id(run_id: str, run_attempt: int = 1) -> int:
    """The id of the run's span (of its ``run_attempt``: 2 after its first retry, ...)."""
    return _id(f"run:{run_id}{_attempt(run_attempt)}", 8)


def step_span_id(run_id: str, seq: int, run_attempt: int = 1) -> int:
    """The id of the span of the run's step at ``seq``."""
    return _op_span_id("step", run_id, seq, run_attempt)


def _op_span_id(kind: str, run_id: str, seq: int, run_attempt: int) -> int:
    return _id(f"{kind}:{run_id}:{seq}{_attempt(run_attempt)}", 8)


def _ns(ms: int) -> int:
    return ms * 1_000_000


class _Trace:
    """Where a run's spans go: its trace, the span its run span hangs from, its state."""

    __slots__ = ("parent", "state", "trace_id")

    def __init__(self, run_id: str, headers: Mapping[str, str]) -> None:
        incoming = trace.get_current_span(_W3C.extract(dict(headers))).get_span_context()
        self.trace_id = incoming.trace_id if incoming.is_valid else run_trace_id(run_id)
        self.parent: int | None = incoming.span_id if incoming.is_valid else None
        self.state: TraceState | None = incoming.trace_state if incoming.is_valid else None

    def context(self, span_id: int) -> otel_context.Context:
        """An OpenTelemetry context whose current span is ``span_id`` of this trace."""
        sc = SpanContext(
            self.trace_id, span_id, is_remote=True, trace_flags=_SAMPLED, trace_state=self.state
        )
        return trace.set_span_in_context(NonRecordingSpan(sc))

    def traceparent(self, span_id: int) -> dict[str, str]:
        """W3C headers naming ``span_id`` of this trace as the parent."""
        out: dict[str, str] = {}
        _W3C.inject(out, self.context(span_id))
        return out


class _ChosenIds:
    """Wraps an SDK tracer's id generator: the next ids may be chosen (per thread)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._next = threading.local()

    @contextmanager
    def chosen(self, trace_id: int, span_id: int) -> Iterator[None]:
        self._next.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._next.ids = None

    def generate_span_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return int(ids[1]) if ids else int(self._inner.generate_span_id())

    def generate_trace_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return int(ids[0]) if ids else int(self._inner.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        return False if getattr(self._next, "ids", None) else bool(self._inner.is_trace_id_random())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Tracing(Interceptor):
    """Emits OpenTelemetry spans of runs, activations, steps, step bodies, children and
    waits (see the module). ``tracer_provider``: by default the global one, looked up at
    the first span (so it may be set after the App is made)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._provider = tracer_provider
        self._tracer: trace.Tracer | None = None
        self._ids: _ChosenIds | None = None
        self._lock = threading.Lock()

    # -- the chains ------------------------------------------------------------------
    def workflow_inbound(self, next: WorkflowInbound) -> WorkflowInbound:
        return _Inbound(next, self)

    def workflow_outbound(self, next: WorkflowOutbound) -> WorkflowOutbound:
        return _Outbound(next, self)

    def step_body(self, next: StepBody) -> StepBody:
        return _Body(next, self)

    def run_ended(self, input: RunEndedInput) -> None:
        t = _Trace(input.run_id, input.headers)
        attrs = {
            **_run_attrs(input.run_id, input.workflow, input.version),
            "workflow.run.status": input.status,
            "workflow.run.attempt": input.run_attempt,
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
        }
        if input.parent_run_id:
            attrs["workflow.parent.run.id"] = input.parent_run_id
        if input.continued_as:
            attrs["workflow.run.continued_as"] = input.continued_as
        error = input.error if input.status in ("failed", "dead") else None
        self.emit(
            f"run {input.workflow}",
            t,
            run_span_id(input.run_id, input.run_attempt),
            t.parent,
            input.started_at_ms,
            input.ended_at_ms,
            attrs,
            SpanKind.CONSUMER,
            error,
        )

    # -- emitting --------------------------------------------------------------------
    def tracer(self) -> trace.Tracer:
        if self._tracer is None:
            with self._lock:
                provider = self._provider or trace.get_tracer_provider()
                tracer = provider.get_tracer("runstream")
                if isinstance(provider, trace.ProxyTracerProvider):
                    return tracer  # no provider set yet: look again next time
                if hasattr(tracer, "id_generator"):  # the SDK's: our ids can be chosen
                    self._ids = _ChosenIds(tracer.id_generator)
                    tracer.id_generator = self._ids
                self._tracer = tracer
        return self._tracer

    def emit(
        self,
        name: str,
        t: _Trace,
        span_id: int,
        parent_id: int | None,
        start_ms: int,
        end_ms: int | None,
        attrs: dict[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
        error: str | None = None,
    ) -> None:
        """Emit a span that began earlier (at ``start_ms``) with the id ``span_id``."""
        tracer = self.tracer()
        parent = t.context(parent_id) if parent_id else otel_context.Context()
        chosen = self._ids.chosen(t.trace_id, span_id) if self._ids else _nothing()
        with chosen:
            span = tracer.start_span(
                name, context=parent, kind=kind, attributes=attrs, start_time=_ns(start_ms)
            )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=None if end_ms is None else _ns(end_ms))


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _run_attrs(run_id: str, workflow: str, version: str) -> dict[str, Any]:
    return {"workflow.name": workflow, "workflow.version": version, "workflow.run.id": run_id}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Inbound(WorkflowInbound):
    def __init__(self, next: WorkflowInbound, tracing: Tracing) -> None:
        super().__init__(next)
        self._t = tracing

    def activate(self, input: ActivationInput) -> Any:
        start = time.time_ns()
        result = self.next.activate(input)
        t = _Trace(input.run_id, input.headers)
        attrs = {
            **_run_attrs(input.run_id, input.workflow, input.version),
            "workflow.run.attempt": input.run_attempt,
            "workflow.replaying": input.is_replaying,
            "workflow.activation.outcome": type(result).__name__.lower(),
        }
        span = self._t.tracer().start_span(
            f"activation {input.workflow}",
            context=t.context(run_span_id(input.run_id, input.run_attempt)),
            attributes=attrs,
            start_time=start,
        )
        span.end()
        return result

    def signal(self, input: SignalInput) -> Any:
        value = self.next.signal(input)
        if not input.is_replaying:
            t = _Trace(input.run_id, input.headers)
            attrs = {"workflow.run.id": input.run_id, "workflow.signal.name": input.name}
            self._t.emit(
                f"signal {input.name}",
                t,
                _op_span_id("signal", input.run_id, input.seq, input.run_attempt),
                run_span_id(input.run_id, input.run_attempt),
                input.waited_since_ms,
                input.received_at_ms,
                attrs,
            )
        return value


class _Outbound(WorkflowOutbound):
    def __init__(self, next: WorkflowOutbound, tracing: Tracing) -> None:
        super().__init__(next)
        self._t = tracing

    async def step(self, input: StepInput) -> Any:
        t = _Trace(input.run_id, input.headers)
        span_id = step_span_id(input.run_id, input.seq, input.run_attempt)
        input.headers.update(t.traceparent(span_id))  # the body's parent: this step's span
        error: str | None = None
        try:
            return await self.next.step(input)
        except Exception as exc:  # the step failed (a BaseException: the code unwinds)
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if not input.is_replaying and (error is not None or input.attempt):
                attrs = {
                    "workflow.run.id": input.run_id,
                    "workflow.step.name": input.name,
                    "workflow.step.seq": input.seq,
                    "workflow.step.attempt": input.attempt,
                    "workflow.run.attempt": input.run_attempt,
                    "workflow.replaying": False,
                }
                if input.group:
                    attrs["messaging.system"] = "kafka"
                    attrs["messaging.destination.name"] = f"tasks.{input.group}"
                kind = SpanKind.PRODUCER if input.group else SpanKind.INTERNAL
                parent = run_span_id(input.run_id, input.run_attempt)
                end = _now_ms()
                self._t.emit(
                    f"step {input.name}",
                    t,
                    span_id,
                    parent,
                    input.started_at_ms,
                    end,
                    attrs,
                    kind,
                    error,
                )

    async def child(self, input: ChildInput) -> Any:
        t = _Trace(input.run_id, input.headers)
        span_id = _op_span_id("child", input.run_id, input.seq, input.run_attempt)
        run_span = run_span_id(input.run_id, input.run_attempt)
        # The child's run span hangs from this child span (awaited), else from the run's.
        input.headers.update(t.traceparent(span_id if input.awaited else run_span))
        error: str | None = None
        done = False
        try:
            result = await self.next.child(input)
            done = True
            return result
        except Exception as exc:  # ChildFailed
            error, done = f"{type(exc).__name__}: {exc}", True
            raise
        finally:
            if done and input.awaited and not input.is_replaying:
                attrs = {"workflow.run.id": input.run_id, "workflow.child.name": input.workflow}
                if input.child_run_id:
                    attrs["workflow.child.run.id"] = input.child_run_id
                self._t.emit(
                    f"child {input.workflow}",
                    t,
                    span_id,
                    run_span,
                    input.started_at_ms,
                    _now_ms(),
                    attrs,
                    error=error,
                )

    async def sleep(self, input: SleepInput) -> None:
        await self.next.sleep(input)
        if not input.is_replaying:
            t = _Trace(input.run_id, input.headers)
            attrs = {"workflow.run.id": input.run_id, "workflow.sleep.seconds": input.seconds}
            self._t.emit(
                "sleep",
                t,
                _op_span_id("sleep", input.run_id, input.seq, input.run_attempt),
                run_span_id(input.run_id, input.run_attempt),
                input.started_at_ms,
                _now_ms(),
                attrs,
            )


class _Body(StepBody):
    def __init__(self, next: StepBody, tracing: Tracing) -> None:
        super().__init__(next)
        self._t = tracing

    def execute(self, input: StepBodyInput) -> Any:
        parent = _W3C.extract(dict(input.headers))
        if not trace.get_current_span(parent).get_span_context().is_valid:
            parent = _Trace(input.run_id, input.headers).context(run_span_id(input.run_id))
        attrs: dict[str, Any] = {
            "workflow.run.id": input.run_id,
            "workflow.step.name": input.name,
            "workflow.step.seq": input.seq,
            "workflow.step.attempt": input.attempt,
            "workflow.replaying": False,
        }
        kind = SpanKind.INTERNAL
        if input.group:  # a task worker processes a record of the group's task topic
            kind = SpanKind.CONSUMER
            attrs["messaging.system"] = "kafka"
            attrs["messaging.operation.type"] = "process"
            attrs["messaging.destination.name"] = f"tasks.{input.group}"
        with self._t.tracer().start_as_current_span(
            input.name, context=parent, kind=kind, attributes=attrs
        ):
            return self.next.execute(input)
