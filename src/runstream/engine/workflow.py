"""What users declare: workflows, steps and their retry policies, and event sources."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from runstream.engine.interceptors import Interceptor
from runstream.engine.steps import StepContext
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
    ``backoff * 2**(attempt-1)`` seconds (capped at ``max_backoff``). ``timeout``
    (seconds) fails an attempt that runs longer; it is then retried like any failure."""

    retries: int = 3
    backoff: float = 1.0
    max_backoff: float = 300.0
    non_retryable: tuple[type[BaseException], ...] = ()
    timeout: float | None = None
    group: str | None = None  # a remote step: served by the task workers of this group
    heartbeat: float | None = None  # a remote attempt silent this long (s) times out
    queue: str | None = None  # each attempt needs a permit of this limit (`Registry.limits`)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before the attempt after ``attempt``."""
        return float(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))


DEFAULT_POLICY = StepPolicy()


@dataclass(frozen=True)
class Limit:
    """A limit on a step queue, global to every engine instance: ``concurrency`` permits
    held at once, ``rate`` grants per second (up to ``burst`` at once after idling)."""

    name: str
    concurrency: int | None = None
    rate: float | None = None
    burst: int = 1


@dataclass(frozen=True)
class StepDef:
    """A registered step: its function, name, policy and how to rebuild its output."""

    fn: Callable[..., Any]
    name: str
    policy: StepPolicy
    output: TypeAdapter[Any] | None  # from the return annotation, to rebuild recorded outputs
    is_async: bool
    context_param: str | None = None  # the parameter annotated StepContext, if any

    @property
    def remote(self) -> bool:
        """Served by task workers (`runstream.taskworker`), not by the engine."""
        return self.policy.group is not None


def step_def(
    fn: Callable[..., Any], policy: StepPolicy | None = None, name: str | None = None
) -> StepDef:
    """Declare ``fn`` as a step (`App.step` does this for users)."""
    hints = type_hints(fn)
    ret = hints.get("return", inspect.Signature.empty)
    context = [p for p, t in hints.items() if t is StepContext and p != "return"]
    return StepDef(
        fn=fn,
        name=name or fn.__qualname__,
        policy=policy or DEFAULT_POLICY,
        output=None if ret in (inspect.Signature.empty, None, Any) else TypeAdapter(ret),
        is_async=inspect.iscoroutinefunction(inspect.unwrap(fn)),
        context_param=context[0] if context else None,
    )


# How a workflow function takes its input, decided once at registration (one rule for
# plain, decorated and keyword-only workflows): not at all, as the second positional
# argument, or as a keyword argument of that name.
NO_INPUT, POSITIONAL = "", "*"


@dataclass(frozen=True)
class WorkflowDef:
    """A registered workflow version."""

    fn: Callable[..., Coroutine[Any, Any, Any]]
    name: str
    version: str
    input: TypeAdapter[Any] | None
    input_param: str = POSITIONAL  # NO_INPUT, POSITIONAL, or the keyword's name
    timeout: float | None = None  # execution timeout in seconds (None: none)
    on_event: str | None = None  # started by each event of this name
    event_key: Callable[[Any], Any] | None = None  # one run per key of the event payload
    batch: int | None = None  # start one run per this many events (of one name and key)
    window: float | None = None  # ... or once this long after the first, in seconds
    concurrency_key: Callable[[Any], Any] | None = None  # runs of one key share a limit
    limit: int = 1  # ... of this many running at once
    max_queued: int | None = None  # ... and this many waiting; a start beyond fails

    def parse_input(self, value: Any) -> Any:
        """The input as the workflow declared it. Raises InvalidInput."""
        if self.input is None:
            return value
        try:
            return self.input.validate_python(value)
        except ValidationError as exc:
            raise InvalidInput(
                f"input of workflow {self.name!r} v{self.version} is invalid: {exc}"
            ) from exc

    def call(self, ctx: Any, value: Any) -> Coroutine[Any, Any, Any]:
        """The workflow's coroutine for a run with input ``value`` (already parsed)."""
        if self.input_param == NO_INPUT:
            return self.fn(ctx)
        if self.input_param == POSITIONAL:
            return self.fn(ctx, value)
        return self.fn(ctx, **{self.input_param: value})


def workflow_def(
    fn: Callable[..., Any],
    name: str | None = None,
    version: str = "1",
    timeout: float | str | None = None,
    on_event: str | None = None,
    key: Callable[[Any], Any] | None = None,
    batch: int | None = None,
    window: float | str | None = None,
    concurrency_key: Callable[[Any], Any] | None = None,
    limit: int = 1,
    max_queued: int | None = None,
) -> WorkflowDef:
    """Declare ``fn`` as a workflow (`App.workflow` does this for users).

    The first parameter gets the context, the second (if any) the input: positional or
    keyword-only. ``inspect.signature`` follows ``functools.wraps``, so decorated
    workflows keep their input; a wrapper taking ``*args`` gets it positionally.
    """
    if not inspect.iscoroutinefunction(inspect.unwrap(fn)):
        raise TypeError(f"workflow {fn.__qualname__} must be an async def")
    if (batch is not None or window is not None) and on_event is None:
        raise TypeError(f"workflow {fn.__qualname__}: batch= and window= need on_event=")
    if (limit != 1 or max_queued is not None) and concurrency_key is None:
        raise TypeError(f"workflow {fn.__qualname__}: limit= and max_queued= need concurrency_key=")
    if limit < 1 or (max_queued is not None and max_queued < 0):
        raise ValueError(
            f"workflow {fn.__qualname__}: limit must be 1 or more, max_queued 0 or more"
        )
    if batch is not None and batch < 1:
        raise ValueError(f"workflow {fn.__qualname__}: batch must be 1 or more, not {batch}")
    params = list(inspect.signature(fn).parameters.values())
    kinds = inspect.Parameter
    if params and params[0].kind is kinds.VAR_POSITIONAL:
        params, input_param = params[:1], POSITIONAL  # (*args, **kwargs): pass it along
    elif len(params) == 1:
        input_param = NO_INPUT
    elif len(params) == 2 and params[1].kind is kinds.KEYWORD_ONLY:
        input_param = params[1].name
    elif len(params) == 2 and params[1].kind in (
        kinds.POSITIONAL_ONLY,
        kinds.POSITIONAL_OR_KEYWORD,
        kinds.VAR_POSITIONAL,
    ):
        input_param = POSITIONAL
    else:
        raise TypeError(f"workflow {fn.__qualname__} must take (ctx) or (ctx, input)")
    ann = type_hints(fn).get(params[1].name, Any) if len(params) == 2 else Any
    return WorkflowDef(
        fn=fn,
        name=name or fn.__name__,
        version=str(version),
        input=None if ann is Any else TypeAdapter(ann),
        input_param=input_param,
        timeout=None if timeout is None else seconds(timeout),
        on_event=on_event,
        event_key=key,
        batch=batch,
        window=None if window is None else seconds(window),
        concurrency_key=concurrency_key,
        limit=limit,
        max_queued=max_queued,
    )


@dataclass(frozen=True)
class SourceDef:
    """A topic of the team's own whose records become named events (`App.source`):
    ``decode`` turns a record's value into a JSON value, the event's payload; ``key``
    gives its correlation key from that value (None: the record's Kafka key, as text)."""

    topic: str
    name: str  # the event name
    key: Callable[[Any], Any] | None
    decode: Callable[[bytes], Any]
    ttl: float = 0.0  # seconds a wait that comes later may still receive the event


def _version_key(v: str) -> tuple[tuple[int, int, str], ...]:
    # "10" > "9", and "1.10" > "1.9": compare numeric parts as numbers.
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\-]", v))


@dataclass
class Registry:
    """The workflows and steps one App knows. Explicit, never module-global."""

    workflows: dict[str, dict[str, WorkflowDef]] = field(default_factory=dict)
    steps: dict[Callable[..., Any], StepDef] = field(default_factory=dict)
    limits: dict[str, Limit] = field(default_factory=dict)  # step queues, by name
    sources: dict[str, SourceDef] = field(default_factory=dict)  # by topic
    _by_name: dict[str, StepDef] = field(default_factory=dict)
    interceptors: list[Interceptor] = field(default_factory=list)  # App(interceptors=...)
    entities: dict[str, Any] = field(default_factory=dict)  # engine.entities.EntityDef, by name

    def add_workflow(self, wf: WorkflowDef) -> None:
        """Register a workflow version; each (name, version) once."""
        versions = self.workflows.setdefault(wf.name, {})
        if wf.version in versions:
            raise ValueError(f"workflow {wf.name!r} version {wf.version!r} registered twice")
        versions[wf.version] = wf

    def add_source(self, sd: SourceDef) -> None:
        """Register a source; each topic once (its records would become events twice)."""
        if sd.topic in self.sources:
            raise ValueError(f"topic {sd.topic!r} is registered as a source twice")
        self.sources[sd.topic] = sd

    def latest(self, name: str) -> WorkflowDef:
        """The newest version of workflow ``name``. Raises WorkflowNotFound."""
        versions = self.workflows.get(name)
        if not versions:
            raise WorkflowNotFound(f"no workflow named {name!r} is registered")
        return versions[max(versions, key=_version_key)]

    def workflow_name(self, workflow: Callable[..., Any] | str) -> str:
        """The name of ``workflow``: a name as given, or the registered function's."""
        if isinstance(workflow, str):
            return workflow
        for versions in self.workflows.values():
            for wf in versions.values():
                if wf.fn is workflow:
                    return wf.name
        raise TypeError(f"{workflow!r} is not a registered workflow or a workflow name")

    def triggered_by(self, event: str) -> list[WorkflowDef]:
        """The newest version of each workflow that event ``event`` starts."""
        latest = [self.latest(name) for name in sorted(self.workflows)]
        return [wf for wf in latest if wf.on_event == event]

    def get(self, name: str, version: str) -> WorkflowDef | None:
        """Workflow ``name`` at ``version``, or None."""
        return self.workflows.get(name, {}).get(version)

    def step(self, fn: Callable[..., Any]) -> StepDef:
        """The step of ``fn``: an undecorated function is a step with the default policy."""
        sd = self.steps.get(fn)
        if sd is None:
            sd = self.add_step(step_def(fn))
        return sd

    def add_step(self, sd: StepDef) -> StepDef:
        """Register a step."""
        self.steps[sd.fn] = sd
        self._by_name[sd.name] = sd
        return sd

    def limit_of(self, sd: StepDef) -> Limit | None:
        """The limit a step's attempts need a permit of: its ``queue``'s, else its task
        group's if a limit of that name is declared."""
        name = sd.policy.queue or sd.policy.group
        return self.limits.get(name) if name else None

    def groups(self) -> list[str]:
        """The task groups of the remote steps registered here."""
        return sorted({sd.policy.group for sd in self._by_name.values() if sd.policy.group})

    def step_by_name(self, name: str) -> StepDef:
        """The step called ``name``, or a default-policy stand-in (e.g. a remote step)."""
        sd = self._by_name.get(name)
        return sd if sd is not None else StepDef(_missing, name, DEFAULT_POLICY, None, False)


def _missing(*args: Any) -> Any:
    raise LookupError("this step is not registered in this process")


def type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s resolved type hints (through decorators); none if they can't resolve."""
    try:
        return typing.get_type_hints(inspect.unwrap(fn))
    except Exception:  # unresolvable forward references: no validation rather than a crash
        return {}
