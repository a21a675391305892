"""Tests of queries_flow.py with `runstream.testing`: events and live queries."""

from __future__ import annotations

import pytest

import runstream
from examples.testing.queries_flow import app
from runstream.testing import WorkflowTester


def test_the_run_tells_its_stage_and_progress_and_answers_queries():
    t = WorkflowTester(app)
    run = t.start("packing", ["mug", "lamp"], run_id="p-1")

    assert run.events == {"stage": "waiting for pickup", "progress": {"done": 2, "of": 2}}
    assert t.query("p-1", "boxes") == ["box-mug", "box-lamp"]
    assert t.query("p-1", "packed", "lamp") is True

    t.signal("p-1", "picked_up")
    assert run.events["stage"] == "shipped"
    assert run.result() == ["box-mug", "box-lamp"]


def test_an_unknown_query_says_which_ones_the_run_has():
    t = WorkflowTester(app)
    t.start("packing", ["mug"], run_id="p-2")
    with pytest.raises(runstream.QueryFailed, match="its handlers: 'boxes', 'packed'"):
        t.query("p-2", "weight")
