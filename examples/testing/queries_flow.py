"""A packing workflow that tells the outside world how far it got: ``ctx.set_event``
for anyone to read from the runs read model (no engine needed), and a live query
handler its owner answers (see test_queries_flow.py beside it, and
docs/guides/queries.md)."""

from __future__ import annotations

import runstream

app = runstream.App("warehouse")


@app.step
def pack(item: str) -> str:
    return f"box-{item}"


@app.workflow
async def packing(ctx: runstream.Context, items: list[str]) -> list[str]:
    boxes: list[str] = []

    @ctx.query_handler("boxes")  # declared before the first wait: every query finds it
    def _boxes() -> list[str]:
        return boxes

    @ctx.query_handler("packed")
    def _packed(item: str) -> bool:
        return f"box-{item}" in boxes

    ctx.set_event("stage", "packing")
    for item in items:
        boxes.append(await ctx.step(pack, item))
        ctx.set_event("progress", {"done": len(boxes), "of": len(items)})
    ctx.set_event("stage", "waiting for pickup")
    await ctx.wait_for_signal("picked_up")
    ctx.set_event("stage", "shipped")
    return boxes
