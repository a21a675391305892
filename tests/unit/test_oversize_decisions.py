"""What a decision produces fits a Kafka record before Kafka sees it, whatever the
interceptors add: their headers travel in a child's start, a remote step's task and a
read's ask, and can make any of them larger than the record limit. Each gets its clear
outcome on the pure core (no Kafka); nothing oversize is ever produced."""

from __future__ import annotations

from typing import Any

from runstream import App
from runstream.engine import payload
from runstream.engine.limits import Limits
from runstream.errors import ChildFailed, QueryFailed, StepError
from runstream.interceptors import (
    ChildInput,
    ContinueAsNewInput,
    EntityReadInput,
    Interceptor,
    StepInput,
    WorkflowOutbound,
)
from runstream.schemas.codec import Codec

from .corehelp import Core

LIMITS = Limits(max_record=256 * 1024)
FAT = "x" * 260_000  # a header value: more than a record takes


class Fattening(Interceptor):
    """Adds a header too large for a record to every child, step and read."""

    def workflow_outbound(self, next: WorkflowOutbound) -> WorkflowOutbound:
        class Out(WorkflowOutbound):
            async def child(self, input: ChildInput) -> Any:
                input.headers["fat"] = FAT
                return await self.next.child(input)

            async def step(self, input: StepInput) -> Any:
                input.headers["fat"] = FAT
                return await self.next.step(input)

            async def entity_read(self, input: EntityReadInput) -> Any:
                input.headers = {**input.headers, "fat": FAT}
                return await self.next.entity_read(input)

            def continue_as_new(self, input: ContinueAsNewInput) -> Any:
                input.headers["fat"] = FAT
                return self.next.continue_as_new(input)

        return Out(next)


app = App("fat", interceptors=[Fattening()])


@app.step(group="far")
def far(x: int) -> int:
    return x


@app.workflow()
async def kid(ctx: Any, x: int) -> int:
    return x


@app.workflow()
async def parent(ctx: Any, x: int) -> str:
    try:
        return str(await ctx.child(kid, x))
    except ChildFailed as exc:
        return f"child failed: {exc}"


@app.workflow()
async def remote(ctx: Any, x: int) -> str:
    try:
        return str(await ctx.step(far, x))
    except StepError as exc:
        return f"step failed: {exc}"


@app.step
def shout() -> None:
    raise ValueError("e" * 150_000)


@app.workflow()
async def loud(ctx: Any, _: None) -> None:
    await ctx.step(shout)


@app.workflow()
async def looping(ctx: Any, n: int) -> int:
    if n < 1:
        ctx.continue_as_new(n + 1)
    return n


@app.entity("box")
class Box:
    @staticmethod
    async def put(ctx: Any, item: str) -> None:
        ctx.state.set("item", item)


@app.workflow()
async def reader(ctx: Any, key: str) -> str:
    try:
        return str(await ctx.entity("box", key).read("missing"))
    except QueryFailed as exc:
        return f"read failed: {exc}"


def _largest_output(core: Core) -> int:
    codec = Codec.default()
    records = [*core.commands, *core.tasks, *core.journal, *core.lifecycle]
    return max(len(codec.encode(r)) for r in records)


def _output(core: Core, run_id: str) -> Any:
    st = core.state(run_id)
    assert st.status == "completed", (st.status, st.error)
    return payload.loads(st.output)


def test_a_childs_start_made_too_large_by_its_headers_fails_the_child_call():
    core = Core(app.registry, limits=LIMITS)
    core.start("p", "parent", 1)
    out = _output(core, "p")
    assert out.startswith("child failed:") and "oversize" in out, out
    assert not core.commands  # no start was sent
    assert _largest_output(core) <= LIMITS.max_record


def test_a_remote_steps_task_made_too_large_by_its_headers_fails_the_step_for_good():
    core = Core(app.registry, limits=LIMITS)
    core.start("r", "remote", 1)
    out = _output(core, "r")
    assert out.startswith("step failed:") and "headers" in out, out
    assert not core.tasks
    assert _largest_output(core) <= LIMITS.max_record


def test_a_continue_as_new_made_too_large_by_its_headers_fails_the_run():
    core = Core(app.registry, limits=LIMITS)
    core.start("l", "looping", 0)
    st = core.state("l")
    assert st.status == "failed" and "continue-as-new input with headers" in st.error, st.error
    assert not core.commands and _largest_output(core) <= LIMITS.max_record


def test_a_reads_ask_made_too_large_by_its_headers_fails_the_read():
    core = Core(app.registry, limits=LIMITS)
    core.start("w", "reader", "k")
    out = _output(core, "w")
    assert out.startswith("read failed: the ask of read 'missing'") and "limit" in out, out
    assert not core.commands and _largest_output(core) <= LIMITS.max_record


def test_any_other_decision_too_large_for_a_record_is_refused_and_dead_lettered():
    """The guard behind every rule, here with texts clipped later than a record ends
    (`Limits.text` set past it): a step's error as long as that makes its failure's fact
    too large. The decision is refused, its cause dead-lettered; nothing is produced."""
    wide = Limits(max_record=140_000, text=200_000)
    core = Core(app.registry, limits=wide)
    core.start("s", "loud", None)
    assert [d.code for d in core.dead] == ["oversize"]
    assert "StepFailed record of" in core.dead[0].reason, core.dead[0].reason
    assert not [f for f in core.journal if type(f).__name__ == "StepFailed"]
    assert _largest_output(core) <= wide.max_record
