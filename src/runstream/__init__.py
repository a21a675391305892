"""Runstream: durable Python workflows whose only database is Apache Kafka.

The package's layers, and who may import what (a test enforces the Kafka and RocksDB
rules):

- ``engine``: the functional core (state, reducer, rules, replay); imports neither
  ``confluent_kafka`` nor ``rocksdict``, nor ``topics``/``projections``.
- ``schemas``: the Avro contract and its typed records; pure.
- ``topics``: the Kafka edge, the only package importing ``confluent_kafka``
  (besides ``dev``, the local broker launcher).
- ``projections``: the RocksDB shell, the only package importing ``rocksdict``.
- ``worker``, ``client``, ``cli``, ``audit``, ``supervisor``: the shell on top.

The public names below are imported on first use, so a process that needs only a part
(the supervisor of ``runstream worker`` needs the standard library alone) stays small.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runstream.app import App
    from runstream.client import Client, RunInfo, UpdateHandle
    from runstream.engine.context_interactions import Promise
    from runstream.engine.entities import EntityContext, SharedContext, shared
    from runstream.engine.steps import StepContext
    from runstream.engine.workflow_context import Context
    from runstream.errors import (
        BlobUnavailable,
        ChildFailed,
        CommandNotDelivered,
        ConfigError,
        DecodeError,
        EventNotSet,
        EventRefused,
        EventTimeout,
        Failure,
        HistoryTooLarge,
        InvalidInput,
        KafkaFatal,
        KafkaNotAuthorized,
        KafkaSetupError,
        KafkaUnavailable,
        NonDeterminismError,
        OwnerUnavailable,
        PayloadTooLarge,
        PromiseRejected,
        PromiseTimeout,
        QueryFailed,
        QueryTimeout,
        QueueFull,
        RunCancelled,
        RunFailed,
        RunNotFound,
        RunRejected,
        RunstreamError,
        RunTimedOut,
        SchemaError,
        SignalTimeout,
        StepError,
        StepTimeout,
        TerminalStepError,
        TopicError,
        UpdateFailed,
        WorkflowNotFound,
    )
    from runstream.operations import CancelReport, JournalFact, RunEvent, RunPage, RunSummary
    from runstream.pausing import PauseReport
    from runstream.settings import Settings
    from runstream.worker import Worker

_ERRORS = (
    "BlobUnavailable",
    "ChildFailed",
    "CommandNotDelivered",
    "ConfigError",
    "DecodeError",
    "EventNotSet",
    "EventRefused",
    "EventTimeout",
    "Failure",
    "HistoryTooLarge",
    "InvalidInput",
    "KafkaFatal",
    "KafkaNotAuthorized",
    "KafkaSetupError",
    "KafkaUnavailable",
    "NonDeterminismError",
    "OwnerUnavailable",
    "PayloadTooLarge",
    "PromiseRejected",
    "PromiseTimeout",
    "QueryFailed",
    "QueryTimeout",
    "QueueFull",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
    "RunRejected",
    "RunTimedOut",
    "RunstreamError",
    "SchemaError",
    "SignalTimeout",
    "StepError",
    "StepTimeout",
    "TerminalStepError",
    "TopicError",
    "UpdateFailed",
    "WorkflowNotFound",
)
_HOME = {
    "App": "runstream.app",
    "Client": "runstream.client",
    "RunInfo": "runstream.client",
    "UpdateHandle": "runstream.client",
    "Context": "runstream.engine.workflow_context",
    "Promise": "runstream.engine.context_interactions",
    "Settings": "runstream.settings",
    "StepContext": "runstream.engine.steps",
    "Worker": "runstream.worker",
    "CancelReport": "runstream.operations",
    "JournalFact": "runstream.operations",
    "RunPage": "runstream.operations",
    "RunSummary": "runstream.operations",
    "RunEvent": "runstream.operations",
    "PauseReport": "runstream.pausing",
    **dict.fromkeys(("EntityContext", "SharedContext", "shared"), "runstream.engine.entities"),
    **dict.fromkeys(_ERRORS, "runstream.errors"),
}

__all__ = [
    "App",
    "BlobUnavailable",
    "CancelReport",
    "ChildFailed",
    "Client",
    "CommandNotDelivered",
    "ConfigError",
    "Context",
    "DecodeError",
    "EntityContext",
    "EventNotSet",
    "EventRefused",
    "EventTimeout",
    "Failure",
    "HistoryTooLarge",
    "InvalidInput",
    "JournalFact",
    "KafkaFatal",
    "KafkaNotAuthorized",
    "KafkaSetupError",
    "KafkaUnavailable",
    "NonDeterminismError",
    "OwnerUnavailable",
    "PauseReport",
    "PayloadTooLarge",
    "Promise",
    "PromiseRejected",
    "PromiseTimeout",
    "QueryFailed",
    "QueryTimeout",
    "QueueFull",
    "RunCancelled",
    "RunEvent",
    "RunFailed",
    "RunInfo",
    "RunNotFound",
    "RunPage",
    "RunRejected",
    "RunSummary",
    "RunTimedOut",
    "RunstreamError",
    "SchemaError",
    "Settings",
    "SharedContext",
    "SignalTimeout",
    "StepContext",
    "StepError",
    "StepTimeout",
    "TerminalStepError",
    "TopicError",
    "UpdateFailed",
    "UpdateHandle",
    "Worker",
    "WorkflowNotFound",
    "shared",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'runstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
