"""The package's shape: its public names, and who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

import runstream

SRC = Path(runstream.__file__).parent


def test_public_names_are_pinned():
    assert runstream.__all__ == sorted(runstream.__all__)
    assert set(runstream.__all__) == {
        "App", "Client", "CommandNotDelivered", "Context", "InvalidInput",
        "NonDeterminismError", "RunCancelled", "RunFailed", "RunInfo", "RunNotFound",
        "RunstreamError", "SignalTimeout", "StepError", "TerminalStepError", "Worker",
        "WorkerSettings", "WorkflowNotFound",
    }  # fmt: skip


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_core_does_no_io():
    for path in (SRC / "engine").glob("*.py"):
        assert not _imports(path) & {"confluent_kafka", "rocksdict"}, path.name


def test_only_projections_import_rocksdict():
    for path in SRC.rglob("*.py"):
        if "rocksdict" in _imports(path):
            assert path.parent.name == "projections", path
