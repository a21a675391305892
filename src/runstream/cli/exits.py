"""The exit status of every `runstream` command: one table, each code meaning one thing.

0 fine; 1 the answer is "no" (a replay that does not fit, an audit that fails, a run that
ended failed or cancelled, a thing not there yet); 2 a usage error; 3 and up an error the
command could not get past. `runstream exit-codes` prints this table, the CLI reference
(docs/reference/cli.md) shows it, and every command's ``--help`` points at it.
"""

from __future__ import annotations

from runstream.errors import (
    EventNotSet,
    KafkaNotAuthorized,
    KafkaUnavailable,
    RunCancelled,
    RunFailed,
    RunNotFound,
    RunstreamError,
    UpdateFailed,
    WorkflowNotFound,
)
from runstream.supervisor import EXIT_CANNOT_LOAD
from runstream.topics.watchdog import EXIT_ABANDONED, EXIT_FATAL, EXIT_HUNG

OK = 0
NO = 1
USAGE = 2
ERROR = 3
KAFKA_UNREACHABLE = 4
NOT_AUTHORIZED = 5
NOT_FOUND = 6
TIMED_OUT = 7
INTERRUPTED = 130

#: code -> (name, what it means); the long-running processes' own codes come last.
TABLE: dict[int, tuple[str, str]] = {
    OK: ("ok", "Done; the answer is yes."),
    NO: (
        "no",
        "The answer is no: a run that does not fit the code (replay), an audit with "
        "violations, a run that ended failed or cancelled (result, start --wait), an "
        "update the run rejected, an event not set, runs still open after a bulk cancel, "
        "no local broker running (kafka status).",
    ),
    USAGE: ("usage", "The command line is wrong: one line on stderr says what."),
    ERROR: ("error", "Any other error Runstream reports (one line, Type: message)."),
    KAFKA_UNREACHABLE: ("kafka-unreachable", "No Kafka broker answered at the bootstrap."),
    NOT_AUTHORIZED: ("not-authorized", "Kafka refused this principal (its ACLs)."),
    NOT_FOUND: ("not-found", "No such run, workflow or dead letter."),
    TIMED_OUT: ("timed-out", "A --wait ran out before the answer came."),
    EXIT_HUNG: ("hung", "worker: the engine ended itself to restart (a call hung)."),
    EXIT_ABANDONED: ("abandoned", "worker: stopped, abandoning a Kafka call (nothing lost)."),
    EXIT_FATAL: ("kafka-fatal", "worker: Kafka refused the engine for good (fenced)."),
    EXIT_CANNOT_LOAD: ("cannot-load", "worker, sources serve: the App cannot be loaded."),
    INTERRUPTED: ("interrupted", "Stopped by Ctrl-C (SIGINT)."),
}


class NotFound(RunstreamError):
    """Base of the CLI's own "no such thing" errors (exit `NOT_FOUND`)."""


#: Said at the end of every command's --help.
EPILOG = "Exit status: 0 ok, 1 no, 2 usage, 3+ error (see `runstream exit-codes`)."

# First match wins: subclasses before their bases.
_BY_ERROR: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    ((RunFailed, RunCancelled, UpdateFailed, EventNotSet), NO),
    (KafkaUnavailable, KAFKA_UNREACHABLE),
    (KafkaNotAuthorized, NOT_AUTHORIZED),
    ((RunNotFound, WorkflowNotFound, NotFound), NOT_FOUND),
    (TimeoutError, TIMED_OUT),
)


def code_of(error: BaseException) -> int:
    """The exit status for an error a command ended with."""
    for kinds, code in _BY_ERROR:
        if isinstance(error, kinds):
            return code
    return ERROR
