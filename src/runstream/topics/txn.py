"""What a transactional error means, and what the engine does about it: the one place.

librdkafka marks an error fatal, retriable or abortable. That is not enough for exactly
once: a commit (or the offsets sent with it) that timed out or lost its connection may
have reached the coordinator, and without KIP-890 (which librdkafka lacks, its issue
5423) a delayed EndTxn can land on the producer's *next* transaction (KAFKA-17754). So
an error's class also depends on the call that raised it:

- `Action.FATAL`: librdkafka says fatal (fenced by a newer producer, unauthorised), or
  an error that is none of the others. The process ends with a clear line and
  `EXIT_FATAL`; supervised, it starts again.
- `Action.RECREATE`: the outcome is unknown, a timeout or a lost connection during
  ``send_offsets_to_transaction``, ``commit_transaction`` or ``abort_transaction``, or
  any other error of a commit or an abort that is not plainly retriable (librdkafka
  may have sent the EndTxn already). The producer is replaced by a new one with the
  same transactional id, whose ``init_transactions`` waits for the open transaction to
  end and fences anything of it still in flight. Never an abort.
- `Action.ABORT`: a definite abortable error before the commit was sent (from
  ``produce`` or ``send_offsets_to_transaction``), or a record refused in the
  transaction's state (``_STATE``): abort. A producer fenced meanwhile fails the abort,
  fatally.
- `Action.RETRY`: any other retriable error: the same call again.

After an abort or a recreation the consumer is rewound to the group's committed offsets
(KAFKA-17582: after an abort it keeps its position otherwise) and the batch is redone,
unless the recreation finds that the commit landed after all.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

from confluent_kafka import KafkaError, KafkaException

from runstream.errors import KafkaFatal
from runstream.topics.base import TransactionAborted
from runstream.topics.watchdog import DRAIN_GRACE, STOP_GRACE, Watchdog

log = logging.getLogger("runstream.kafka")


class Action(enum.Enum):
    RETRY = "retrying the call"
    RECREATE = "the outcome is unknown: recreating the producer"
    ABORT = "aborting the transaction"
    FATAL = "the producer is unusable"


#: After these a request may or may not have taken effect.
UNKNOWN_OUTCOME = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)
#: The codes of a producer fenced (KIP-447: its epoch is no longer the transactional id's).
FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
_TO_COORDINATOR = ("send_offsets_to_transaction", "commit_transaction", "abort_transaction")
_ENDS = ("commit_transaction", "abort_transaction")


def classify(call: str, err: KafkaError) -> Action:
    """The class of ``err``, raised by the producer's method named ``call``."""
    if err.fatal():
        return Action.FATAL
    if call in _TO_COORDINATOR and err.code() in UNKNOWN_OUTCOME:
        return Action.RECREATE
    if call in _ENDS and not err.retriable():
        return Action.RECREATE
    if err.retriable():
        return Action.RETRY
    if err.txn_requires_abort():
        return Action.ABORT
    if call == "produce" and err.code() == KafkaError._STATE:
        # A record refused in the transaction's state: seen on an engine woken from a
        # freeze longer than its session, cause not pinned down. Abort and redo; a
        # producer fenced meanwhile fails the abort (fatal), one in no state to abort
        # is recreated.
        return Action.ABORT
    return Action.FATAL


#: The journal's evidence of its transactions (`audit.txns`), as Kafka header names.
WRITER, TXN, PARTS, ABORTED = (
    "runstream-writer",
    "runstream-txn",
    "runstream-txn-parts",
    "runstream-aborted",
)


def numbers(raw: bytes) -> list[int]:
    """``b"3,4"`` -> [3, 4]."""
    return [int(n) for n in raw.decode().split(",") if n]


def evidence(
    writer: str, seq: int, parts: Collection[int], aborted: Sequence[int]
) -> list[tuple[str, bytes]]:
    """The headers of each journal record of transaction ``seq`` of ``writer`` (what they
    mean, and what the audit makes of them: `audit.txns`)."""
    out = [
        (WRITER, writer.encode()),
        (TXN, str(seq).encode()),
        (PARTS, ",".join(map(str, sorted(parts))).encode()),
    ]
    if aborted:
        out.append((ABORTED, ",".join(map(str, aborted)).encode()))
    return out


class Transactions:
    """The transactional calls of an engine log, each acting on its error's class.

    A subclass (`topics.kafka.KafkaLog`, and the component tests' in-memory twin) says
    how to abort, recreate the producer, rewind, and tell whether a commit landed.
    """

    watchdog: Watchdog
    aborts = 0
    recreations = 0

    def _abort_call(self) -> None:
        raise NotImplementedError

    def _recreate(self) -> None:
        """Replace the producer by one with the same transactional id, initialised."""
        raise NotImplementedError

    def _rewind(self) -> None:
        """Seek the consumer to the group's committed offsets."""
        raise NotImplementedError

    def _landed(self) -> bool:
        """After a recreation: whether the transaction whose commit was unknown committed."""
        raise NotImplementedError

    def _not_committed(self) -> None:
        """The open transaction ended without committing (to be named aborted)."""

    def _transact(self, what: str, call: Callable[[], object], limit: float = 45.0) -> None:
        """``call`` (the producer's ``what``), again while it is retriable; on any other
        error act on its class. Past ``limit`` seconds of retries the watchdog ends the
        process.

        Raises:
            TransactionAborted: the transaction was ended (aborted, or its producer
                recreated) and did not commit; the consumer is rewound: redo the batch.
            KafkaFatal: the producer is unusable (the process ends first when it may).
        """
        failed = self._attempt(what, call, limit, DRAIN_GRACE)
        if failed is not None:
            self._act(what, *failed)

    def _attempt(
        self, what: str, call: Callable[[], object], limit: float, grace: float = STOP_GRACE
    ) -> tuple[Action, KafkaError] | None:
        with self.watchdog.watch(what, limit, grace):
            while True:
                try:
                    call()
                    return None
                except KafkaException as exc:
                    err = exc.args[0]
                action = classify(what, err)
                if action is not Action.RETRY:
                    return action, err
                log.warning("%s: %s; %s", what, err, action.value)
                time.sleep(0.1)

    def _must(self, what: str, call: Callable[[], object], limit: float = 45.0) -> None:
        """A call outside a transaction's outcome (init, begin): retried, else fatal."""
        failed = self._attempt(what, call, limit)
        if failed is not None:
            self._fatal(what, failed[1])

    def _act(self, what: str, action: Action, err: KafkaError) -> None:
        if action is Action.FATAL:
            self._fatal(what, err)
        log.warning("%s: %s; %s", what, err, action.value)
        if action is Action.ABORT:
            self.aborts += 1
            self._transact("abort_transaction", self._abort_call)
        else:
            self.recreations += 1
            self._recreate()
            if what == "commit_transaction" and self._landed():
                log.warning("%s: the transaction committed after all", what)
                return
        self._not_committed()
        self._rewind()
        raise TransactionAborted(f"{what}: {err}")

    def _fatal(self, what: str, err: KafkaError) -> NoReturn:
        message = f"{what}: {err}: the transactional producer is unusable"
        if err.code() in FENCED:  # librdkafka's wording does not say so
            message = (
                f"{what}: fenced: a newer producer has this instance's transactional id, or "
                f"the broker ended its transaction (a timeout): its partitions have another "
                f"owner ({err}); the transactional producer is unusable"
            )
        self.watchdog.fatal(message)  # ends the process unless exit_on_hang is off
        raise KafkaFatal(message)
