"""Layers: the core runs nothing itself, and no module imports itself back.

Imports under ``if TYPE_CHECKING:`` are left out (they never run); imports inside a
function are counted, since deferring an import is how a cycle hides.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import runstream

SRC = Path(runstream.__file__).parent

# What the core may not import: threads, clocks, queues, event loops, sockets and
# processes belong to the runtime around it (`runstream.runtime`), Kafka and RocksDB to
# the shell. Driving a coroutine by hand with ``send`` (engine.replay) needs none of them.
FORBIDDEN_IN_THE_CORE = (
    "threading",
    "_thread",
    "ctypes",
    "time",
    "queue",
    "concurrent",
    "asyncio",
    "socket",
    "selectors",
    "signal",
    "subprocess",
    "multiprocessing",
    "confluent_kafka",
    "rocksdict",
    "runstream.runtime",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """(module, line) of every import in ``path`` that can run: ``from a.b import c``
    gives a.b and a.b.c (c may be a module)."""

    def visit(node: ast.AST) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]))
            elif isinstance(child, ast.Import):
                yield from ((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                assert not child.level, f"{path}:{child.lineno}: a relative import"
                yield child.module or "", child.lineno
                yield from ((f"{child.module}.{a.name}", child.lineno) for a in child.names)
            else:
                yield from visit(child)

    return visit(ast.parse(path.read_text()))


def _graph() -> dict[str, set[str]]:
    """Each module of runstream -> the modules of runstream it imports."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        graph[name] = set()
        for module, _line in _imports(path):
            while module and module not in paths:  # a name imported from a module
                module = module.rpartition(".")[0]
            if module and module != name:
                graph[name].add(module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def test_the_core_imports_no_threads_clocks_io_or_runtime():
    offending = {
        (str(path.relative_to(SRC)), line, banned)
        for path in (SRC / "engine").rglob("*.py")
        for module, line in _imports(path)
        for banned in FORBIDDEN_IN_THE_CORE
        if module == banned or module.startswith(banned + ".")
    }
    assert not offending, "\n".join(f"{f}:{n} imports {m}" for f, n, m in sorted(offending))


def test_the_runtime_imports_only_the_core_of_runstream():
    """Threads and clocks, but no Kafka, no RocksDB, no shell."""
    allowed = ("runstream.runtime", "runstream.engine", "runstream.schemas", "runstream.errors")
    offending = {
        f"{path.relative_to(SRC)}:{line} imports {'.'.join(module.split('.')[:2])}"
        for path in (SRC / "runtime").rglob("*.py")
        for module, line in _imports(path)
        if module.split(".")[0] in ("runstream", "confluent_kafka", "rocksdict")
        and not module.startswith(allowed)
    }
    assert not offending, "\n".join(sorted(offending))


def test_no_module_of_runstream_is_in_an_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_no_package_of_runstream_is_in_an_import_cycle():
    """Packages (engine, schemas, topics, projections, runtime, ...) and the modules at the
    root form layers: none imports another that imports it back."""
    packages: dict[str, set[str]] = {}
    for module, imported in _graph().items():
        top = module.split(".")[:2]
        packages.setdefault(".".join(top), set()).update(
            ".".join(m.split(".")[:2]) for m in imported
        )
    for name, imported in packages.items():
        imported.discard(name)
    cycles = _cycles(packages)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
