"""Runstream's errors: what the README names exists, the tree in `errors.py`'s docstring
is the class tree, and every failed run carries a code that picks the class users catch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import runstream
from runstream import errors
from runstream.engine.workflow import Registry, step_def, workflow_def
from runstream.errors import QueueFull, RunFailed, RunstreamError, RunTimedOut, run_failed

from .corehelp import Core

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(runstream.__file__).parent / "schemas"


def test_every_runstream_name_in_the_readme_and_the_docs_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(p.read_text() for p in pages)
    names = set(re.findall(r"runstream\.([A-Z]\w*)", text))
    assert {"ChildFailed", "EventTimeout", "RunTimedOut"} <= names
    for name in sorted(names):
        # an Avro record's full name (runstream.StartRun) or a name users import
        avro = (SCHEMAS / f"runstream.{name}.avsc").exists()
        assert avro or hasattr(runstream, name), f"README names runstream.{name}"


def _error_classes() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ == errors.__name__
    }


def test_all_is_sorted_and_exports_every_error_and_every_name_the_readme_catches():
    assert runstream.__all__ == sorted(runstream.__all__)
    assert set(_error_classes()) <= set(runstream.__all__)
    assert {"TopicError", "QueueFull", "ChildFailed", "EventTimeout"} <= set(runstream.__all__)
    for name in runstream.__all__:
        assert getattr(runstream, name) is not None
    assert runstream.EventTimeout is errors.EventTimeout


def _docstring_tree() -> dict[str, tuple[str, ...]]:
    """Class -> its bases, as `errors.py`'s docstring draws them."""
    tree: dict[str, tuple[str, ...]] = {}
    parents: list[str] = []  # the chain of the line above, by depth
    for line in (errors.__doc__ or "").splitlines():
        if m := re.match(r"^(\w+)\(([\w, ]+)\)", line):  # Name(Base, Base)  text
            tree[m[1]] = tuple(b.strip() for b in m[2].split(","))
        elif m := re.match(r"^([ │]*)[├└]─ (\w+(?: · \w+)*)", line):
            depth = len(m[1]) // 4 + 1
            names = m[2].split(" · ")
            for name in names:
                tree[name] = (parents[depth - 1],)
            parents[depth:] = [names[-1]]
        elif m := re.match(r"^(\w+)$", line):  # the root
            tree[m[1]] = ("Exception",)
            parents = [m[1]]
    return tree


def test_the_docstring_tree_is_the_class_tree():
    actual = {
        name: tuple(b.__name__ for b in cls.__bases__) for name, cls in _error_classes().items()
    }
    assert _docstring_tree() == actual


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("timed-out", RunTimedOut),
        ("queue-full", QueueFull),
        ("workflow-error", RunFailed),
        ("bad-output", RunFailed),
        ("something-newer", RunFailed),
    ],
)
def test_result_raises_the_class_the_failure_code_names(code, cls):
    exc = run_failed("r", "any text at all", "failed", code)
    assert type(exc) is cls and exc.code == code and isinstance(exc, RunFailed)
    assert exc.error == "any text at all" and isinstance(exc, RunstreamError)


@pytest.mark.parametrize(
    ("error", "status", "cls", "code"),
    [
        (
            "RunTimedOut: run 'r' did not end within its timeout of 1s",
            "failed",
            RunTimedOut,
            "timed-out",
        ),
        ("QueueFull: 3 runs wait", "failed", QueueFull, "queue-full"),
        ("ValueError: no", "failed", RunFailed, None),
        ("crashed 4 times", "dead", RunFailed, "dead"),
    ],
)
def test_a_failure_recorded_before_codes_existed_is_told_by_its_text(error, status, cls, code):
    exc = run_failed("r", error, status, None)
    assert type(exc) is cls and exc.code == code


# -- the engine records the code on the RunFailed fact ------------------------------------
def ok(x: int) -> int:
    return x


def undo(x: int) -> None:
    pass


async def raises(ctx, x: int) -> int:
    await ctx.step(ok, x)
    raise ValueError("no")


async def compensates(ctx, x: int) -> int:
    await ctx.step(ok, x, compensate=undo)
    raise ValueError("no")


async def not_json(ctx, x: int) -> object:
    return object()


async def slow(ctx, x: int) -> int:
    await ctx.step(ok, x, compensate=undo)
    await ctx.sleep("1h")
    return x


def _core() -> Core:
    reg = Registry()
    for fn in (raises, compensates, not_json):
        reg.add_workflow(workflow_def(fn))
    reg.add_workflow(workflow_def(slow, timeout="1m"))
    for fn in (ok, undo):
        reg.add_step(step_def(fn))
    return Core(reg)


@pytest.mark.parametrize(
    ("workflow", "code"),
    [
        ("raises", "workflow-error"),
        ("compensates", "workflow-error"),
        ("not_json", "bad-output"),
        ("slow", "timed-out"),  # compensated first, and still told as a timeout
    ],
)
def test_a_failed_run_records_its_code_and_the_client_sees_it(workflow, code):
    core = _core()
    core.start("r", workflow, 1)
    core.advance(120)
    (fact,) = core.facts("r", "RunFailed")
    assert fact.code == code
    info = core.query("r")
    assert (info.status, info.code) == ("failed", code)
