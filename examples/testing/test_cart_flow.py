"""Tests of cart_flow.py's updates with `runstream.testing`: no broker, no waiting."""

from __future__ import annotations

import pytest

import runstream
from examples.testing.cart_flow import app
from runstream.testing import WorkflowTester


def test_an_update_returns_its_handlers_result_and_the_run_sees_it():
    t = WorkflowTester(app)
    run = t.start("cart", "ann", run_id="c-1")
    assert t.update("c-1", "add", {"sku": "tea", "qty": 2}) == {
        "items": 1,
        "reservation": "rsv-tea-2",
    }
    t.signal("c-1", "checkout")
    assert run.result()["items"] == [{"sku": "tea", "qty": 2}]


def test_a_rejected_update_leaves_no_trace_in_the_history():
    t = WorkflowTester(app)
    run = t.start("cart", "ann", run_id="c-2")
    before = len(run.history)
    with pytest.raises(runstream.UpdateFailed) as exc:
        t.update("c-2", "add", {"sku": "tea", "qty": 0})
    assert exc.value.rejected and "at least 1" in exc.value.message
    assert len(run.history) == before


def test_update_with_start_creates_the_cart_with_its_first_item():
    t = WorkflowTester(app)
    first = t.update_with_start("cart", "bob", run_id="c-3", update="add",
                                arg={"sku": "jam", "qty": 1})  # fmt: skip
    assert first.result()["items"] == 1 and t.run("c-3").status == "running"
    t.run_until_idle()  # a day passes: the cart is abandoned
    assert t.run("c-3").result()["status"] == "abandoned"
