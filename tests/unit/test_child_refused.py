"""A child refused on its own partition answers its parent at once (issue 19, defect 4):
the parent's `ctx.child` raises ChildFailed instead of waiting for ever."""

from __future__ import annotations

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.workflow import Registry, workflow_def
from runstream.errors import ChildFailed
from runstream.schemas.records import ChildResult, StartRun

from .corehelp import Core


async def keyed(ctx, order: dict) -> str:
    return "ran"


async def waiter(ctx) -> str:
    return await ctx.wait_for_signal("go")


async def parent(ctx, spec: dict) -> str:
    try:
        return await ctx.child(spec["wf"], spec["input"], run_id=spec.get("id"))
    except ChildFailed as exc:
        return f"caught {exc.status}: {exc.error}"


def _registry(*extra) -> Registry:
    reg = Registry()
    for wf in (parent, waiter, *extra):
        reg.add_workflow(workflow_def(wf))
    reg.add_workflow(workflow_def(keyed, concurrency_key=lambda order: order["customer"]))
    return reg


def pump(core: Core, child_side: Core | None = None) -> None:
    """Route the commands runs sent each other: StartRuns to ``child_side`` (another
    instance, when given), everything else to ``core``."""
    child_side = child_side or core
    while core.commands or child_side.commands:
        for side in (core, child_side):
            while side.commands:
                cmd = side.commands.pop(0)
                (child_side if isinstance(cmd, StartRun) else core).command(cmd)


def _caught(core: Core, run_id: str) -> str:
    st = core.state(run_id)
    assert st.status == "completed", (st.status, st.error)
    assert check_run(core.facts(run_id), expect_finished=True) == []
    return str(payload.loads(st.output))


def test_a_child_whose_concurrency_key_fails_answers_its_parent_rejected():
    core = Core(_registry())
    core.start("p", "parent", {"wf": "keyed", "input": {"no_customer": 1}})
    pump(core)
    out = _caught(core, "p")
    assert out.startswith("caught rejected: ") and "concurrency_key" in out
    assert [d.code for d in core.dead] == ["invalid-input"]  # the refused start, as before
    assert core.state("p/1").status == "rejected"


def test_a_child_whose_run_id_exists_as_another_run_answers_its_parent_rejected():
    core = Core(_registry())
    core.start("taken", "waiter")  # not a child of p
    core.start("p", "parent", {"wf": "waiter", "input": None, "id": "taken"})
    pump(core)
    out = _caught(core, "p")
    assert out.startswith("caught rejected: ") and "'taken'" in out
    assert core.state("taken").status == "running"  # the other run goes on, untouched
    assert core.state("taken").parent_run_id is None


def test_an_instance_without_the_childs_workflow_answers_its_parent_rejected():
    core = Core(_registry())
    other = Core(Registry())  # the child's partition is owned by an instance without it
    core.start("p", "parent", {"wf": "waiter", "input": None})
    pump(core, other)
    out = _caught(core, "p")
    assert out.startswith("caught rejected: ") and "unknown-workflow" in out


def test_a_childs_start_delivered_twice_does_not_answer_its_parent():
    core = Core(_registry())
    core.start("p", "parent", {"wf": "waiter", "input": None})
    (start,) = core.commands
    pump(core)
    core.command(start)  # the same StartRun again: it is this parent's child already
    assert not [c for c in core.commands if isinstance(c, ChildResult)]
    assert core.state("p").status == "running"
    core.signal("p/1", "go", "done")
    pump(core)
    assert _caught(core, "p") == "done"
