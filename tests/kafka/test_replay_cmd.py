"""`runstream replay` against histories an engine recorded on the real broker.

The CLI loads this module's Apps by MODULE:APP, as a user's deploy check would: ``current``
is the code that recorded the runs, ``reordered`` the same workflow with its two steps
swapped. Their namespace does not matter: the CLI reads the one ``-n`` names.
"""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner

import runstream
from runstream.cli import exits
from runstream.cli.main import cli

from .kit import ThreadWorker, wait_for

pytestmark = pytest.mark.kafka

executed: list[str] = []  # step bodies run in this process


def reserve(order_id: str) -> str:
    executed.append(f"reserve {order_id}")
    return f"r-{order_id}"


def charge(order_id: str) -> str:
    executed.append(f"charge {order_id}")
    return f"c-{order_id}"


async def order(ctx: runstream.Context, order_id: str) -> dict:
    reservation = await ctx.step(reserve, order_id)
    payment = await ctx.step(charge, order_id)
    return {"r": reservation, "c": payment, "by": await ctx.wait_for_signal("approve")}


async def order_reordered(ctx: runstream.Context, order_id: str) -> dict:
    payment = await ctx.step(charge, order_id)
    reservation = await ctx.step(reserve, order_id)
    return {"r": reservation, "c": payment, "by": await ctx.wait_for_signal("approve")}


def app_with(ns: str, fn) -> runstream.App:
    app = runstream.App(ns)
    app.workflow(name="order")(fn)
    return app


current = app_with("replay", order)
reordered = app_with("replay", order_reordered)
CURRENT, REORDERED = f"{__name__}:current", f"{__name__}:reordered"


@pytest.fixture(scope="module")
def recorded(kafka_bootstrap, tmp_path_factory):
    """A namespace where the current code recorded run ``done`` (completed) and runs
    ``open-1``, ``open-2`` (waiting for their approval)."""
    ns = f"t{uuid.uuid4().hex[:10]}"
    app = runstream.App(ns, kafka_bootstrap)
    app.workflow(name="order")(order)
    worker = ThreadWorker(app, tmp_path_factory.mktemp("state"))
    client = wait_for(lambda: _client(ns, kafka_bootstrap), what="the worker's topics")
    try:
        for run_id in ("done", "open-1", "open-2"):
            client.start("order", run_id, run_id=run_id)
        client.signal("done", "approve", "ann")
        assert client.result("done", timeout=60) == {"r": "r-done", "c": "c-done", "by": "ann"}
        for run_id in ("open-1", "open-2"):
            wait_for(lambda r=run_id: client.get_run(r).steps == 2, what=f"{run_id} waiting")
    finally:
        client.close()
        worker.stop()
    executed.clear()
    return ["-n", ns, "--bootstrap", kafka_bootstrap]


def _client(ns, bootstrap):
    try:
        return runstream.Client(ns, bootstrap)
    except runstream.RunstreamError:
        return None


def replay(*args: str):
    return CliRunner().invoke(cli, ["replay", *args])


def test_a_run_fits_the_code_that_recorded_it_and_no_step_runs(recorded):
    for run_id in ("done", "open-1"):
        out = replay(run_id, "--app", CURRENT, *recorded)
        assert out.exit_code == 0, out.output
        assert out.output.strip().endswith("fits"), out.output
    out = replay("done", "--app", CURRENT, "--json", *recorded)
    verdict = json.loads(out.output)
    assert verdict["fits"] is True and verdict["status"] == "completed"
    assert verdict["facts"] >= 7 and verdict["seq"] is None
    assert executed == []


def test_swapped_steps_name_the_seq_and_the_recorded_and_requested_operations(recorded):
    out = replay("done", "--app", REORDERED, *recorded)
    assert out.exit_code == 1
    assert "at seq 1 the history has 'step reserve', the code asks for 'step charge'" in (
        out.output
    )
    out = replay("open-1", "--app", REORDERED, "--json", *recorded)
    assert out.exit_code == 1
    verdict = json.loads(out.output)
    assert (verdict["fits"], verdict["seq"], verdict["recorded"], verdict["requested"]) == (
        False,
        1,
        "step reserve",
        "step charge",
    )
    assert executed == []


def test_every_running_run_of_a_workflow_is_checked_with_a_summary(recorded):
    out = replay("--workflow", "order", "--status", "running", "--app", CURRENT, *recorded)
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[-1] == "2 running runs of order: 2 fit"

    out = replay("--workflow", "order", "--status", "running", "--app", REORDERED, *recorded)
    assert out.exit_code == 1
    assert out.output.splitlines()[-1] == "2 running runs of order: 0 fit, 2 do not"
    assert "open-1" in out.output and "open-2" in out.output and "done" not in out.output

    out = replay("--workflow", "order", "--app", REORDERED, "--json", *recorded)
    report = json.loads(out.output)
    assert (report["runs"], report["fit"], report["statuses"]) == (2, 0, ["open"])
    assert sorted(m["run_id"] for m in report["misfits"]) == ["open-1", "open-2"]
    assert {m["seq"] for m in report["misfits"]} == {1}
    assert executed == []


def test_mistakes_are_one_line_errors_with_their_exit_status(recorded, kafka_bootstrap):
    out = replay("no-such-run", "--app", CURRENT, *recorded)
    assert out.exit_code == exits.NOT_FOUND
    assert out.output.startswith("RunNotFound: no run 'no-such-run' in ")
    assert "Traceback" not in out.output

    unknown = ["-n", "nosuchns", "--bootstrap", kafka_bootstrap]
    out = replay("done", "--app", CURRENT, *unknown)
    assert out.exit_code == exits.ERROR
    assert out.output.startswith("TopicError: namespace 'nosuchns' is not set up")
    assert len(out.output.strip().splitlines()) == 1

    nobody = ["-n", "x", "--bootstrap", "127.0.0.1:1"]
    out = CliRunner().invoke(
        cli, ["replay", "done", "--app", CURRENT, *nobody], env={"RUNSTREAM_CONNECT_TIMEOUT": "1"}
    )
    assert out.exit_code == exits.KAFKA_UNREACHABLE
    assert out.output.startswith("KafkaUnavailable: cannot reach Kafka")
    assert len(out.output.strip().splitlines()) == 1

    out = replay("done", "--app", "tests.kafka.no_such_module:app", *recorded)
    assert out.exit_code == 2 and "cannot load" in out.output
    out = replay("--app", CURRENT, *recorded)
    assert out.exit_code == 2 and "give a RUN_ID, or --workflow" in out.output
