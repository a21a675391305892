"""The package as a user gets it: ``python -m build`` makes the wheel from a copy of the
checkout, pip installs it into a fresh virtualenv, and that virtualenv's ``runstream``
runs a workflow against the broker from outside the checkout (no PYTHONPATH), so every
import comes from the installed wheel.

pip reads only ``<cache>/wheels`` (the build requirements and Runstream's dependencies);
when that is not enough it downloads what is missing there once, so later runs install
offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from runstream.settings import cache_dir
from runstream.topics.admin import ensure_topics

from .kit import PARTITIONS, ROOT, terminate

pytestmark = pytest.mark.kafka

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE = ROOT / "src" / "runstream"

#: Build requirements and dependencies pip downloaded once, for offline installs later.
WHEELS = cache_dir() / "wheels"

#: Not copied: what git ignores, and where other runs write (their copies would be stale).
_SKIP = shutil.ignore_patterns(
    ".*", "__pycache__", "*.egg-info", "build", "dist", "state", "results"
)

APP = """
import runstream

app = runstream.App({ns!r})


@app.step(retries=2)
def greet(name: str) -> str:
    return f"hello {{name}}"


@app.workflow
async def hello(ctx: runstream.Context, name: str) -> dict:
    greeting = await ctx.step(greet, name)
    await ctx.sleep(0.5)  # a durable timer
    return {{"greeting": greeting}}
"""

CLIENT = """
import json, sys
import runstream

with runstream.Client(sys.argv[1]) as client:
    run_id = client.start("hello", "wheel", run_id="wheel-1")
    output = client.result(run_id, timeout=60)
print(json.dumps({"output": output, "imported_from": runstream.__file__}))
"""


def _run(command: list[str], log: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``command``, appending what it printed to ``log``."""
    proc = subprocess.run(command, capture_output=True, text=True, **kw)
    with log.open("a") as f:
        f.write(f"$ {' '.join(command)}\n{proc.stdout}{proc.stderr}(exit {proc.returncode})\n")
    return proc


def _offline_first(command: list[str], download: list[str], log: Path, env: dict[str, str]) -> None:
    """Run the pip-using ``command`` on the wheel cache alone; if that fails, fill the
    cache with ``download`` (a ``pip download``, from the index) and run it again."""
    offline = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS)}
    if _run(command, log, env=offline).returncode == 0:
        return
    WHEELS.mkdir(parents=True, exist_ok=True)
    fill = _run([*download, "--dest", str(WHEELS)], log, env=env)
    for own in WHEELS.glob("runstream-*"):  # keep only others' wheels: ours is built fresh
        own.unlink()
    assert fill.returncode == 0, f"pip download failed:\n{log.read_text()[-3000:]}"
    again = _run(command, log, env=offline)
    assert again.returncode == 0, f"{command[:4]} failed:\n{log.read_text()[-3000:]}"


def test_the_wheel_runs_a_workflow_from_a_fresh_venv(
    kafka_bootstrap: str, ns: str, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    assert importlib.util.find_spec("build"), "no `build` here: pip install -e '.[test]'"

    # 1. python -m build (an sdist, then the wheel from it) on a copy: the checkout
    # stays untouched, and nothing built before can leak in.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_SKIP)
    dist = tmp_path / "dist"
    _offline_first(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        [sys.executable, "-m", "pip", "download", *PYPROJECT["build-system"]["requires"]],
        log,
        dict(os.environ),
    )
    (wheel,) = dist.glob("runstream-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    data = {
        "runstream/" + p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc")
    }
    assert "runstream/py.typed" in data
    assert any(name.endswith(".avsc") for name in data)
    assert data <= shipped, f"not in the wheel: {sorted(data - shipped)}"

    # 2. A fresh virtualenv (no system site-packages) with the wheel installed by pip;
    # from here on nothing sees this interpreter's path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], log, env=env).returncode == 0
    python, runstream_cmd = str(venv / "bin" / "python"), str(venv / "bin" / "runstream")
    _offline_first(
        [python, "-m", "pip", "install", str(wheel)],
        [python, "-m", "pip", "download", str(wheel)],
        log,
        env,
    )

    # 3. From outside the checkout: the console script, and a workflow end to end.
    home = tmp_path / "user"
    home.mkdir()
    (home / "hello_app.py").write_text(APP.format(ns=ns))
    (home / "client.py").write_text(CLIENT)
    env["RUNSTREAM_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    helped = _run([runstream_cmd, "--help"], log, cwd=home, env=env)
    assert helped.returncode == 0 and "worker" in helped.stdout, helped.stderr
    version = _run([runstream_cmd, "--version"], log, cwd=home, env=env)
    assert version.returncode == 0, version.stderr
    assert version.stdout.split() == ["runstream", PYPROJECT["project"]["version"]]

    ensure_topics(kafka_bootstrap, ns, partitions=PARTITIONS)
    worker_log = tmp_path / "worker.log"
    with worker_log.open("ab") as out:  # the child keeps its own fd
        worker = subprocess.Popen(
            [
                *(runstream_cmd, "worker", "hello_app:app", "--instance", "wheel-1"),
                *("--state-dir", str(home / "state"), "--partitions", str(PARTITIONS)),
            ],
            cwd=home,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        ran = _run([python, "client.py", ns], log, cwd=home, env=env, timeout=120)
        assert ran.returncode == 0, f"{ran.stderr}\nworker:\n{worker_log.read_text()[-3000:]}"
        got = json.loads(ran.stdout)
        assert got["output"] == {"greeting": "hello wheel"}
        assert Path(got["imported_from"]).is_relative_to(venv)
    finally:
        assert terminate(worker) == 0, worker_log.read_text()[-3000:]
