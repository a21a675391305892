"""`Settings`: every knob of Runstream, read once at the edge.

Each field can be set in code (``Settings(batch_size=200)``), by environment variable
(``RUNSTREAM_BATCH_SIZE=200``; nested or dict fields as JSON, e.g.
``RUNSTREAM_KAFKA='{"security.protocol": "SSL"}'``; one librdkafka key of ``kafka`` also
as ``RUNSTREAM_KAFKA_<KEY>``, its dots as underscores: ``RUNSTREAM_KAFKA_SASL_USERNAME=ann``
is ``sasl.username``, and wins over the same key in ``RUNSTREAM_KAFKA``) and, for the
engine, on the ``runstream worker`` command line (``--batch-size 200``). The core never
sees `Settings`: the worker and the client hand it plain values.

Where Kafka is, first that is set: ``bootstrap_servers`` (``RUNSTREAM_BOOTSTRAP_SERVERS``),
``KAFKA_BOOTSTRAP_SERVERS``, the broker ``runstream kafka up`` started, ``127.0.0.1:9092``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
KAFKA_KEY_PREFIX = "RUNSTREAM_KAFKA_"
HEARTBEAT_MS = 3000  # librdkafka's default heartbeat.interval.ms


def kafka_key_env(key: str) -> str:
    """The environment variable of one librdkafka setting: sasl.username ->
    RUNSTREAM_KAFKA_SASL_USERNAME (librdkafka's keys are lower case with dots only)."""
    return KAFKA_KEY_PREFIX + key.upper().replace(".", "_")


class _KafkaKeys(PydanticBaseSettingsSource):
    """``kafka`` from one variable per key (RUNSTREAM_KAFKA_SASL_USERNAME=ann): exportable
    from a shell, unlike RUNSTREAM_KAFKA__sasl.username."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ gives the whole value

    def __call__(self) -> dict[str, Any]:
        keys = {
            name[len(KAFKA_KEY_PREFIX) :].lower().replace("_", "."): value
            for name, value in os.environ.items()
            if name.startswith(KAFKA_KEY_PREFIX) and not name.startswith(KAFKA_KEY_PREFIX + "_")
        }
        return {"kafka": keys} if keys else {}


class Settings(BaseSettings):
    """Runstream's settings; the defaults suit most deployments."""

    model_config = SettingsConfigDict(
        env_prefix="RUNSTREAM_", env_nested_delimiter="__", extra="forbid", validate_assignment=True
    )

    # -- Kafka, for every client ---------------------------------------------------
    bootstrap_servers: str | None = Field(None, description="Kafka bootstrap servers.")
    kafka: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for every client (TLS, SASL, ...).",
    )
    connect_timeout: float = Field(
        10.0, gt=0, description="Seconds to wait for a broker before giving up (client, CLI)."
    )
    send_timeout: float = Field(
        30.0, gt=0, description="Seconds a client keeps trying to deliver a command."
    )

    # -- an engine instance ----------------------------------------------------------
    instance_id: str = Field(
        "",
        description="Stable id of this engine instance: names its transactional id, state "
        "directory and static group membership. Never share one. Default: host and PID "
        "(no static membership).",
    )
    state_dir: Path = Field(Path("./state"), description="Where the RocksDB projections live.")
    partitions: int = Field(
        12, ge=1, description="Partition count if this instance creates the namespace's topics."
    )
    create_topics: bool = Field(True, description="Create the namespace's topics if missing.")
    batch_size: int = Field(500, ge=1, description="Commands consumed per transaction at most.")
    step_concurrency: int = Field(16, ge=1, description="Local step bodies running at once.")
    transaction_timeout_ms: int = Field(
        10_000, ge=1000, description="How long a crashed instance can hold its partitions."
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="How long the consumer group waits for a silent instance before it "
        "gives the instance's partitions to the others: most of a failover. The broker "
        "bounds it (group.min.session.timeout.ms, 6000 by default; 1000 on the local "
        "broker); shorter risks taking a live instance's partitions at a long GC pause or "
        "network blip (docs/guides/deploying.md).",
    )
    heartbeat_interval_ms: int | None = Field(
        None,
        ge=100,
        description="How often an instance's consumers tell the group they are alive and "
        "learn of a rebalance (on librdkafka's own thread, not the engine's loop), below "
        "session_timeout_ms. Default: 3000 (librdkafka's), or a third of "
        "session_timeout_ms if that is shorter.",
    )
    standbys: int = Field(
        0,
        ge=0,
        description="Warm copies of each partition this instance keeps for the instances "
        "before it in the group (`runstream.standby`): a failover then restores only the "
        "last facts. 0: none; 1 is enough for most deployments.",
    )
    leave_on_stop: bool = Field(
        False,
        description="Hand the partitions over at once when the instance stops (no static "
        "membership: use it for a stop that is final, e.g. scaling down). Default: a stopped "
        "instance keeps its partitions for the session timeout, so a restart takes them "
        "back without a rebalance.",
    )
    stop_timeout: float = Field(
        10.0,
        ge=0,
        description="Seconds steps still running at a stop get to finish and be "
        "recorded (the others are handed over, as at a rebalance); a second SIGTERM/SIGINT "
        "stops at once.",
    )
    handover_timeout: float = Field(
        5.0,
        ge=0,
        description="Seconds steps running on a partition that a rebalance moves away get "
        "to finish and be recorded before the partition goes; a step still running then is "
        "handed over and runs again on the next owner, charged as no recovery.",
    )
    chain_budget: float = Field(
        0.005,
        ge=0,
        description="Seconds a batch may wait for the steps it starts before it commits, so "
        "a chain of quick local steps (and the run's end) commits in one transaction; 0 "
        "commits every step's start first. Only while a commit or an assignment proved the "
        "instance a member of its group within session_timeout_ms less two heartbeat "
        "intervals (docs/concepts.md, Chains).",
    )
    activation_budget: float = Field(
        1.0,
        gt=0,
        description="Seconds one run of workflow code may take; past it the run is "
        "parked with the reason.",
    )
    max_record_bytes: int | None = Field(
        None,
        gt=131072,
        description="Largest Kafka record in bytes; default: the smallest "
        "max.message.bytes of the namespace's topics and the producer.",
    )
    history_warn_events: int = Field(
        10_000, ge=1, description="A run's history events past which the lifecycle says so."
    )
    history_max_events: int = Field(
        50_000,
        ge=1,
        description="A run's history events at which it fails (history-too-large): a long "
        "loop should continue as new.",
    )
    history_warn_bytes: int = Field(
        10 * 1024 * 1024,
        ge=1,
        description="A run's payload bytes past which the lifecycle says so.",
    )
    history_max_bytes: int = Field(
        50 * 1024 * 1024, ge=1, description="A run's payload bytes at which it fails."
    )
    updates_in_flight: int = Field(
        10, ge=1, description="Updates of one run accepted and not completed at once."
    )
    updates_per_history: int = Field(
        2000,
        ge=1,
        le=16_384,
        description="Updates one run's history takes; then it should continue as new.",
    )
    # -- snapshots and retention (`runstream.snapshots`) ---------------------------------
    snapshot_interval: float = Field(
        10.0,
        ge=0,
        description="Seconds between two snapshots of the runs that changed, written by "
        "each owner to <ns>.state (a new owner restores from them and the journal's tail); "
        "0: no snapshots (a new owner reads the whole journal).",
    )
    finished_retention: float = Field(
        0.0,
        ge=0,
        description="Seconds a finished (completed, failed, cancelled, dead) run is kept "
        "after its end; then it is purged from the projection and the snapshots, and its "
        "id can start a new run. 0: kept for ever. Needs snapshot_interval > 0.",
    )
    # -- large payloads (`engine.blobs`) -------------------------------------------------
    blob_threshold_bytes: int = Field(
        256 * 1024,
        ge=0,
        description="A payload above this many bytes goes to <ns>.blobs in chunks and its "
        "record carries a reference (docs/guides/large-payloads.md); 0: never.",
    )
    blob_budget_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="The large payloads of one run may total this many bytes; past it the "
        "run fails with the code blob-budget.",
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Serve Prometheus metrics on this port at /metrics (0: no metrics).",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="The address the metrics port binds (0.0.0.0: every one)."
    )
    exit_on_hang: bool = Field(
        True,
        description="End the process when a Kafka call or workflow code hangs, so the "
        "supervisor restarts it (turn off only for engines on a thread of a bigger program).",
    )

    lifecycle_format: Literal["avro", "json", "avro-registry"] = Field(
        "avro",
        description="How lifecycle events are written to <ns>.lifecycle: avro (single-object), "
        "json (one object per record) or avro-registry (Confluent wire format; needs "
        "schema_registry_url). Readers read all three, record by record.",
    )
    schema_registry_url: str | None = Field(
        None,
        description="The Confluent-compatible Schema Registry where the engine registers the "
        "lifecycle schema at start (lifecycle_format avro-registry).",
    )

    @model_validator(mode="after")
    def _heartbeat_below_session(self) -> Settings:
        session = self.group_session()
        beat, timeout = session["heartbeat.interval.ms"], session["session.timeout.ms"]
        if beat >= timeout:
            raise ValueError(
                f"heartbeat_interval_ms ({beat}) must be below session_timeout_ms ({timeout}): "
                "the group takes a member that sent no heartbeat for a session as dead"
            )
        return self

    def group_session(self) -> dict[str, int]:
        """The librdkafka settings of an instance's consumer group membership (a heartbeat
        given in ``kafka`` still counts, as it did before `heartbeat_interval_ms`)."""
        given = self.heartbeat_interval_ms or self.kafka.get("heartbeat.interval.ms")
        # Not a third of a long session: every rebalance waits for the members' heartbeats.
        beat = int(given or min(HEARTBEAT_MS, self.session_timeout_ms // 3))
        return {"session.timeout.ms": self.session_timeout_ms, "heartbeat.interval.ms": beat}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win; dicts (``kafka``) are merged key by key.
        kafka_keys = _KafkaKeys(settings_cls)
        return init_settings, kafka_keys, env_settings, dotenv_settings, file_secret_settings

    def bootstrap(self) -> str:
        """Where Kafka is (see the module docstring for the order)."""
        return (
            self.bootstrap_servers
            or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
            or local_bootstrap()
            or DEFAULT_BOOTSTRAP
        )

    def with_bootstrap(self, bootstrap: str | None) -> Settings:
        """These settings, with ``bootstrap`` if it is given."""
        return self.model_copy(update={"bootstrap_servers": bootstrap}) if bootstrap else self


def cache_dir() -> Path:
    """Cache for the Kafka jars and the local broker's files: outside any source tree."""
    base = os.environ.get("RUNSTREAM_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "runstream"


def local_broker_file() -> Path:
    """Where `runstream kafka up` records the broker it started (runstream.dev.localkafka)."""
    return cache_dir() / "local" / "state.json"


def local_bootstrap() -> str | None:
    """The bootstrap of the broker `runstream kafka up` started, if it still runs."""
    try:
        state: dict[str, Any] = json.loads(local_broker_file().read_text())
    except (OSError, ValueError):
        return None
    alive = any(broker_alive(pid) for pid in state.get("pids", []))
    return str(state["bootstrap"]) if alive else None


def broker_alive(pid: int) -> bool:
    """Process ``pid`` runs a Kafka broker (on Linux, a reused pid is not mistaken for one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.parent.exists():
        try:
            return b"kafka.Kafka" in cmdline.read_bytes()
        except OSError:
            return False
    return True
