"""Create, describe and check a namespace's topics (Kafka AdminClient).

The partition count of a namespace is fixed when its topics are created: ``commands``
and ``journal`` must keep equal counts, and adding partitions later would move run
keys. :func:`ensure_topics` therefore refuses to create missing topics with a count
that differs from the namespace's existing ``commands``/``journal`` topics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from runstream.config import client_config
from runstream.errors import TopicError
from runstream.topics.spec import (
    DEFAULT_PARTITIONS,
    DEFAULT_REPLICATION,
    Topics,
    TopicSpec,
    topic_specs,
)

__all__ = ["check_copartitioned", "describe_topics", "ensure_topics"]

#: Topic configs that ``describe_topics`` reports.
REPORTED_CONFIGS = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "min.insync.replicas",
    "max.message.bytes",
)


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient(client_config(bootstrap))


def _metadata(admin: AdminClient, bootstrap: str, timeout: float) -> dict[str, Any]:
    """Topic name -> TopicMetadata of every topic in the cluster."""
    try:
        return dict(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise TopicError(f"cannot list topics at {bootstrap}: {exc.args[0]}") from exc


def _create_hint(ns: str) -> str:
    return f"run `runstream topics create {ns}`"


def ensure_topics(
    bootstrap: str,
    ns: str,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int = DEFAULT_REPLICATION,
    *,
    task_groups: Iterable[str] = (),
    timeout: float = 30.0,
) -> list[str]:
    """Create the topics of namespace ``ns`` that do not exist yet; idempotent.

    Also creates ``<ns>.tasks.<group>`` for each of ``task_groups``. Existing topics
    are left as they are (their configs are not changed). Waits until the new topics
    are visible in the cluster metadata.

    Returns:
        The names of the topics this call created (empty when all existed).

    Raises:
        TopicError: Kafka unreachable, a creation failed, or the namespace already
            exists with a different partition count for ``commands``/``journal``.
    """
    specs = topic_specs(ns, partitions, replication, list(task_groups))
    topics = Topics(ns)
    admin = _admin(bootstrap)
    existing = _metadata(admin, bootstrap, timeout)

    # The count is fixed at creation: never create one half of the co-partitioned
    # pair with another count than the half that exists.
    for name in (topics.commands, topics.journal):
        if name in existing and len(existing[name].partitions) != partitions:
            raise TopicError(
                f"{name} already exists with {len(existing[name].partitions)} partitions, "
                f"not {partitions}: the partition count of a namespace is fixed when it is "
                f"created (use --partitions {len(existing[name].partitions)}, or a new "
                f"namespace)"
            )

    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [_new_topic(s) for s in missing], operation_timeout=timeout, request_timeout=timeout
    )
    created: list[str] = []
    errors: list[str] = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            err = exc.args[0]
            # Someone else (another engine instance) created it meanwhile: fine.
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            errors.append(f"{name}: {err}")
    if errors:
        raise TopicError(f"cannot create topics at {bootstrap}: {'; '.join(errors)}")
    _wait_visible(admin, bootstrap, created, timeout)
    # A concurrent creator may have used another count; fail loudly rather than run.
    check_copartitioned(bootstrap, ns, timeout=timeout)
    return sorted(created)


def _new_topic(spec: TopicSpec) -> NewTopic:
    return NewTopic(
        spec.name,
        num_partitions=spec.partitions,
        replication_factor=spec.replication,
        config=dict(spec.configs),
    )


def _wait_visible(admin: AdminClient, bootstrap: str, names: list[str], timeout: float) -> None:
    """Wait until every partition of ``names`` has a leader in the metadata."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        meta = _metadata(admin, bootstrap, timeout)
        for name in list(pending):
            t = meta.get(name)
            if (
                t is not None
                and t.error is None
                and t.partitions
                and all(p.leader >= 0 and p.error is None for p in t.partitions.values())
            ):
                pending.discard(name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TopicError(
                f"topics {', '.join(sorted(pending))} were created but have no leader "
                f"after {timeout:.0f}s"
            )
        time.sleep(0.1)


def describe_topics(bootstrap: str, ns: str, *, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The namespace's topics as they are in the cluster.

    One dict per declared topic and per existing ``<ns>.tasks.*`` topic, with keys
    ``name``, ``family``, ``exists``, ``partitions`` and ``replication`` (None when
    missing) and ``configs`` (the values of :data:`REPORTED_CONFIGS`).
    """
    topics = Topics(ns)
    admin = _admin(bootstrap)
    meta = _metadata(admin, bootstrap, timeout)
    names = list(topics.fixed().values())
    names += sorted(n for n in meta if n.startswith(topics.tasks_prefix))
    present = [n for n in names if n in meta]

    configs: dict[str, dict[str, str]] = {}
    if present:
        resources = [ConfigResource(ResourceType.TOPIC, n) for n in present]
        futures = admin.describe_configs(resources, request_timeout=timeout)
        for resource, future in futures.items():
            try:
                entries = future.result()
            except KafkaException as exc:
                raise TopicError(f"cannot describe {resource.name}: {exc.args[0]}") from exc
            configs[resource.name] = {k: entries[k].value for k in REPORTED_CONFIGS if k in entries}

    rows = []
    for name in names:
        t = meta.get(name)
        parts = t.partitions if t is not None else {}
        rows.append(
            {
                "name": name,
                "family": topics.family_of(name),
                "exists": t is not None,
                "partitions": len(parts) if t is not None else None,
                "replication": len(parts[0].replicas) if 0 in parts else None,
                "configs": configs.get(name, {}),
            }
        )
    return rows


def check_copartitioned(bootstrap: str, ns: str, *, timeout: float = 30.0) -> int:
    """The namespace's partition count, after checking ``commands`` and ``journal``.

    Raises:
        TopicError: either topic is missing, or their partition counts differ.
    """
    topics = Topics(ns)
    meta = _metadata(_admin(bootstrap), bootstrap, timeout)
    missing = [n for n in (topics.commands, topics.journal) if n not in meta]
    if missing:
        raise TopicError(
            f"namespace {ns!r} is not set up at {bootstrap}: {', '.join(missing)} "
            f"missing; {_create_hint(ns)}"
        )
    n_commands = len(meta[topics.commands].partitions)
    n_journal = len(meta[topics.journal].partitions)
    if n_commands != n_journal:
        raise TopicError(
            f"{topics.commands} has {n_commands} partitions but {topics.journal} has "
            f"{n_journal}: they must be co-partitioned (equal counts). The partition count "
            f"is fixed when a namespace is created; recreate the namespace's topics "
            f"with one count"
        )
    return n_commands
