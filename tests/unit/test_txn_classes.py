"""Which class each transactional error falls in (`runstream.topics.txn.classify`),
for real librdkafka error values, call by call."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from runstream.topics.txn import Action, classify

TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, retriable=True)
TRANSPORT = KafkaError(KafkaError._TRANSPORT)
CONCURRENT = KafkaError(KafkaError.CONCURRENT_TRANSACTIONS, retriable=True)
ABORTABLE = KafkaError(KafkaError.ILLEGAL_GENERATION, txn_requires_abort=True)
FENCED = KafkaError(KafkaError._FENCED, fatal=True)
STATE = KafkaError(KafkaError._STATE)  # none of the flags


@pytest.mark.parametrize(
    ("call", "err", "action"),
    [
        # fatal, whatever the call
        ("commit_transaction", FENCED, Action.FATAL),
        ("produce", FENCED, Action.FATAL),
        ("begin_transaction", STATE, Action.FATAL),
        ("send_offsets_to_transaction", STATE, Action.FATAL),
        # the outcome is unknown: a timeout or a lost connection towards the coordinator
        ("commit_transaction", TIMED_OUT, Action.RECREATE),
        ("send_offsets_to_transaction", TIMED_OUT, Action.RECREATE),
        ("abort_transaction", TIMED_OUT, Action.RECREATE),
        ("commit_transaction", TRANSPORT, Action.RECREATE),
        # a commit or an abort that fails otherwise: librdkafka may have sent the EndTxn
        ("commit_transaction", ABORTABLE, Action.RECREATE),
        ("abort_transaction", STATE, Action.RECREATE),
        # abortable before the commit was sent
        ("send_offsets_to_transaction", ABORTABLE, Action.ABORT),
        ("produce", ABORTABLE, Action.ABORT),
        # a record refused in the transaction's state (librdkafka's _STATE, seen on an
        # engine woken from a freeze): abort; a fenced producer fails the abort
        ("produce", STATE, Action.ABORT),
        # retriable, with a known outcome
        ("commit_transaction", CONCURRENT, Action.RETRY),
        ("send_offsets_to_transaction", CONCURRENT, Action.RETRY),
        ("begin_transaction", CONCURRENT, Action.RETRY),
        ("init_transactions", TIMED_OUT, Action.RETRY),  # init may always be called again
    ],
)
def test_each_error_falls_in_its_class(call, err, action):
    assert classify(call, err) is action
