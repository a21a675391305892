"""The journal's evidence of its transactions (pure: no Kafka).

Every journal record an engine writes carries, in Kafka headers (`topics.txn.evidence`):

- ``runstream-writer``: the writing producer's life, ``<instance id>.<token>`` (a new
  token each time an instance starts);
- ``runstream-txn``: the transaction's sequence number in that life, 1, 2, 3... given
  only to transactions that write to the journal;
- ``runstream-txn-parts``: the journal partitions the transaction writes to;
- ``runstream-aborted``: the sequence numbers of the writer's transactions that ended
  without committing since its previous committed one (absent when none).

So every sequence number below a writer's last visible one is either visible or named
aborted by a later one. From that, three checks:

- a transaction named aborted has no visible record (else an abort was undone, or a
  delayed EndTxn committed what the engine had given up: KAFKA-17754);
- a visible transaction is visible on every partition it wrote to (else it is torn);
- no sequence number is visible again after a later one on a partition (used twice), or
  missing (neither visible nor named aborted: a commit the engine counted on was lost).

The last transactions of a writer's life cannot be told: one that ended uncommitted just
before a crash is named by no later one, and is invisible, as it should be.
Records without these headers (journals written before them) are not checked.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from runstream.audit.rules import Violation
from runstream.topics.txn import ABORTED, PARTS, TXN, WRITER, numbers


@dataclass
class _Txn:
    parts: frozenset[int]
    key: str  # the run of its first record, to name it by
    seen: dict[int, int] = field(default_factory=dict)  # partition -> its first offset there


@dataclass
class TxnLedger:
    """Fed every journal record (`add`), then asked for its `violations`."""

    txns: dict[tuple[str, int], _Txn] = field(default_factory=dict)
    # writer -> aborted seq -> where it was said so (partition, offset)
    aborted: defaultdict[str, dict[int, tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    _last: dict[tuple[str, int], int] = field(default_factory=dict)  # (writer, p) -> seq
    _twice: list[Violation] = field(default_factory=list)

    def add(
        self, key: bytes | None, partition: int, offset: int, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        h = dict(headers)
        if WRITER not in h or TXN not in h:
            return
        writer, seq = h[WRITER].decode(), int(h[TXN])
        run = (key or b"").decode(errors="replace")
        txn = self.txns.get((writer, seq))
        if txn is None:
            txn = self.txns[writer, seq] = _Txn(frozenset(numbers(h.get(PARTS, b""))), run)
            for n in numbers(h.get(ABORTED, b"")):
                self.aborted[writer].setdefault(n, (partition, offset))
        last = self._last.get((writer, partition))
        if last is not None and seq < last:
            self._twice.append(
                Violation(
                    run,
                    partition,
                    (offset,),
                    f"transaction {seq} of writer {writer} is visible again after "
                    f"transaction {last}: a sequence number used twice",
                )
            )
        self._last[writer, partition] = max(seq, last or 0)
        txn.seen.setdefault(partition, offset)

    @property
    def committed(self) -> int:
        """Transactions with a visible record."""
        return len(self.txns)

    @property
    def named_aborted(self) -> int:
        return sum(len(seqs) for seqs in self.aborted.values())

    def violations(self) -> list[Violation]:
        out = list(self._twice)
        last: dict[str, int] = {}
        for (writer, seq), txn in sorted(self.txns.items()):
            last[writer] = max(seq, last.get(writer, 0))
            p = min(txn.seen)
            at = (txn.seen[p],)
            said = self.aborted[writer].get(seq)
            if said is not None:
                out.append(
                    Violation(
                        txn.key,
                        p,
                        at,
                        f"transaction {seq} of writer {writer} is visible, but transaction "
                        f"records at p{said[0]}@{said[1]} name it aborted",
                    )
                )
            missing = sorted(txn.parts - txn.seen.keys())
            if missing:
                out.append(
                    Violation(
                        txn.key,
                        p,
                        at,
                        f"transaction {seq} of writer {writer} is torn: visible on partitions "
                        f"{sorted(txn.seen)}, not on {missing} which it wrote to",
                    )
                )
        for writer, top in sorted(last.items()):
            gone = [
                s
                for s in range(1, top)
                if (writer, s) not in self.txns and s not in self.aborted[writer]
            ]
            if gone:
                out.append(
                    Violation(
                        "",
                        None,
                        (),
                        f"transactions {gone} of writer {writer} are neither visible nor named "
                        f"aborted, though its transaction {top} is visible: commits lost",
                    )
                )
        return out
