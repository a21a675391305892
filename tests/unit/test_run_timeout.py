"""Run execution timeouts and signal-with-start, on the pure core."""

from __future__ import annotations

from collections import Counter

from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.reducer import fold
from runstream.engine.workflow import Registry, step_def, workflow_def
from runstream.schemas.records import StartRun

from .corehelp import Core

done: Counter[str] = Counter()


def book(trip: str) -> str:
    done["book"] += 1
    return f"booked {trip}"


def unbook(trip: str) -> None:
    done["unbook"] += 1


async def trip(ctx, name: str) -> str:
    booking = await ctx.step(book, name, compensate=unbook)
    await ctx.wait_for_signal("pay")
    return booking


async def nap(ctx) -> str:
    await ctx.sleep("1d")
    return "rested"


def _core() -> Core:
    reg = Registry()
    reg.add_workflow(workflow_def(trip, timeout="10m"))
    reg.add_workflow(workflow_def(nap))
    reg.add_step(step_def(book))
    reg.add_step(step_def(unbook))
    done.clear()
    return Core(reg)


def test_a_run_past_its_workflow_timeout_fails_with_run_timed_out_and_compensates():
    core = _core()
    core.start("t", "trip", "rome")
    assert core.state("t").deadline_ms == core.now + 600_000
    core.advance(599)
    assert core.state("t").status == "running"
    core.advance(1)
    st = core.state("t")
    assert st.status == "failed" and st.error.startswith("RunTimedOut: run 't' did not end")
    assert done == {"book": 1, "unbook": 1}  # compensated like any failure
    assert check_run(core.facts("t"), expect_finished=True) == []
    assert fold("t", core.facts("t")) == st
    assert st.timers() == set()  # nothing left to fire


def test_a_start_timeout_overrides_the_workflows_and_a_run_without_one_never_times_out():
    core = _core()
    core.command(StartRun("short", "nap", input=b"null", timeout_ms=5_000))
    core.start("long", "nap")
    core.advance(5)
    assert core.state("short").status == "failed"
    assert core.state("short").error.startswith("RunTimedOut:")
    assert core.state("long").deadline_ms is None
    core.advance(86_400)
    assert core.state("long").status == "completed"


def test_a_run_that_ends_in_time_is_not_touched_by_its_deadline():
    core = _core()
    core.start("t", "trip", "oslo")
    core.signal("t", "pay", None)
    assert core.state("t").status == "completed"
    facts = len(core.journal)
    core.advance(3600)
    assert len(core.journal) == facts


def test_signal_with_start_starts_the_run_and_delivers_the_signal_once():
    core = _core()
    go = StartRun("s", "trip", input=payload.dumps("nice"), signal="pay", signal_id="p-1")
    core.command(go)
    st = core.state("s")
    assert st.status == "completed" and payload.loads(st.output) == "booked nice"
    core.command(go)  # redelivered: nothing more
    assert core.names("s").count("SignalReceived") == 1
    assert done["book"] == 1


def test_signal_with_start_signals_a_run_that_exists_and_ignores_its_input():
    core = _core()
    core.start("s", "trip", "paris")
    assert core.state("s").status == "running"
    core.command(
        StartRun("s", "trip", input=payload.dumps("elsewhere"), signal="pay", signal_id="p")
    )
    core.command(
        StartRun("s", "trip", input=payload.dumps("elsewhere"), signal="pay", signal_id="p")
    )
    st = core.state("s")
    assert st.status == "completed" and payload.loads(st.output) == "booked paris"
    assert core.names("s").count("SignalReceived") == 1 and core.dead == []


def test_signal_with_start_without_an_id_delivers_once_per_run():
    core = _core()
    core.start("s", "nap")
    cmd = StartRun("s", "nap", input=b"null", signal="poke")
    core.command(cmd)
    core.command(cmd)
    assert core.names("s").count("SignalBuffered") == 1
