"""Each class of transactional error, injected into the in-memory log, and what the
engine does about it (`runstream.topics.txn`): retry the call, abort and redo, recreate
the producer (never abort) when a commit's outcome is unknown, or end for good.

The error policy under test is the engine's own (`MemoryLog` runs its calls through it);
whatever a real broker does is tested in ``tests/kafka/test_txn_recovery.py``.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from confluent_kafka import KafkaError

from runstream.audit import check_run
from runstream.errors import KafkaFatal

from .memlog import ABORTABLE, FATAL, RETRIABLE, TIMED_OUT, Cluster
from .test_worker import Rig, ended, facts, make_app, start

RUNS = 6


@pytest.fixture
def ns() -> str:
    return "mem"


def run_all(rig: Rig, cluster: Cluster, ns: str, bodies: Counter[str]) -> None:
    """Every run ends with its right output, each step body ran once, each history is
    whole and has no fact twice."""
    rig.until(lambda: len(ended(cluster, ns)) == RUNS)
    assert ended(cluster, ns) == {f"r{i}": i * 10 + 3 for i in range(RUNS)}
    assert set(bodies.values()) == {1} and len(bodies) == 3 * RUNS
    for i in range(RUNS):
        assert check_run(facts(cluster, ns, f"r{i}"), expect_finished=True) == []


def rig_with_starts(tmp_path, ns: str) -> tuple[Rig, Cluster, Counter[str]]:
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path, chain_budget=0)
    rig.log.assign([0, 1, 2, 3])
    for i in range(RUNS):
        start(cluster, ns, f"r{i}", "three", i * 10)
    rig.turn()  # the assignment: the next turn's batch takes the starts
    return rig, cluster, bodies


def test_a_retriable_error_retries_the_same_call(tmp_path, ns):
    rig, cluster, bodies = rig_with_starts(tmp_path, ns)
    rig.log.fail("commit_transaction", RETRIABLE)
    rig.turn()
    calls = rig.log.calls
    assert calls[calls.index("commit_transaction") + 1] == "commit_transaction"
    assert rig.log.aborts == rig.log.recreations == 0
    assert {f.run_id for f in facts(cluster, ns)} == {f"r{i}" for i in range(RUNS)}
    run_all(rig, cluster, ns, bodies)
    rig.close()


@pytest.mark.parametrize("call", ["produce", "send_offsets_to_transaction"])
def test_an_abortable_error_before_the_commit_aborts_rewinds_and_redoes_the_batch(
    tmp_path, ns, call
):
    rig, cluster, bodies = rig_with_starts(tmp_path, ns)
    rig.log.fail(call, ABORTABLE)
    rig.turn()
    assert rig.log.aborts == 1 and rig.log.recreations == 0
    assert "abort_transaction" in rig.log.calls and "init_transactions" not in rig.log.calls
    assert not facts(cluster, ns)  # nothing of the aborted batch is visible
    run_all(rig, cluster, ns, bodies)
    rig.close()


def test_a_record_refused_in_the_transactions_state_aborts_and_redoes_the_batch(tmp_path, ns):
    """librdkafka refused a record (``_STATE``) to an engine woken from a freeze (seen in
    the CI's frozen-instance test): it ended the instance, where an abort and a redo do
    (a fenced producer then fails the abort, and ends it as fenced)."""
    rig, cluster, bodies = rig_with_starts(tmp_path, ns)
    rig.log.fail("produce", KafkaError(KafkaError._STATE))
    rig.turn()
    assert rig.log.aborts == 1 and rig.log.recreations == 0
    assert not facts(cluster, ns)
    run_all(rig, cluster, ns, bodies)
    rig.close()


def test_a_commit_timeout_recreates_the_producer_and_never_aborts(tmp_path, ns):
    rig, cluster, bodies = rig_with_starts(tmp_path, ns)
    rig.log.fail("commit_transaction", TIMED_OUT)
    rig.turn()
    assert rig.log.recreations == 1 and rig.log.aborts == 0
    assert "abort_transaction" not in rig.log.calls
    calls = rig.log.calls
    assert calls[calls.index("commit_transaction") + 1] == "init_transactions"
    assert not facts(cluster, ns) and not cluster.committed  # it did not commit: redone
    run_all(rig, cluster, ns, bodies)
    rig.close()


def test_a_commit_timeout_whose_commit_landed_is_not_redone(tmp_path, ns):
    """The coordinator committed, the answer was lost: after the recreation the batch
    counts as committed, and nothing of it is written twice."""
    rig, cluster, bodies = rig_with_starts(tmp_path, ns)
    rig.log.fail("commit_transaction", TIMED_OUT, landed=True)
    rig.turn()
    assert rig.log.recreations == 1 and rig.log.aborts == 0
    assert "abort_transaction" not in rig.log.calls
    started = [f.run_id for f in facts(cluster, ns) if type(f).__name__ == "RunStarted"]
    assert sorted(started) == [f"r{i}" for i in range(RUNS)]
    run_all(rig, cluster, ns, bodies)
    rig.close()


@pytest.mark.parametrize(
    ("call", "err"),
    [
        ("send_offsets_to_transaction", TIMED_OUT),
        ("send_offsets_to_transaction", KafkaError(KafkaError._TRANSPORT, retriable=True)),
        # librdkafka can fail a commit as abortable after its EndTxn was sent
        ("commit_transaction", ABORTABLE),
    ],
)
def test_an_error_whose_outcome_is_unknown_recreates_the_producer(tmp_path, ns, call, err):
    rig, cluster, bodies = rig_with_starts(tmp_path, ns)
    rig.log.fail(call, err)
    rig.turn()
    assert rig.log.recreations == 1 and rig.log.aborts == 0
    assert "abort_transaction" not in rig.log.calls
    run_all(rig, cluster, ns, bodies)
    rig.close()


def test_an_abort_that_times_out_recreates_the_producer(tmp_path, ns):
    rig, cluster, bodies = rig_with_starts(tmp_path, ns)
    rig.log.fail("send_offsets_to_transaction", ABORTABLE)
    rig.log.fail("abort_transaction", TIMED_OUT)
    rig.turn()
    assert rig.log.aborts == 1 and rig.log.recreations == 1
    assert rig.log.calls.count("abort_transaction") == 1  # not called again
    assert not facts(cluster, ns)
    run_all(rig, cluster, ns, bodies)
    rig.close()


@pytest.mark.parametrize("call", ["send_offsets_to_transaction", "commit_transaction"])
def test_a_fenced_producer_says_it_was_fenced(tmp_path, ns, call, caplog):
    """An operator (and the crash tests) read "fenced" in the log, whatever wording
    librdkafka gives the fencing error ("Producer attempted an operation with an old
    epoch")."""
    rig, _, _ = rig_with_starts(tmp_path, ns)
    rig.log.fail(call, FATAL)
    with caplog.at_level(logging.CRITICAL), pytest.raises(KafkaFatal, match="fenced"):
        rig.turn()
    assert f"{call}: fenced: " in caplog.text
    rig.close()


@pytest.mark.parametrize("call", ["begin_transaction", "produce", "commit_transaction"])
def test_a_fatal_error_ends_the_instance_with_nothing_of_the_batch_visible(
    tmp_path, ns, call, caplog
):
    rig, cluster, _ = rig_with_starts(tmp_path, ns)
    rig.log.fail(call, FATAL)
    with caplog.at_level(logging.CRITICAL), pytest.raises(KafkaFatal, match=call):
        rig.turn()
    assert "the transactional producer is unusable" in caplog.text
    assert rig.log.aborts == rig.log.recreations == 0
    assert not facts(cluster, ns) and not cluster.committed
    rig.close()
