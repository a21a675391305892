"""Tests of order_flow.py with `runstream.testing`: no broker, and no real waiting."""

from __future__ import annotations

from datetime import timedelta

import pytest

import runstream
from examples.testing.order_flow import Order, app, charge_card
from runstream.testing import WorkflowTester

ORDER = {"id": "o-1", "amount": 25.0}


def test_an_approved_order_ships_and_closes_after_the_return_window():
    t = WorkflowTester(app)
    run = t.start("order_flow", ORDER, run_id="o-1")
    assert run.status == "running"  # waiting for the approval
    started = t.now

    t.signal("o-1", "approve", {"by": "ann"})
    t.run_until_idle()  # the 30-day sleep fires at once

    assert run.result() == {"payment": "pay-o-1", "tracking": "track-o-1", "approved_by": "ann"}
    assert t.now - started == timedelta(days=30)
    assert [s.name for s in run.steps][-2:] == ["ship", "close_order"]


def test_a_flaky_card_provider_is_retried_with_backoff_on_the_fake_clock():
    attempts = []

    def flaky_charge(order: Order) -> str:
        attempts.append(order.id)
        if len(attempts) < 3:
            raise ConnectionError("payment provider timed out")
        return "pay-fake"

    t = WorkflowTester(app, steps={charge_card: flaky_charge})
    run = t.start("order_flow", ORDER)
    t.signal(run.run_id, "approve", {"by": "ann"})  # kept until the workflow asks for it
    t.advance("2s")
    assert len(attempts) == 2  # the second attempt came after 2 s; the third waits 4 s
    t.run_until_idle()

    assert run.result()["payment"] == "pay-fake"
    charges = [(s.attempt, s.ok) for s in run.steps if s.name == "charge_card"]
    assert charges == [(1, False), (2, False), (3, True)]


def test_no_approval_within_two_days_refunds_and_releases_the_stock():
    t = WorkflowTester(app)
    run = t.start("order_flow", ORDER)
    t.advance(timedelta(days=2))

    assert run.status == "failed"
    with pytest.raises(runstream.RunFailed, match="no signal 'approve'"):
        run.result()
    undone = [s.name for s in run.steps if s.compensation]
    assert undone == ["refund_card", "release_stock"]  # newest first


def test_a_refund_waits_for_the_managers_answer():
    t = WorkflowTester(app)
    run = t.start("refund", ORDER, run_id="r-1")
    (promise_id,) = run.promises  # the id the manager was mailed: "r-1/promise/1"
    assert run.status == "running"

    t.resolve(promise_id, "ok by bob")
    assert run.result() == "refunded: ok by bob"

    t.reject(promise_id, "too late")  # a promise completes once: this one is refused
    assert t.dead_letters[-1].code == "promise-completed"


def test_a_refund_nobody_answers_is_refused_after_a_week():
    t = WorkflowTester(app)
    run = t.start("refund", ORDER)
    t.run_until_idle()  # the promise's 7-day timeout passes at once
    assert run.result() == "refused: no answer within a week"
