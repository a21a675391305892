"""Create, describe and check a namespace's topics (Kafka AdminClient), and what every
Kafka client of the package shares: its configuration, its errors, `consume_ready`.

The partition count of a namespace is fixed when its topics are created: ``commands``
and ``journal`` must keep equal counts, and adding partitions later would move run
keys. :func:`ensure_topics` therefore refuses to create missing topics with a count
that differs from the namespace's existing ``commands``/``journal`` topics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from runstream.errors import KafkaNotAuthorized, KafkaUnavailable, TopicError
from runstream.topics.logs import kafka_logger, last_error
from runstream.topics.spec import (
    DEFAULT_PARTITIONS,
    DEFAULT_REPLICATION,
    Topics,
    TopicSpec,
    topic_specs,
)

__all__ = [
    "check_authorized",
    "check_copartitioned",
    "client_config",
    "describe_topics",
    "ensure_topics",
    "max_record_bytes",
    "partition_count",
    "wait_for_cluster",
]

Config = Mapping[str, Any]

#: Topic configs that ``describe_topics`` reports.
REPORTED_CONFIGS = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "min.insync.replicas",
    "max.message.bytes",
    "segment.index.bytes",
    "index.interval.bytes",
)


def client_config(bootstrap: str, extra: Config | None = None) -> dict[str, Any]:
    """librdkafka settings every Runstream client shares; ``extra`` wins (TLS, SASL...).
    librdkafka's own log lines go through Python logging (`topics.logs`)."""
    return {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "logger": kafka_logger(),
        **(extra or {}),
    }


_REFUSED = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
)


def consume_ready(consumer: Consumer, timeout: float, limit: int = 500) -> list[Message]:
    """Wait up to ``timeout`` for one message, then take what else is already there.
    Every read goes through this: ``consume(n, timeout)`` alone waits out the whole
    timeout unless n messages come (librdkafka fills the batch), which held each record
    back by up to that timeout (`tests/kafka/test_broker_semantics.py`)."""
    first = consumer.poll(timeout)
    return [] if first is None else [first, *consumer.consume(limit - 1, 0)]


def check_authorized(config: Config, what: str, err: KafkaError | None) -> None:
    """Raise KafkaNotAuthorized if ``err`` (about ``what``, e.g. a topic's metadata) says
    the broker's ACLs refuse this client. (A topic the ACLs hide is missing from a list of
    all topics; only asking for it by name tells.)"""
    if err is not None and err.code() in _REFUSED:
        user = config.get("sasl.username")
        raise KafkaNotAuthorized(
            str(config["bootstrap.servers"]),
            f"User:{user}" if user else "this client",
            what,
            err.name(),
        )


def wait_for_cluster(
    config: Config, timeout: float, stopping: Callable[[], bool] = lambda: False
) -> int:
    """Wait until a broker answers; the number of brokers. Asks in short steps, so a stop
    request is noticed within a second. Raises KafkaUnavailable after ``timeout``."""
    admin = AdminClient(dict(config))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return len(admin.list_topics(timeout=min(1.0, max(0.1, left))).brokers)
        except KafkaException as exc:
            admin.poll(0)  # serve librdkafka's log lines (to the runstream.librdkafka logger)
            if time.monotonic() >= deadline or stopping():
                raise KafkaUnavailable(
                    str(config["bootstrap.servers"]),
                    f"no broker answered within {timeout:g}s",
                    last_error() or str(exc.args[0]),
                ) from None


def unavailable(config: Config, what: str, exc: KafkaException) -> KafkaUnavailable:
    return KafkaUnavailable(
        str(config["bootstrap.servers"]), what, last_error() or str(exc.args[0])
    )


#: Errors of a question while a broker is away or a coordinator or leader moves: asking
#: again soon gets an answer.
TRANSIENT = frozenset(
    {
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError._UNKNOWN_PARTITION,  # the client's metadata does not know it yet
    }
)


def transient(err: object) -> bool:
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in TRANSIENT)


def refused(config: Config, what: str, exc: KafkaException) -> KafkaUnavailable | TopicError:
    """The error for a question Kafka did not answer: `KafkaUnavailable` when it may
    answer if asked again (`transient`), else `TopicError` (an ACL, a missing topic)."""
    err = exc.args[0]
    if transient(err):
        return unavailable(config, what, exc)
    return TopicError(f"{what}: {err}")


def max_record_bytes(config: Config, topics: Iterable[str], timeout: float = 10.0) -> int:
    """The largest record every one of ``topics`` and our producers take.

    Raises:
        KafkaUnavailable: no broker answered in time (the engine asks again).
        TopicError: Kafka refused the question."""
    limits = [int(config.get("message.max.bytes", 1_000_000))]
    admin = AdminClient(dict(config))  # keep it alive until the futures are done
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    for future in admin.describe_configs(resources, request_timeout=timeout).values():
        try:
            entry = future.result().get("max.message.bytes")
        except KafkaException as exc:
            raise refused(config, "reading the topics' max.message.bytes", exc) from None
        if entry is not None:
            limits.append(int(entry.value))
    return min(limits)


def partition_count(config: Config, topic: str, timeout: float = 30.0) -> int | None:
    """``topic``'s partition count; None if it does not exist."""
    bootstrap = str(config["bootstrap.servers"])
    t = _metadata(AdminClient(dict(config)), bootstrap, timeout).get(topic)
    return len(t.partitions) if t is not None and t.error is None and t.partitions else None


def _admin(bootstrap: str, kafka: Config | None) -> AdminClient:
    return AdminClient(client_config(bootstrap, kafka))


def _metadata(admin: AdminClient, bootstrap: str, timeout: float) -> dict[str, Any]:
    """Topic name -> TopicMetadata of every topic in the cluster."""
    try:
        return dict(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise KafkaUnavailable(
            bootstrap, "listing topics", last_error() or str(exc.args[0])
        ) from None


def _create_hint(ns: str) -> str:
    return f"run `runstream topics create -n {ns}`"


def ensure_topics(
    bootstrap: str,
    ns: str,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int = DEFAULT_REPLICATION,
    *,
    task_groups: Iterable[str] = (),
    timeout: float = 30.0,
    kafka: Config | None = None,
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
    admin = _admin(bootstrap, kafka)
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
    check_copartitioned(bootstrap, ns, timeout=timeout, kafka=kafka)
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


def describe_topics(
    bootstrap: str, ns: str, *, timeout: float = 30.0, kafka: Config | None = None
) -> list[dict[str, Any]]:
    """The namespace's topics as they are in the cluster.

    One dict per declared topic and per existing ``<ns>.tasks.*`` topic, with keys
    ``name``, ``family``, ``exists``, ``partitions`` and ``replication`` (None when
    missing) and ``configs`` (the values of :data:`REPORTED_CONFIGS`).
    """
    topics = Topics(ns)
    admin = _admin(bootstrap, kafka)
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


def check_copartitioned(
    bootstrap: str, ns: str, *, timeout: float = 30.0, kafka: Config | None = None
) -> int:
    """The namespace's partition count, after checking ``commands`` and ``journal``.

    Raises:
        TopicError: either topic is missing, or their partition counts differ.
        KafkaNotAuthorized: the ACLs hide either topic from this client.
    """
    topics = Topics(ns)
    admin = _admin(bootstrap, kafka)
    meta = _metadata(admin, bootstrap, timeout)
    missing = [n for n in (topics.commands, topics.journal) if n not in meta]
    for name in missing:  # hidden by the ACLs, or really missing? (never auto-creates it)
        try:
            admin.describe_topics(TopicCollection([name]), request_timeout=timeout)[name].result()
        except KafkaException as exc:
            check_authorized(client_config(bootstrap, kafka), f"topic {name}", exc.args[0])
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
