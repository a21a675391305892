"""`WorkflowTester` serves remote steps inline, as a task worker would: the demo's
workflow (examples/shop.py, whose card is charged by a remote step) runs to its end."""

from __future__ import annotations

from examples import shop
from runstream.schemas.records import StepStarted
from runstream.testing import WorkflowTester

ORDER = {"id": "o-1", "item": "book", "amount": 25.0}


def _steady(order: shop.Order) -> str:  # reserve_stock fails its first call: not here
    return f"rsv-{order.id}"


def test_the_demo_checkout_completes_with_its_remote_step_run_inline():
    t = WorkflowTester(shop.app, steps={shop.reserve_stock: _steady})
    run = t.start("checkout", ORDER, run_id="o-1")
    t.signal("o-1", "approve", {"by": "ann"})
    t.run_until_idle()
    assert run.result() == {
        "payment": "pay-o-1",
        "reservation": "rsv-o-1",
        "tracking": "track-o-1-ann",
    }
    (charge,) = [s for s in run.steps if s.name == "charge_card"]
    assert charge.ok and charge.args[0] == shop.Order(**ORDER)  # rebuilt from JSON, typed
    remote = [f for f in run.history if isinstance(f, StepStarted) and f.remote]
    assert [f.name for f in remote] == ["charge_card"]  # it went out as a task


def test_a_fake_replaces_a_remote_step_and_its_failure_compensates():
    seen = []

    def decline(order: shop.Order) -> str:
        seen.append(order.amount)
        raise ValueError("declined by the fake")  # non_retryable: no second attempt

    t = WorkflowTester(shop.app, steps={"charge_card": decline, shop.reserve_stock: _steady})
    run = t.start("checkout", ORDER)
    t.run_until_idle()
    assert run.status == "failed" and "declined by the fake" in (run.error or "")
    assert seen == [25.0]
    assert [s.name for s in run.steps] == ["reserve_stock", "charge_card", "release_stock"]
