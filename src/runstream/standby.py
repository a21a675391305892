"""Standby replicas: warm copies of partitions that other instances own.

An instance started with ``standbys=N`` keeps, for every partition whose owner is one of
the N members after it in the group (ordered by client id), the partition's projection
in its own state directory, tailing the journal (read_committed) into it as the owner
writes. When Kafka gives it such a partition (the owner died or left), the restore has
only the last facts to read: failover costs the group's detection of the death and a
rebalance, not a rebuild (Kafka Streams' standby tasks, adapted: our changelog is the
journal itself).

A standby thread never writes a store the owner path holds: `claim` takes partitions
from it and returns once their stores are closed (before the owner opens them), and
`unclaim` gives them back once the owner closed them. Nothing here is ever decided on:
a standby store is only a head start for the restore, which catches up from its offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from runstream.projections.store import PartitionStore, catch_up
from runstream.schemas.codec import Codec
from runstream.topics.admin import Config
from runstream.topics.catchup import PartitionReader
from runstream.topics.groups import assignments
from runstream.topics.kafka import KafkaLog

log = logging.getLogger("runstream.standby")

#: How often the placement is asked of the group coordinator (seconds).
PLACEMENT_EVERY = 2.0


def placement(held: Mapping[str, Iterable[int]], me: str, replicas: int) -> set[int]:
    """The partitions ``me`` keeps warm: those whose owner is among the ``replicas``
    members before ``me`` in client-id order (so each partition has up to ``replicas``
    standbys, on different members, none of them its owner)."""
    members = sorted(held)
    if me not in members or replicas <= 0:
        return set()
    i, n = members.index(me), len(members)
    owners = {members[(i - k) % n] for k in range(1, min(replicas, n - 1) + 1)}
    return {p for owner in owners for p in held[owner]}


class Standbys:
    """The standby thread of one engine instance.

    Args:
        config: the engine's client settings.
        group_id, client_id: the engine's consumer group, and this instance's client id in it.
        commands, journal: the topics (placement follows the assignment of ``commands``).
        state_dir: the instance's state directory (``p<N>`` per partition, as the owner's).
        replicas: standbys per partition across the group.
    """

    def __init__(
        self,
        config: Config,
        group_id: str,
        client_id: str,
        commands: str,
        journal: str,
        state_dir: Path,
        replicas: int,
    ) -> None:
        self._config, self._group, self._me = dict(config), group_id, client_id
        self._commands, self._journal = commands, journal
        self._state_dir, self._replicas = state_dir, replicas
        self._codec = Codec.default()
        self._lock = threading.Condition()
        self._claimed: set[int] = set()  # the owner path's: never opened here
        self._held: set[int] = set()  # open here now
        self._wanted: set[int] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runstream-standby", daemon=True)
        self.applied = 0  # facts applied since the start (for logs and tests)

    @classmethod
    def of(cls, engine_log: KafkaLog, state_dir: Path, replicas: int) -> Standbys:
        """The standbys of the instance whose log is ``engine_log``, started."""
        topics = engine_log.topics
        standbys = cls(
            engine_log.config,
            engine_log.group_id,
            engine_log.client_id,
            topics.commands,
            topics.journal,
            state_dir,
            replicas,
        )
        standbys.start()
        return standbys

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        self._thread.join(timeout=30)

    def claim(self, partitions: Iterable[int], timeout: float = 10.0) -> None:
        """The owner path takes ``partitions``: return once no standby store of theirs is
        open (at most ``timeout`` seconds; a thread that hangs on Kafka closes them after)."""
        wanted = set(partitions)
        with self._lock:
            self._claimed |= wanted
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: not (self._held & wanted), timeout):
                raise RuntimeError(f"standby stores of partitions {sorted(wanted)} stayed open")

    def unclaim(self, partitions: Iterable[int]) -> None:
        """The owner path closed ``partitions``: they may be kept warm again."""
        with self._lock:
            self._claimed -= set(partitions)
            self._lock.notify_all()

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        reader = PartitionReader(self._config, self._journal)
        stores: dict[int, PartitionStore] = {}
        try:
            while not self._stopping.is_set():
                self._reconcile(stores)  # first: a claim may be waiting
                self._wanted = self._ask()
                self._reconcile(stores)
                if not stores:
                    with self._lock:
                        self._lock.wait(PLACEMENT_EVERY)
                    continue
                asked = time.monotonic()
                start = {p: s.journal_offset for p, s in stores.items()}
                for records, _ in reader.read(start, follow=True, wait=0.1):
                    if records:
                        with self._lock:  # a claim waits for this batch, then finds them closed
                            self.applied += catch_up(
                                {p: stores[p] for p in {r.partition for r in records}}, records
                            )
                    with self._lock:
                        claimed = bool(self._claimed & set(stores))
                    if claimed or self._stopping.is_set():
                        break
                    if time.monotonic() - asked > PLACEMENT_EVERY:
                        if self._ask() != self._wanted:
                            break
                        asked = time.monotonic()
        except Exception:  # a standby is only a head start: never take the engine down
            log.exception("standby replicas stopped")
        finally:
            self._stopping.set()
            with self._lock:
                for store in stores.values():
                    store.close()
                self._held = set()
                self._lock.notify_all()
            reader.close()

    def _ask(self) -> set[int]:
        try:
            held = assignments(self._config, self._group, self._commands, timeout=5.0)
        except Exception as exc:  # the coordinator may be moving: keep the placement we had
            log.debug("standby placement not known: %s", exc)
            return self._wanted
        return placement(held, self._me, self._replicas)

    def _reconcile(self, stores: dict[int, PartitionStore]) -> None:
        """Open and close stores to match the placement minus the claimed partitions."""
        with self._lock:
            wanted = self._wanted - self._claimed
            drop, add = set(stores) - wanted, wanted - set(stores)
            for p in drop:
                stores.pop(p).close()
            for p in sorted(add):
                stores[p] = PartitionStore(self._state_dir / f"p{p}", self._codec)
            self._held = set(stores)
            self._lock.notify_all()
        if add or drop:
            log.info("standby for partitions %s", sorted(stores))
