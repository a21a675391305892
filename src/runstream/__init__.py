"""Runstream: durable Python workflows whose only database is Apache Kafka."""

from runstream.app import App
from runstream.client import Client, RunInfo
from runstream.engine.replay import Context
from runstream.errors import (
    CommandNotDelivered,
    InvalidInput,
    NonDeterminismError,
    RunCancelled,
    RunFailed,
    RunNotFound,
    RunstreamError,
    SignalTimeout,
    StepError,
    TerminalStepError,
    WorkflowNotFound,
)
from runstream.worker import Worker, WorkerSettings

__all__ = [
    "App",
    "Client",
    "CommandNotDelivered",
    "Context",
    "InvalidInput",
    "NonDeterminismError",
    "RunCancelled",
    "RunFailed",
    "RunInfo",
    "RunNotFound",
    "RunstreamError",
    "SignalTimeout",
    "StepError",
    "TerminalStepError",
    "Worker",
    "WorkerSettings",
    "WorkflowNotFound",
]
