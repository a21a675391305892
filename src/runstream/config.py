"""Where Runstream finds Kafka and keeps its state. Read once, at the edge."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def cache_dir() -> Path:
    """Cache for the Kafka jars and the local broker's files: outside any source tree."""
    base = os.environ.get("RUNSTREAM_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "runstream"


def resolve_bootstrap(explicit: str | None = None) -> str:
    """The bootstrap servers: the argument, else RUNSTREAM_BOOTSTRAP_SERVERS, else
    KAFKA_BOOTSTRAP_SERVERS, else the broker `runstream kafka up` started, else 127.0.0.1:9092."""
    if explicit:
        return explicit
    for var in ("RUNSTREAM_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"):
        if os.environ.get(var):
            return os.environ[var]
    from runstream import localkafka  # local import: config must stay cheap to import

    return localkafka.current_bootstrap() or DEFAULT_BOOTSTRAP


def client_config(bootstrap: str) -> dict[str, object]:
    """librdkafka settings every Runstream client shares."""
    return {"bootstrap.servers": bootstrap, "broker.address.family": "v4"}
