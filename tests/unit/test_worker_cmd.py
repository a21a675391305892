"""`runstream worker` with an App it cannot load: real supervised processes, no broker
(the engine fails before it would connect)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runstream.supervisor import EXIT_CANNOT_LOAD

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("no_such_module_here:app", "No module named 'no_such_module_here'"),
        ("broken_app:app", "ZeroDivisionError: division by zero"),
        ("fine_module:nope", "has no attribute 'nope'"),
        ("fine_module:thing", "is not a runstream.App"),
    ],
    ids=["missing-module", "module-raises", "missing-attribute", "not-an-app"],
)
def test_a_worker_whose_app_cannot_be_imported_exits_at_once_with_its_own_code(
    tmp_path: Path, target: str, says: str
) -> None:
    (tmp_path / "broken_app.py").write_text("1 / 0\n")
    (tmp_path / "fine_module.py").write_text("thing = 42\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "runstream", "worker", target, "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,  # a supervisor that restarts for ever would never end
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == EXIT_CANNOT_LOAD == 78, done.stderr
    lines = [line for line in done.stderr.splitlines() if "cannot load the App at" in line]
    assert len(lines) == 1, done.stderr  # one engine start, one clear line
    assert f"cannot load the App at {target!r}" in lines[0] and says in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    assert "starting it again in" not in done.stderr  # the restart line
    assert "not starting it again" in done.stderr
