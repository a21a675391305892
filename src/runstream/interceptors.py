"""Interceptors: your code around what runs do (tracing, logging, headers, auth).

The chains themselves are in `runstream.engine.interceptors` (the core runs them); this
module is their public name, plus what a client adds to the headers it sends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from runstream.engine.interceptors import (
    RESERVED_PREFIX,
    ActivationInput,
    ChildInput,
    ContinueAsNewInput,
    EntityReadInput,
    ExecuteInput,
    Interceptor,
    QueryInput,
    RunEndedInput,
    SignalInput,
    SleepInput,
    StepBody,
    StepBodyInput,
    StepInput,
    UpdateInput,
    WorkflowInbound,
    WorkflowOutbound,
    chain,
    kafka_headers,
    record_headers,
)

__all__ = [
    "RESERVED_PREFIX",
    "ActivationInput",
    "ChildInput",
    "ContinueAsNewInput",
    "EntityReadInput",
    "ExecuteInput",
    "Interceptor",
    "QueryInput",
    "RunEndedInput",
    "SignalInput",
    "SleepInput",
    "StepBody",
    "StepBodyInput",
    "StepInput",
    "UpdateInput",
    "WorkflowInbound",
    "WorkflowOutbound",
    "chain",
    "kafka_headers",
    "outgoing_headers",
    "record_headers",
]


def outgoing_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers a client sends with a start: ``headers``, after the current
    OpenTelemetry context's ``traceparent``/``tracestate`` when opentelemetry-api is
    installed and a span is current (``headers`` win)."""
    out: dict[str, str] = {}
    inject = _otel_inject()
    if inject is not None:
        inject(out)
    out.update(headers or {})
    return out


@functools.cache
def _otel_inject() -> Callable[[dict[str, str]], None] | None:
    """OpenTelemetry's global propagator, if installed (looked up once)."""
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return None
    return inject
