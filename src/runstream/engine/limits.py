"""Record sizes, checked where decisions are made, before Kafka sees a record.

Kafka refuses a record larger than the topic's ``max.message.bytes`` (and librdkafka one
larger than the producer's ``message.max.bytes``); inside a transaction that refusal
would abort every batch that carries it. So the core never produces one: each payload
a user controls (a workflow input, a signal, a step or run output, a reply) must fit in
`Limits.payload`, the largest record less a fixed allowance for the envelope, and every
free text that goes with it (errors, tracebacks, reasons) is clipped to `Limits.text`,
and made encodable (`clean`): Avro strings are UTF-8, which has no lone surrogates.
Interceptors' headers ride some records beside the payload (`headers_bytes`); whatever
else a decision makes, the decider checks against `Limits.record` once it is encoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Bytes of each record kept for everything but the payload: ids, names, clipped texts.
ENVELOPE = 64 * 1024
#: librdkafka's default ``message.max.bytes``; brokers default to a little more.
DEFAULT_MAX_RECORD = 1_000_000
#: Bytes of each record kept beside its encoded value: its key, the journal's evidence
#: headers (`topics.txn`) and Kafka's own framing.
FRAMING = 4 * 1024


def headers_bytes(headers: Mapping[str, str]) -> int:
    """What interceptor headers add to a record's ``headers`` field: their UTF-8 bytes."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in headers.items())


@dataclass(frozen=True, slots=True)
class Limits:
    """The size limits of one namespace (docs/reference/limits.md)."""

    max_record: int = DEFAULT_MAX_RECORD  # the largest record every topic and producer take
    text: int = 8 * 1024  # error, traceback and reason texts are clipped to this many chars
    # A run's history: past the warning the lifecycle stream says so, at the cap the run
    # fails (every activation replays the whole history: a long loop continues as new).
    history_events_warn: int = 10_000
    history_events_max: int = 50_000
    history_bytes_warn: int = 10 * 1024 * 1024
    history_bytes_max: int = 50 * 1024 * 1024
    # ctx.set_event: the largest value (JSON bytes; never above `payload`), and how many
    # distinct keys one run may set (the runs read model keeps each).
    event_value: int = 64 * 1024
    event_keys: int = 100
    # Validated updates of one run: open at once, and in one history (`rules.updates`).
    updates_in_flight: int = 10
    updates_per_history: int = 2000
    # Large payloads (`engine.blobs`): above this many bytes a payload goes to the blobs
    # topic in chunks and its record carries a reference; a run's blobs may total at most
    # `blob_budget` bytes (past it the run fails, code blob-budget). 0: no blobs.
    blob_threshold: int = 256 * 1024
    blob_budget: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_record <= 2 * ENVELOPE:
            raise ValueError(f"max_record must exceed {2 * ENVELOPE} bytes, not {self.max_record}")

    @property
    def record(self) -> int:
        """The largest encoded value of a record the core produces."""
        return self.max_record - FRAMING

    @property
    def payload(self) -> int:
        """The largest user payload (or inbound command) in bytes."""
        return self.max_record - ENVELOPE

    def big(self, size: int) -> bool:
        """A payload of ``size`` bytes travels as a blob (`engine.blobs`)."""
        return self.blob_threshold > 0 and size > min(self.blob_threshold, self.payload)

    def clip(self, text: str) -> str:
        """``text`` cut to `text` characters, saying how much was cut, and `clean`."""
        text = clean(text)
        if len(text) <= self.text:
            return text
        cut = len(text) - self.text
        return f"{text[: self.text]}... [{cut} more characters cut]"

    def too_large(self, what: str, size: int) -> str | None:
        """Why a payload of ``size`` bytes cannot be recorded, or None if it can."""
        if size <= self.payload:
            return None
        return (
            f"{what} is {size:,} bytes; the limit is {self.payload:,} "
            f"(the largest Kafka record, {self.max_record:,}, less {ENVELOPE:,} for the envelope)"
        )

    def history_over(self, events: int, size: int, warn: bool = False) -> str | None:
        """Which of the history's caps (its warnings with ``warn``) ``events`` facts of
        ``size`` payload bytes reach, said for a person; None when neither."""
        most_events = self.history_events_warn if warn else self.history_events_max
        most_bytes = self.history_bytes_warn if warn else self.history_bytes_max
        if events >= most_events:
            return f"{events:,} events (the {'warning' if warn else 'cap'} is {most_events:,})"
        if size >= most_bytes:
            return f"{size:,} payload bytes (the {'warning' if warn else 'cap'} is {most_bytes:,})"
        return None


def clean(text: str) -> str:
    """``text`` as UTF-8 can carry it: lone surrogates (half an emoji cut by a client, a
    ``"\\ud83d"`` JSON escape) become U+FFFD, and a pair of halves becomes its character."""
    if text.isascii():  # the common case, and a few times cheaper than a trial encode
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
