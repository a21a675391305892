"""The order saga of the demo (examples/shop.py), traced: for `test_otel.py`'s engine and
task worker processes (``runstream worker tests.kafka.otel_app:app``, ``runstream tasks
serve tests.kafka.otel_app:app --group payments``). The namespace comes from
RUNSTREAM_TEST_NS; each process writes the spans it ends, one JSON object a line, to
RUNSTREAM_TEST_SPANS, at once (a SIGKILL loses none it ended)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import runstream
from runstream.otel import Tracing


class JsonLines(SpanExporter):
    """Appends each span to a file as one JSON line (the SDK's own `to_json`)."""

    def __init__(self, path: str) -> None:
        self.path, self.lock = path, threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(s.to_json())) + "\n" for s in spans)
        with self.lock, open(self.path, "a") as f:
            f.write(lines)
        return SpanExportResult.SUCCESS


provider = TracerProvider(resource=Resource.create({"service.name": f"pid-{os.getpid()}"}))
if os.environ.get("RUNSTREAM_TEST_SPANS"):
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(os.environ["RUNSTREAM_TEST_SPANS"])))
trace.set_tracer_provider(provider)

app = runstream.App(os.environ.get("RUNSTREAM_TEST_NS", "otel-test"), interceptors=[Tracing()])

_flaked: set[str] = set()


@app.step(retries=3, backoff=0.2)
def reserve_stock(order: dict) -> str:
    if order["id"] not in _flaked:  # the first attempt fails, as the demo's inventory does
        _flaked.add(order["id"])
        raise ConnectionError("inventory service timed out")
    return f"rsv-{order['id']}"


@app.step
def release_stock(order: dict) -> None:
    pass


@app.step(group="payments", retries=2, timeout="30s")
def charge_card(order: dict) -> str:
    return f"pay-{order['id']}"


@app.step
def refund_card(order: dict) -> None:
    pass


@app.step
def pack(order: dict) -> str:
    return f"box-{order['id']}"


@app.workflow
async def shipping(ctx: runstream.Context, order: dict) -> str:
    return str(await ctx.step(pack, order))


@app.workflow
async def checkout(ctx: runstream.Context, order: dict) -> dict:
    reservation = await ctx.step(reserve_stock, order, compensate=release_stock)
    payment = await ctx.step(charge_card, order, compensate=refund_card)
    await ctx.sleep("1s")
    approval = await ctx.wait_for_signal("approve", timeout="1h")
    parcel = await ctx.child(shipping, order)
    return {"reservation": reservation, "payment": payment, "parcel": parcel, **approval}
