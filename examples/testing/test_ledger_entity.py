"""Tests of ledger_entity.py's entity with `runstream.testing`: no broker, no waiting."""

from __future__ import annotations

import pytest

import runstream
from examples.testing.ledger_entity import app
from runstream.testing import WorkflowTester


def test_calls_change_the_balance_and_a_failed_one_changes_nothing():
    t = WorkflowTester(app)
    acct = t.entity("account", "ann")
    assert acct.call("deposit", 50) == 50
    with pytest.raises(runstream.RunFailed, match="insufficient funds"):
        acct.call("withdraw", 80)
    assert acct.read("balance") == 50


def test_a_workflow_pays_each_account_once():
    t = WorkflowTester(app)
    assert t.start("payday", ["ann", "bob"]).result() == [100, 100]
    assert t.entity("account", "bob").show()["state"] == {"balance": 100}


def test_a_workflow_reads_balances_without_waiting_for_calls():
    t = WorkflowTester(app)
    t.start("payday", ["ann", "bob"]).result()
    assert t.start("statement", ["ann", "bob", "eve"]).result() == 200  # eve: never written
