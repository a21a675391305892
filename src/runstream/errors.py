"""Every error Runstream raises on purpose (all exported by ``runstream``).

RunstreamError
 ├─ ConfigError              bad settings, missing Java/Maven, a port taken
 ├─ KafkaSetupError          the local broker did not start (log tail inside)
 ├─ TopicError               topics missing or not co-partitioned
 ├─ SchemaError              cannot encode a record
 │   └─ DecodeError          garbage, truncated record, unknown fingerprint (.kind says which)
 ├─ WorkflowNotFound         no workflow of that name (or version) is registered
 ├─ InvalidInput             a workflow input failed its pydantic model
 ├─ NonDeterminismError      workflow code no longer fits the run's history
 ├─ RunNotFound
 ├─ KafkaUnavailable         no broker answered at the bootstrap address in time
 ├─ KafkaFatal               Kafka refused the instance for good (fenced, misconfigured)
 ├─ KafkaNotAuthorized       the principal lacks the ACLs of its role for the namespace
 ├─ CommandNotDelivered      Kafka refused a command the client produced
 ├─ PayloadTooLarge          a command larger than Kafka takes
 ├─ BlobUnavailable          a large payload's reference names no (or corrupt) bytes
 ├─ RunFailed                client.result() of a failed or dead run (.code says why)
 │   ├─ RunTimedOut          ... that passed its execution timeout (code "timed-out")
 │   ├─ QueueFull            ... refused by its concurrency key's max_queued ("queue-full")
 │   └─ HistoryTooLarge      ... whose history reached its cap ("history-too-large")
 ├─ RunCancelled             client.result() of a cancelled run
 ├─ RunRejected              client.result() of a start the engine refused
 ├─ ChildFailed              in a parent workflow: its child did not complete
 ├─ PromiseRejected          in a workflow: the promise it awaits was rejected
 ├─ QueryFailed              client.query(): no such handler, or the handler raised
 ├─ UpdateFailed             client.update(): rejected, or its handler failed (.code)
 └─ StepError                a step failed for good (raised inside workflow code)
     └─ TerminalStepError    raise it from a step: fail at once, no retry

SignalTimeout(RunstreamError, TimeoutError)  wait_for_signal(timeout=...) expired
EventTimeout(RunstreamError, TimeoutError)   wait_for_event(timeout=...) expired
PromiseTimeout(RunstreamError, TimeoutError) ctx.promise(timeout=...) expired uncompleted
StepTimeout(RunstreamError, TimeoutError)    a step attempt ran past its timeout
OwnerUnavailable(RunstreamError, TimeoutError) client.query(): no engine answered in time
QueryTimeout(QueryFailed, TimeoutError)      ctx.entity(...).read(timeout=...) unanswered
EventRefused(RunstreamError, ValueError)     ctx.set_event past its caps (value size, keys)
EventNotSet(RunstreamError, LookupError)     get_event(wait=...): the run ended without it
"""

from __future__ import annotations


class RunstreamError(Exception):
    """Base of every error raised by Runstream."""


class ConfigError(RunstreamError):
    """Settings or the environment are not usable."""


class KafkaSetupError(RunstreamError):
    """The local Kafka broker could not be set up or started."""


class TopicError(RunstreamError):
    """A namespace's topics are missing or inconsistent."""


class SchemaError(RunstreamError):
    """A record cannot be encoded with its Avro schema."""


class DecodeError(SchemaError):
    """Bytes that are not a record we can read.

    ``kind`` is one of ``"not-single-object"`` (wrong magic, garbage),
    ``"truncated"``, ``"unknown-fingerprint"`` or ``"corrupt"`` (the body does not
    match its schema).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class WorkflowNotFound(RunstreamError):
    """No workflow (or no such version of it) is registered."""


class InvalidInput(RunstreamError):
    """A workflow's input does not validate against its declared type."""


class NonDeterminismError(RunstreamError):
    """The workflow code asks for something other than what the run's history recorded."""

    def __init__(self, run_id: str, seq: int, expected: str, found: str) -> None:
        super().__init__(
            f"run {run_id!r} at sequence {seq}: the history has {expected!r}, "
            f"the code now asks for {found!r}"
        )
        self.run_id, self.seq, self.expected, self.found = run_id, seq, expected, found


class RunNotFound(RunstreamError):
    """No run with that id exists."""


class KafkaUnavailable(RunstreamError):
    """No Kafka broker answered at the bootstrap address within the connect timeout."""

    def __init__(self, bootstrap: str, tried: str, cause: str = "") -> None:
        because = f" ({cause})" if cause else ""
        super().__init__(
            f"cannot reach Kafka at {bootstrap}: {tried}{because}. Check that a broker runs "
            "there (`runstream kafka status` for a local one), the address, and the TLS/SASL "
            "settings"
        )
        self.bootstrap, self.tried, self.cause = bootstrap, tried, cause


class KafkaNotAuthorized(RunstreamError):
    """Kafka knows this principal but its ACLs do not let it at the namespace's topics.
    Waiting does not help: the process ends, saying which principal and topic."""

    def __init__(self, bootstrap: str, principal: str, what: str, cause: str) -> None:
        super().__init__(
            f"Kafka at {bootstrap} refused {principal} access to {what} ({cause}); grant "
            "it the ACLs of its role (docs/guides/security.md: ACLs per role)"
        )
        self.bootstrap, self.principal, self.what = bootstrap, principal, what


class KafkaFatal(RunstreamError):
    """Kafka refused this client for good (e.g. a newer instance with the same id fenced
    it); the process should end and, supervised, start again."""


class CommandNotDelivered(RunstreamError):
    """Kafka did not take a command (start, signal, cancel) the client produced."""


class PayloadTooLarge(RunstreamError):
    """A command (its input or payload) is larger than Kafka takes; nothing was sent."""


class BlobUnavailable(RunstreamError):
    """A large payload's reference names bytes the blobs topic does not hold (missing,
    corrupt, or not found in time): docs/guides/large-payloads.md."""


class RunFailed(RunstreamError):
    """The run ended failed (or dead); ``error`` holds the workflow's error text and
    ``code`` why it failed (a `Failure` code; None for a failure recorded before
    codes existed that its text does not tell)."""

    def __init__(
        self, run_id: str, error: str, status: str = "failed", code: str | None = None
    ) -> None:
        super().__init__(f"run {run_id!r} {status}: {error}")
        self.run_id, self.error, self.status, self.code = run_id, error, status, code


class RunTimedOut(RunFailed):
    """The run failed because it passed its execution timeout (``timeout=``)."""


class QueueFull(RunFailed):
    """The run was refused before running any code: ``max_queued`` runs of its
    ``concurrency_key`` were waiting already."""


class HistoryTooLarge(RunFailed):
    """The run's history reached its cap (``Settings.history_max_events`` or
    ``history_max_bytes``): a long loop should continue as new every few thousand steps."""


class Failure:
    """Why a run failed, a stable code: ``RunFailed.code`` on the journal fact and on the
    exception `Client.result` raises (which it picks the class by), and `RunInfo.code`."""

    WORKFLOW_ERROR = "workflow-error"  # the workflow raised (a step that failed for good too)
    TIMED_OUT = "timed-out"  # it passed its execution timeout: RunTimedOut
    QUEUE_FULL = "queue-full"  # its concurrency key had max_queued runs waiting: QueueFull
    BAD_OUTPUT = "bad-output"  # its output (or continue-as-new input): not JSON, or too large
    DEAD = "dead"  # it crashed its instance past max_recovery_attempts (status dead)
    HISTORY_TOO_LARGE = "history-too-large"  # its history reached its cap: HistoryTooLarge
    BLOB_BUDGET = "blob-budget"  # its large payloads passed Settings.blob_budget_bytes


_FAILED_BY_CODE: dict[str, type[RunFailed]] = {
    Failure.TIMED_OUT: RunTimedOut,
    Failure.QUEUE_FULL: QueueFull,
    Failure.HISTORY_TOO_LARGE: HistoryTooLarge,
}

#: How the engine starts the error text of a run that timed out.
TIMED_OUT = "RunTimedOut: "
#: ... of a run its concurrency key refused.
QUEUE_FULL = "QueueFull: "
#: ... of a run whose history reached its cap.
HISTORY_TOO_LARGE = "HistoryTooLarge: "
#: ... of a run whose large payloads passed its budget.
BLOB_BUDGET = "BlobBudgetExceeded: "
#: ... and of a step attempt that timed out (`StepTimeout`).
STEP_TIMED_OUT = "StepTimeout: "


def failure_code(error: str, status: str = "failed") -> str | None:
    """The code of a failure recorded without one (before codes existed), from its
    status and the text the engine began it with; None when they do not tell."""
    if status == "dead":
        return Failure.DEAD
    if error.startswith(TIMED_OUT):
        return Failure.TIMED_OUT
    return Failure.QUEUE_FULL if error.startswith(QUEUE_FULL) else None


def run_failed(
    run_id: str, error: str, status: str = "failed", code: str | None = None
) -> RunFailed:
    """The exception for a run that ended failed or dead, its class chosen by ``code``
    (`RunTimedOut`, `QueueFull`, else `RunFailed`)."""
    code = code or failure_code(error, status)
    return _FAILED_BY_CODE.get(code or "", RunFailed)(run_id, error, status, code)


class EventTimeout(RunstreamError, TimeoutError):
    """Raised in a workflow by ``ctx.wait_for_event`` when its timeout passes first."""


class ChildFailed(RunstreamError):
    """Raised in a parent workflow by ``ctx.child`` (or ``ctx.start_child``) when the child
    run did not complete: it failed, was cancelled, died, or could not start."""

    def __init__(self, child_run_id: str, status: str, error: str) -> None:
        super().__init__(f"child run {child_run_id!r} {status}: {error}")
        self.child_run_id, self.status, self.error = child_run_id, status, error


class PromiseRejected(RunstreamError):
    """The promise a workflow awaits was rejected (`Client.reject`); ``message`` is the
    rejecter's."""

    def __init__(self, promise_id: str, message: str) -> None:
        super().__init__(f"promise {promise_id!r} was rejected: {message}")
        self.promise_id, self.message = promise_id, message


class PromiseTimeout(RunstreamError, TimeoutError):
    """The promise a workflow awaits reached its ``timeout`` before anyone completed it."""

    def __init__(self, promise_id: str, message: str) -> None:
        super().__init__(message)
        self.promise_id = promise_id


class UpdateFailed(RunstreamError):
    """`Client.update` of an update the run rejected (``rejected``: its validator raised,
    no such handler, the run had ended, a cap; nothing was recorded) or whose handler
    failed, or whose run ended while it ran. ``code`` is the stable reason
    (``runstream.schemas.records.UpdateCode``), ``message`` the explanation."""

    def __init__(self, run_id: str, update_id: str, code: str, message: str, rejected: bool):
        what = "was rejected" if rejected else "failed"
        super().__init__(f"update {update_id!r} of run {run_id!r} {what} ({code}): {message}")
        self.run_id, self.update_id, self.code, self.message = run_id, update_id, code, message
        self.rejected = rejected


class RunCancelled(RunstreamError):
    """The run was cancelled."""

    def __init__(self, run_id: str, reason: str = "") -> None:
        super().__init__(f"run {run_id!r} cancelled" + (f": {reason}" if reason else ""))
        self.run_id, self.reason = run_id, reason


class RunRejected(RunstreamError):
    """The engine refused to start the run (unknown workflow, invalid or oversize input).
    ``code`` is the stable reason code, ``reason`` the explanation."""

    def __init__(self, run_id: str, code: str, reason: str) -> None:
        super().__init__(f"run {run_id!r} was rejected ({code}): {reason}")
        self.run_id, self.code, self.reason = run_id, code, reason


class StepError(RunstreamError):
    """A step failed after its retries; raised inside the workflow at the step's await."""

    def __init__(self, step: str, error: str) -> None:
        super().__init__(f"step {step!r} failed: {error}")
        self.step, self.error = step, error


class TerminalStepError(StepError):
    """Raise from a step body to fail it at once, without retries."""

    def __init__(self, message: str) -> None:
        RunstreamError.__init__(self, message)
        self.step, self.error = "", message


class SignalTimeout(RunstreamError, TimeoutError):
    """``wait_for_signal`` reached its timeout before a signal arrived."""


class StepTimeout(RunstreamError, TimeoutError):
    """A step attempt ran longer than its ``timeout``; it is retried by its policy."""


# -- queries (issue 21 item 2) -----------------------------------------------------------


class EventRefused(RunstreamError, ValueError):
    """Raised in a workflow by ``ctx.set_event`` past its caps: a value larger than
    `Limits.event_value`, or a new key past `Limits.event_keys` keys in the run."""


class EventNotSet(RunstreamError, LookupError):
    """``client.get_event(..., wait=...)``: the run ended (and nothing carries it on)
    without setting the key."""


class QueryFailed(RunstreamError):
    """``client.query``: the run has no such query handler (yet), or the handler raised;
    the message says which."""


class QueryTimeout(QueryFailed, TimeoutError):
    """A workflow's ``ctx.entity(...).read(..., timeout=...)``: no answer by its timeout
    (the key's partition had no owner that long, say). A later answer is dropped."""


class OwnerUnavailable(RunstreamError, TimeoutError):
    """``client.query``: no engine instance answered within the timeout (none runs, or
    the run's partition is between owners)."""
