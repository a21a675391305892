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
"""

from runstream.app import App
from runstream.client import Client, RunInfo
from runstream.engine.replay import Context
from runstream.errors import (
    CommandNotDelivered,
    InvalidInput,
    KafkaUnavailable,
    NonDeterminismError,
    PayloadTooLarge,
    RunCancelled,
    RunFailed,
    RunNotFound,
    RunRejected,
    RunstreamError,
    SignalTimeout,
    StepError,
    StepTimeout,
    TerminalStepError,
    WorkflowNotFound,
)
from runstream.settings import Settings
from runstream.worker import Worker

__all__ = [
    "App",
    "Client",
    "CommandNotDelivered",
    "Context",
    "InvalidInput",
    "KafkaUnavailable",
    "NonDeterminismError",
    "PayloadTooLarge",
    "RunCancelled",
    "RunFailed",
    "RunInfo",
    "RunNotFound",
    "RunRejected",
    "RunstreamError",
    "Settings",
    "SignalTimeout",
    "StepError",
    "StepTimeout",
    "TerminalStepError",
    "Worker",
    "WorkflowNotFound",
]
