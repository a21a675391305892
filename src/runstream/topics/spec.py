"""Every Kafka topic of a Runstream namespace, declared in one place.

A namespace ``ns`` owns these topics (ARCHITECTURE.md section 2):

============== ============ ====================================================
topic          key          purpose
============== ============ ====================================================
ns.commands    run id       the inbox: StartRun, Signal, Cancel, StepResult, ...
ns.journal     run id       the facts; each run's whole history (kept forever)
ns.lifecycle   run id       public run and step lifecycle events
ns.tasks.<g>   run id       remote step invocations for worker group ``g``
ns.events      any          events any service publishes (JSON), forwarded as commands
ns.replies     client id    answers to queries
ns.dlq         original key poison records and dead runs, never dropped
ns.state       run id       compacted snapshots of the projections (restore from them)
ns.blobs       hash/chunk   large payloads' chunks (compacted; `engine.blobs`)
============== ============ ====================================================

**The partition count of a namespace is fixed when its topics are created.**
``commands`` and ``journal`` are co-partitioned: same count, same key, same
partitioner (Kafka's murmur2), so partition *p* of both belongs to the same engine
instance. Adding partitions later would move run keys to other partitions and split
runs' histories, so it is never done: pick the count generously (it caps how many
engine instances share the work), or create a new namespace and migrate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from runstream.errors import TopicError

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_REPLICATION",
    "FAMILIES",
    "TopicSpec",
    "Topics",
    "topic_specs",
]

DEFAULT_PARTITIONS = 12
DEFAULT_REPLICATION = 1

_HOUR_MS = 60 * 60 * 1000
_DAY_MS = 24 * _HOUR_MS
_WEEK_MS = 7 * _DAY_MS

#: The fixed topic families of a namespace (``tasks.<group>`` is a template on top).
FAMILIES = ("commands", "journal", "lifecycle", "events", "replies", "dlq", "state", "blobs")

# Per family: the key, and the configs that differ from the broker's defaults.
# journal: never compacted and never expired; it is the only copy of run histories,
# and its retention must not depend on any consumer keeping up (KAFKA.md 3.3).
# commands: must outlive the longest outage of the whole engine group.
_FAMILY_CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    "commands": ("run id", {"cleanup.policy": "delete", "retention.ms": str(_WEEK_MS)}),
    "journal": (
        "run id",
        {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"},
    ),
    "lifecycle": ("run id", {"cleanup.policy": "delete", "retention.ms": str(_WEEK_MS)}),
    "tasks": ("run id", {"cleanup.policy": "delete", "retention.ms": str(_WEEK_MS)}),
    # events: read by the source forwarders (`runstream.sources`), never by the engine.
    "events": ("any", {"cleanup.policy": "delete", "retention.ms": str(_WEEK_MS)}),
    "replies": ("client id", {"cleanup.policy": "delete", "retention.ms": str(_DAY_MS)}),
    "dlq": ("original key", {"cleanup.policy": "delete", "retention.ms": "-1"}),
    # state: the latest snapshot record per key (`projections.snapshot`). A new owner reads
    # it whole, so it is compacted eagerly: segments roll hourly (the active one is never
    # cleaned), the cleaner starts at 10% dirty, and a purged run's tombstones go an hour
    # after a cleaning saw them (a restore reads a partition in seconds).
    "state": (
        "run id",
        {
            "cleanup.policy": "compact",
            "retention.ms": "-1",
            "segment.ms": str(_HOUR_MS),
            "min.cleanable.dirty.ratio": "0.1",
            "delete.retention.ms": str(_HOUR_MS),
        },
    ),
    # blobs: content-addressed, so compaction keeps one copy of each chunk, for ever.
    "blobs": ("sha256/chunk", {"cleanup.policy": "compact", "retention.ms": "-1"}),
}

# Every topic: small index files. Kafka preallocates a new segment's offset and time index
# at segment.index.bytes (default 10 MiB, sparse) and memory-maps them; the first write
# faults the mapping in, reading ahead over it: 3 ms per file on a disk with an 8 MiB
# readahead, on a request handler thread, and the broker stalled 35-60 ms at each
# transaction marker while a new namespace's partitions wrote their first index entries
# (W1's 40 ms mode, benchmarks/README.md). 256 KiB costs 0.1 ms. An entry every 16 KiB
# of log (default 4 KiB) keeps a segment rolling at about 340 MiB (time index full), not
# sooner; a fetch scans at most 16 KiB past the entry it looks up.
EVERY_TOPIC = {"segment.index.bytes": str(256 * 1024), "index.interval.bytes": str(16 * 1024)}

# Kafka topic names: [a-zA-Z0-9._-], at most 249 characters.
_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
_MAX_NAME = 249


def _check_name_part(what: str, value: str) -> None:
    if not value or not _LEGAL.fullmatch(value) or value.startswith(".") or value.endswith("."):
        raise TopicError(
            f"invalid {what} {value!r}: use letters, digits, '.', '_' and '-', "
            f"not starting or ending with '.'"
        )


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic to create: full name, family, layout and topic configs."""

    name: str
    family: str
    key: str
    partitions: int
    replication: int
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Topics:
    """The full topic names of namespace ``ns``.

    >>> t = Topics("shop")
    >>> t.commands, t.tasks("payments")
    ('shop.commands', 'shop.tasks.payments')
    """

    ns: str

    def __post_init__(self) -> None:
        _check_name_part("namespace", self.ns)
        if len(self.ns) > _MAX_NAME - len(".lifecycle"):
            raise TopicError(f"namespace {self.ns!r} is too long for Kafka topic names")

    @property
    def commands(self) -> str:
        return f"{self.ns}.commands"

    @property
    def journal(self) -> str:
        return f"{self.ns}.journal"

    @property
    def lifecycle(self) -> str:
        return f"{self.ns}.lifecycle"

    @property
    def events(self) -> str:
        return f"{self.ns}.events"

    @property
    def replies(self) -> str:
        return f"{self.ns}.replies"

    @property
    def dlq(self) -> str:
        return f"{self.ns}.dlq"

    @property
    def state(self) -> str:
        return f"{self.ns}.state"

    @property
    def blobs(self) -> str:
        return f"{self.ns}.blobs"

    @property
    def tasks_prefix(self) -> str:
        """Prefix of every task topic (``<ns>.tasks.``)."""
        return f"{self.ns}.tasks."

    def tasks(self, group: str) -> str:
        """The task topic of remote-step worker group ``group``."""
        _check_name_part("task group", group)
        return f"{self.tasks_prefix}{group}"

    def fixed(self) -> dict[str, str]:
        """Family -> full name for the fixed families (every one but ``tasks``)."""
        return {family: f"{self.ns}.{family}" for family in FAMILIES}

    def family_of(self, topic: str) -> str | None:
        """The family of a full topic name of this namespace, or None."""
        if topic.startswith(self.tasks_prefix) and len(topic) > len(self.tasks_prefix):
            return "tasks"
        for family, name in self.fixed().items():
            if topic == name:
                return family
        return None


def topic_specs(
    ns: str,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int = DEFAULT_REPLICATION,
    task_groups: tuple[str, ...] | list[str] = (),
) -> list[TopicSpec]:
    """What to create for namespace ``ns``: the fixed families, plus one task topic per
    group in ``task_groups``.

    Every topic gets ``partitions`` partitions; only ``commands`` and ``journal`` are
    required to be equal, but the run-keyed ones (lifecycle, tasks) are produced to
    the partition of their run, so keeping one count everywhere is simplest.
    ``min.insync.replicas`` is set only when ``replication > 1``.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise TopicError(f"partitions must be a positive integer, not {partitions!r}")
    if isinstance(replication, bool) or not isinstance(replication, int) or replication < 1:
        raise TopicError(f"replication must be a positive integer, not {replication!r}")
    topics = Topics(ns)
    names = [(family, name) for family, name in topics.fixed().items()]
    names += [("tasks", topics.tasks(group)) for group in task_groups]
    specs = []
    for family, name in names:
        key, family_configs = _FAMILY_CONFIGS[family]
        configs = {**EVERY_TOPIC, **family_configs}
        if replication > 1:
            # One replica may be down without blocking writes; two must have each record.
            configs["min.insync.replicas"] = str(min(replication - 1, 2))
        specs.append(TopicSpec(name, family, key, partitions, replication, configs))
    return specs
