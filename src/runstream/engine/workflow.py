"""What users declare: workflows, steps and their retry policies."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from runstream.errors import InvalidInput, WorkflowNotFound

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(value: float | int | str) -> float:
    """5, 2.5, "500ms", "5s", "10m", "2h", "1d" -> seconds."""
    if isinstance(value, int | float):
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", value)
    if not m:
        raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '5s', '10m', '1d')")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@dataclass(frozen=True)
class StepPolicy:
    """How a step is retried: ``retries`` more attempts after the first, waiting
    ``backoff * 2**(attempt-1)`` seconds (capped at ``max_backoff``)."""

    retries: int = 3
    backoff: float = 1.0
    max_backoff: float = 300.0
    non_retryable: tuple[type[BaseException], ...] = ()
    timeout: float | None = None

    def delay(self, attempt: int) -> float:
        return min(self.backoff * 2 ** (attempt - 1), self.max_backoff)


DEFAULT_POLICY = StepPolicy()


@dataclass(frozen=True)
class StepDef:
    fn: Callable[..., Any]
    name: str
    policy: StepPolicy
    output: TypeAdapter[Any] | None  # from the return annotation, to rebuild recorded outputs
    is_async: bool


def step_def(fn: Callable[..., Any], policy: StepPolicy | None = None, name: str | None = None):
    hints = _hints(fn)
    ret = hints.get("return", inspect.Signature.empty)
    return StepDef(
        fn=fn,
        name=name or fn.__qualname__,
        policy=policy or DEFAULT_POLICY,
        output=None if ret in (inspect.Signature.empty, None, Any) else TypeAdapter(ret),
        is_async=inspect.iscoroutinefunction(fn),
    )


@dataclass(frozen=True)
class WorkflowDef:
    fn: Callable[..., Any]
    name: str
    version: str
    input: TypeAdapter[Any] | None

    def parse_input(self, value: Any) -> Any:
        if self.input is None:
            return value
        try:
            return self.input.validate_python(value)
        except ValidationError as exc:
            raise InvalidInput(
                f"input of workflow {self.name!r} v{self.version} is invalid: {exc}"
            ) from exc


def workflow_def(fn: Callable[..., Any], name: str | None = None, version: str = "1"):
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"workflow {fn.__qualname__} must be an async def")
    params = list(inspect.signature(fn).parameters.values())
    if len(params) not in (1, 2):
        raise TypeError(f"workflow {fn.__qualname__} must take (ctx) or (ctx, input)")
    ann = _hints(fn).get(params[1].name, Any) if len(params) == 2 else Any
    return WorkflowDef(
        fn=fn,
        name=name or fn.__name__,
        version=str(version),
        input=None if ann is Any else TypeAdapter(ann),
    )


def _version_key(v: str) -> tuple[Any, ...]:
    # "10" > "9", and "1.10" > "1.9": compare numeric parts as numbers.
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\-]", v))


@dataclass
class Registry:
    """The workflows and steps one App knows. Explicit, never module-global."""

    workflows: dict[str, dict[str, WorkflowDef]] = field(default_factory=dict)
    steps: dict[Callable[..., Any], StepDef] = field(default_factory=dict)
    _by_name: dict[str, StepDef] = field(default_factory=dict)

    def add_workflow(self, wf: WorkflowDef) -> None:
        versions = self.workflows.setdefault(wf.name, {})
        if wf.version in versions:
            raise ValueError(f"workflow {wf.name!r} version {wf.version!r} registered twice")
        versions[wf.version] = wf

    def latest(self, name: str) -> WorkflowDef:
        versions = self.workflows.get(name)
        if not versions:
            raise WorkflowNotFound(f"no workflow named {name!r} is registered")
        return versions[max(versions, key=_version_key)]

    def get(self, name: str, version: str) -> WorkflowDef | None:
        return self.workflows.get(name, {}).get(version)

    def step(self, fn: Callable[..., Any]) -> StepDef:
        sd = self.steps.get(fn)
        if sd is None:  # an undecorated function is a step with the default policy
            sd = self.add_step(step_def(fn))
        return sd

    def add_step(self, sd: StepDef) -> StepDef:
        self.steps[sd.fn] = sd
        self._by_name[sd.name] = sd
        return sd

    def step_by_name(self, name: str) -> StepDef:
        """The step called ``name``, or a default-policy stand-in (e.g. a remote step)."""
        sd = self._by_name.get(name)
        return sd if sd is not None else StepDef(_missing, name, DEFAULT_POLICY, None, False)


def _missing(*args: Any) -> Any:
    raise LookupError("this step is not registered in this process")


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        import typing

        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: no validation rather than a crash
        return {}
