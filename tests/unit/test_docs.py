"""The docs site builds strictly, and every `file::function` it names exists."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import runstream

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# `runstream/worker.py::Worker.run`: a file under src/ and a dotted name in it.
WHERE = re.compile(r"`(runstream/[\w/]+\.py)::([\w.]+)`")


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "reference" / "cli" / "index.html").exists()
    settings = (tmp_path / "reference" / "settings" / "index.html").read_text()
    assert "RUNSTREAM_HISTORY_MAX_BYTES" in settings  # the generated table is there
    codes = (DOCS / "reference" / "codes.md").read_text()
    for table in ("failure", "dead-letter", "lifecycle"):  # the tables the hook checks
        assert f"<!-- codes: {table} -->" in codes


def test_every_file_function_the_docs_name_exists() -> None:
    named = {m for page in DOCS.rglob("*.md") for m in WHERE.findall(page.read_text())}
    assert len(named) > 50  # the architecture page names the main paths
    missing = []
    for path, dotted in sorted(named):
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        target: object = module
        for part in dotted.split("."):
            target = getattr(target, part, None)
        if target is None:
            missing.append(f"{path}::{dotted}")
    assert not missing, missing


def test_every_runstream_name_the_docs_use_exists() -> None:
    schemas = ROOT / "src" / "runstream" / "schemas"
    text = "".join(page.read_text() for page in DOCS.rglob("*.md"))
    names = set(re.findall(r"runstream\.([A-Z]\w*)", text))
    assert {"App", "Client", "Context", "Settings", "RunTimedOut"} <= names
    for name in sorted(names):
        # an Avro record's full name (runstream.StartRun) or a name users import
        avro = (schemas / f"runstream.{name}.avsc").exists()
        assert avro or hasattr(runstream, name), f"the docs name runstream.{name}"
