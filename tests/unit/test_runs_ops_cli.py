"""`runstream runs cancel --where`: what it accepts, checked before any broker is asked."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from runstream.cli.main import cli


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("colour=red", "use status=S, workflow=W"),
        ("status=sleeping", "no status 'sleeping'"),
        ("workflow=", "use status=S, workflow=W"),
        (",", "name at least one condition"),
    ],
)
def test_runs_cancel_where_refuses_a_condition_it_does_not_know(where, problem):
    out = CliRunner().invoke(cli, ["runs", "cancel", "--where", where, "-n", "shop"])
    assert out.exit_code == 2 and problem in out.output


def test_the_namespace_comes_from_the_environment():
    out = CliRunner().invoke(
        cli, ["runs", "cancel", "--where", "colour=red"], env={"RUNSTREAM_NAMESPACE": "shop"}
    )
    assert "Missing option" not in out.output and "use status=S" in out.output
