"""The package's shape: its public names, and who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

import runstream

SRC = Path(runstream.__file__).parent


def test_public_names_are_pinned():
    assert runstream.__all__ == sorted(runstream.__all__)
    assert set(runstream.__all__) == {
        "App",
        "BlobUnavailable",
        "CancelReport",
        "ChildFailed",
        "Client",
        "CommandNotDelivered",
        "ConfigError",
        "Context",
        "DecodeError",
        "EntityContext",
        "EventNotSet",
        "EventRefused",
        "EventTimeout",
        "Failure",
        "HistoryTooLarge",
        "InvalidInput",
        "JournalFact",
        "KafkaFatal",
        "KafkaNotAuthorized",
        "KafkaSetupError",
        "KafkaUnavailable",
        "NonDeterminismError",
        "OwnerUnavailable",
        "PauseReport",
        "PayloadTooLarge",
        "Promise",
        "PromiseRejected",
        "PromiseTimeout",
        "QueryFailed",
        "QueryTimeout",
        "QueueFull",
        "RunCancelled",
        "RunEvent",
        "RunFailed",
        "RunInfo",
        "RunNotFound",
        "RunPage",
        "RunRejected",
        "RunSummary",
        "RunTimedOut",
        "RunstreamError",
        "SchemaError",
        "Settings",
        "SharedContext",
        "SignalTimeout",
        "StepContext",
        "StepError",
        "StepTimeout",
        "TerminalStepError",
        "TopicError",
        "UpdateFailed",
        "UpdateHandle",
        "Worker",
        "WorkflowNotFound",
        "shared",
    }


def _modules(path: Path) -> set[str]:
    """Every module ``path`` imports, in full (``from a.b import c`` gives a.b and a.b.c)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _importers(module: str) -> set[str]:
    """The packages under runstream/ (by their path) with a file importing ``module``."""
    return {
        str(p.parent.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if any(m == module or m.startswith(module + ".") for m in _modules(p))
    }


def test_only_the_kafka_edge_and_the_dev_tools_import_confluent_kafka():
    assert _importers("confluent_kafka") == {"topics", "dev"}


def test_only_projections_import_rocksdict():
    assert _importers("rocksdict") == {"projections"}


def test_the_core_imports_neither_the_shell_nor_io():
    for path in [*(SRC / "engine").glob("*.py"), *(SRC / "schemas").glob("*.py")]:
        shell = {
            m
            for m in _modules(path)
            if m.split(".")[0] in ("confluent_kafka", "rocksdict")
            or m.startswith(
                (
                    "runstream.topics",
                    "runstream.projections",
                    "runstream.worker",
                    "runstream.client",
                    "runstream.dev",
                    "runstream.cli",
                )
            )
        }
        assert not shell, f"{path.name} imports {shell}"


def test_the_runtime_never_imports_the_dev_tools():
    importers = {p for p in _importers("runstream.dev") if p != "dev"}
    assert importers == {"cli", "."}  # `runstream kafka up|down|status`, and at the root:
    at_root = {
        p.name for p in SRC.glob("*.py") if any(m.startswith("runstream.dev") for m in _modules(p))
    }
    assert at_root == {"pytest_plugin.py"}  # the `runstream_kafka` fixture


def test_every_subpackage_says_who_may_import_it():
    for init in SRC.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "import" in doc, f"{init.relative_to(SRC)} has no import rule"


def test_every_public_name_and_method_has_a_docstring():
    import inspect

    missing = []
    for name in runstream.__all__:
        obj = getattr(runstream, name)
        if not inspect.getdoc(obj):
            missing.append(name)
        for attr, value in vars(obj).items() if inspect.isclass(obj) else ():
            fn = value.fget if isinstance(value, property) else value
            if not attr.startswith("_") and callable(fn) and not fn.__doc__:
                missing.append(f"{name}.{attr}")
    assert not missing


def test_the_rules_table_has_one_handler_for_every_command_and_every_work_item():
    from runstream.engine.rules import HANDLERS
    from runstream.engine.work import LogRecord, Work
    from runstream.schemas.records import COMMANDS

    internal = set(Work.__args__) - {LogRecord}  # a record is decoded into a command first
    assert set(HANDLERS) == set(COMMANDS) | internal


def test_no_rules_module_is_longer_than_300_lines():
    for module in (SRC / "engine" / "rules").glob("*.py"):
        lines = len(module.read_text().splitlines())
        assert lines <= 300, f"engine/rules/{module.name} has {lines} lines"
