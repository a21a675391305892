"""`App`: a namespace plus the workflows and steps registered on it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from runstream.engine.workflow import (
    Limit,
    Registry,
    SourceDef,
    StepPolicy,
    seconds,
    step_def,
    workflow_def,
)
from runstream.interceptors import Interceptor

if TYPE_CHECKING:
    from runstream.client import Client
    from runstream.taskworker import TaskWorker

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class App:
    """Declares workflows and steps for a namespace (its Kafka topic prefix).

    >>> app = App("shop")
    >>> @app.workflow(version="1")
    ... async def checkout(ctx, order: dict) -> dict: ...

    ``bootstrap`` defaults to RUNSTREAM_BOOTSTRAP_SERVERS, then KAFKA_BOOTSTRAP_SERVERS,
    then the broker `runstream kafka up` started. ``interceptors``
    (`runstream.interceptors`), the first outermost, wrap workflow code, its operations
    and step bodies on every engine and task worker of this App.
    """

    def __init__(
        self,
        namespace: str,
        bootstrap: str | None = None,
        *,
        max_recovery_attempts: int = 3,
        interceptors: Sequence[Interceptor] = (),
    ) -> None:
        from runstream.topics.spec import Topics

        Topics(namespace)  # validates the name now rather than at first use
        self.namespace = namespace
        self.bootstrap = bootstrap
        self.max_recovery_attempts = max_recovery_attempts
        self.registry = Registry()
        self.registry.interceptors.extend(interceptors)

    @overload
    def workflow(self, fn: F) -> F: ...
    @overload
    def workflow(
        self,
        *,
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
    ) -> Callable[[F], F]: ...

    def workflow(
        self,
        fn: F | None = None,
        *,
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
    ) -> Any:
        """Register an ``async def (ctx, input)`` as a workflow; the name defaults to the
        function's. Register several versions under one name: new runs take the newest,
        running ones stay on theirs. ``timeout`` (seconds or ``"1h"``): a run still going
        that long after its start fails with RunTimedOut, compensating like any failure.
        ``on_event``: each event of that name starts a run with the event's payload as its
        input, once per event (run id ``<workflow>:<event id>``), or once per ``key`` of
        the payload (``key=lambda ev: ev["order"]``: run id ``<workflow>:<key>``). With
        ``batch=`` (a count) and/or ``window=`` (a duration), the events of one name and
        correlation key are collected and one run gets them as a list, once the batch is
        full or its window (from its first event) closes.

        ``concurrency_key`` (a function of the input, e.g. ``lambda order: order.customer``):
        at most ``limit`` runs of one key run at once, across every engine instance; the
        others wait in start order before running any code. With ``max_queued``, a start
        that finds that many waiting fails at once (`QueueFull`)."""

        def register(f: F) -> F:
            wf = workflow_def(
                f,
                name=name,
                version=version,
                timeout=timeout,
                on_event=on_event,
                key=key,
                batch=batch,
                window=window,
                concurrency_key=concurrency_key,
                limit=limit,
                max_queued=max_queued,
            )
            self.registry.add_workflow(wf)
            f.__runstream_workflow__ = wf.name  # type: ignore[attr-defined]
            return f

        return register(fn) if fn is not None else register

    @overload
    def step(self, fn: F) -> F: ...
    @overload
    def step(
        self,
        *,
        retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        non_retryable: tuple[type[BaseException], ...] = (),
        timeout: float | str | None = None,
        name: str | None = None,
        group: str | None = None,
        heartbeat: float | str | None = None,
        queue: str | None = None,
    ) -> Callable[[F], F]: ...

    def step(
        self,
        fn: F | None = None,
        *,
        retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        non_retryable: tuple[type[BaseException], ...] = (),
        timeout: float | str | None = None,
        name: str | None = None,
        group: str | None = None,
        heartbeat: float | str | None = None,
        queue: str | None = None,
    ) -> Any:
        """Declare a step's retry policy: ``retries`` more attempts with exponential
        ``backoff`` seconds; ``non_retryable`` exception types fail the run's step at once;
        ``timeout`` (seconds or ``"30s"``) fails an attempt that runs longer (then retried
        like any failure; see `runtime.steps` for what happens to a sync step's thread).
        Undecorated functions are steps too, with the defaults.

        ``group``: a remote step, run by the task workers serving that group
        (``runstream tasks serve MODULE:APP --group G``) instead of by the engine. Its
        ``timeout`` is then kept by the engine, and ``heartbeat`` (seconds) fails an
        attempt that sent no heartbeat (`StepContext.heartbeat`) for that long.

        ``queue``: each attempt first takes a permit of the limit of that name (declared
        with `App.limit` before); a remote step's group is its queue when a limit of that
        name is declared."""
        if queue is not None and queue not in self.registry.limits:
            raise LookupError(f"queue {queue!r} is not declared: app.limit({queue!r}, ...) first")
        if heartbeat is not None and group is None:
            raise TypeError("heartbeat= is for remote steps: give the step a group= too")
        if group is not None:
            from runstream.topics.spec import Topics

            Topics("x").tasks(group)  # a valid topic name suffix, checked now
        policy = StepPolicy(
            retries,
            backoff,
            max_backoff,
            tuple(non_retryable),
            None if timeout is None else seconds(timeout),
            group,
            None if heartbeat is None else seconds(heartbeat),
            queue,
        )

        def register(f: F) -> F:
            self.registry.add_step(step_def(f, policy, name))
            return f

        return register(fn) if fn is not None else register

    def limit(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        burst: int | None = None,
    ) -> None:
        """Declare a limit on a step queue (a task group's name, or any name steps give as
        ``queue=``), held across every engine instance: at most ``concurrency`` attempts
        at once, at most ``rate`` starts per second (``burst`` at once after idling; by
        default a quarter second's worth, so a busy or late engine loses no throughput).
        Waiting attempts start by their ``priority``, then round robin between their
        ``fairness`` keys, then in order (see `Context.step`)."""
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"limit {name!r}: concurrency must be 1 or more")
        if rate is not None and rate <= 0:
            raise ValueError(f"limit {name!r}: rate must be above 0 per second")
        if burst is None:
            burst = max(1, round(rate / 4)) if rate else 1
        if burst < 1:
            raise ValueError(f"limit {name!r}: burst must be 1 or more")
        self.registry.limits[name] = Limit(name, concurrency, rate, burst)

    def source(
        self,
        topic: str,
        *,
        name: str | None = None,
        key: Callable[[Any], Any] | None = None,
        decode: Callable[[bytes], Any] = json.loads,
        ttl: float | str | None = None,
    ) -> None:
        """Make each record of Kafka topic ``topic`` (a team's own, in its own format) a
        named event, as if `Client.publish` sent it: event ``name`` (default: the topic's
        name), payload ``decode(value)`` (JSON by default), correlation key
        ``key(payload)`` (default: the record's Kafka key, as text), event id
        ``<topic>:<partition>:<offset>``, kept ``ttl`` (seconds or ``"10m"``) for waits
        that come later. ``runstream sources serve MODULE:APP`` forwards them, exactly
        once per record; a record that cannot be decoded or keyed is dead-lettered."""
        from runstream.topics.spec import Topics

        Topics(topic)  # a legal topic name, checked now
        if Topics(self.namespace).family_of(topic) is not None:
            raise ValueError(
                f"{topic!r} is a topic of namespace {self.namespace!r}, not a source "
                f"(the forwarder reads {self.namespace}.events always)"
            )
        wait = 0.0 if ttl is None else seconds(ttl)
        self.registry.add_source(SourceDef(topic, name or topic, key, decode, wait))

    def entity(self, name: str) -> Callable[[type[T]], type[T]]:
        """Register a class as durable entity ``name`` (keyed actors; docs/guides/entities.md).

        Its ``async def`` functions (no ``self``) are exclusive handlers ``(ctx, arg)``:
        one at a time per key, in the order the calls arrive, with the key's durable state
        (``ctx.state.get/set/clear``) and the workflow's ``ctx.step``/``ctx.sleep``. The
        ones marked `runstream.shared` are shared handlers ``(ctx, arg)``: plain reads of
        the state as committed, never queued. Call them with
        ``client.entity(name, key).call(...)``/``.read(...)`` or, from a workflow,
        ``await ctx.entity(name, key).call(...)``."""
        from runstream.engine.entities import entity_def

        def register(cls: type[T]) -> type[T]:
            if name in self.registry.entities:
                raise ValueError(f"entity {name!r} registered twice")
            fns = [(k, getattr(cls, k)) for k in vars(cls) if not k.startswith("_")]
            edef = entity_def(name, [(k, f) for k, f in fns if callable(f)])
            self.registry.add_workflow(edef.workflow())
            self.registry.entities[name] = edef
            return cls

        return register

    def task_worker(self, group: str, *, concurrency: int = 16) -> TaskWorker:
        """A task worker serving the remote steps of ``group`` (`TaskWorker.run` blocks
        until SIGTERM or SIGINT); ``runstream tasks serve`` runs one from the shell."""
        from runstream.taskworker import TaskWorker

        return TaskWorker(self, group, concurrency=concurrency)

    def client(self) -> Client:
        """A `Client` for this namespace (on this App's Kafka)."""
        from runstream.client import Client

        return Client(self.namespace, self.bootstrap)
