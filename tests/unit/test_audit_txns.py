"""The audit of the journal's transaction evidence (`runstream.audit.txns`), pure."""

from __future__ import annotations

from runstream.audit.txns import TxnLedger
from runstream.topics.txn import evidence


def ledger(*records: tuple[int, int, str, int, list[int], list[int]]) -> TxnLedger:
    """Records as (partition, offset, writer, seq, parts, aborted)."""
    out = TxnLedger()
    for p, offset, writer, seq, parts, aborted in records:
        out.add(b"run-1", p, offset, evidence(writer, seq, parts, aborted))
    return out


def messages(led: TxnLedger) -> list[str]:
    return [v.message for v in led.violations()]


def test_consecutive_transactions_and_one_named_aborted_are_clean():
    led = ledger(
        (0, 0, "w.a", 1, [0, 1], []),
        (1, 0, "w.a", 1, [0, 1], []),
        (0, 3, "w.a", 3, [0], [2]),  # 2 ended uncommitted: invisible, named by 3
        (0, 5, "w.b", 1, [0], []),  # another life of the instance starts again at 1
    )
    assert messages(led) == []
    assert (led.committed, led.named_aborted) == (3, 1)


def test_a_visible_transaction_named_aborted_is_reported():
    led = ledger((0, 0, "w.a", 1, [0], []), (0, 2, "w.a", 2, [0], []), (0, 4, "w.a", 3, [0], [2]))
    assert messages(led) == [
        "transaction 2 of writer w.a is visible, but transaction records at p0@4 name it aborted"
    ]


def test_a_transaction_visible_on_one_partition_only_is_torn():
    led = ledger((0, 0, "w.a", 1, [0, 2], []), (0, 2, "w.a", 2, [0], []))
    assert messages(led) == [
        "transaction 1 of writer w.a is torn: visible on partitions [0], not on [2] which it "
        "wrote to"
    ]


def test_a_transaction_neither_visible_nor_named_aborted_is_lost():
    led = ledger((0, 0, "w.a", 1, [0], []), (0, 2, "w.a", 3, [0], []))
    assert messages(led) == [
        "transactions [2] of writer w.a are neither visible nor named aborted, though its "
        "transaction 3 is visible: commits lost"
    ]


def test_a_sequence_number_visible_again_after_a_later_one_is_used_twice():
    led = ledger((0, 0, "w.a", 1, [0], []), (0, 2, "w.a", 2, [0], []), (0, 4, "w.a", 1, [0], []))
    assert messages(led) == [
        "transaction 1 of writer w.a is visible again after transaction 2: a sequence number "
        "used twice"
    ]


def test_records_without_the_evidence_are_not_checked():
    led = TxnLedger()
    led.add(b"run-1", 0, 0, ())
    led.add(b"run-1", 0, 1, (("other", b"x"),))
    assert led.violations() == [] and led.committed == 0
