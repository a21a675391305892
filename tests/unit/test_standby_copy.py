"""A standby's copy of a partition (`runstream.standby`, `PartitionStore(standby=True)`):
it tracks no changed runs, yet its next owner's first snapshot completes ``<ns>.state``;
it applies its owner's purges once it has reached them. Real Rdict in tmp_path, the
in-memory journal of tests/component; no broker."""

from __future__ import annotations

from pathlib import Path

from runstream.engine.work import LogRecord
from runstream.engine.workflow import Registry, workflow_def
from runstream.ownership import Partitions
from runstream.projections import snapshot
from runstream.projections.snapshot import Image
from runstream.projections.store import PartitionStore, catch_up
from runstream.schemas.codec import Codec
from runstream.standby import OwnerSnapshots

from ..component.memlog import Cluster, MemoryLog
from .corehelp import Core


async def waits(ctx) -> str:
    return await ctx.wait_for_signal("go")


async def quick(ctx) -> int:
    return 1


def _core() -> Core:
    reg = Registry()
    for wf in (waits, quick):
        reg.add_workflow(workflow_def(wf))
    return Core(reg)


def _append(cluster: Cluster, log: MemoryLog, core: Core, since: int) -> int:
    """The core's journal facts from ``since`` on, appended to partition 0; the new end."""
    for fact in core.journal[since:]:
        cluster.append(log.topics.journal, 0, fact.run_id.encode(), core.codec.encode(fact))
    return len(core.journal)


def _records(log: MemoryLog) -> list[LogRecord]:
    return list(log.read_journal({0: 0}, lambda: False))


def test_a_standby_copy_tracks_nothing_and_its_next_owners_first_snapshot_completes_the_state(
    tmp_path: Path,
):
    """The owner snapshots a and b at marker M; then a changes and c starts; the standby
    tailed all of it untracked; after a takeover (and a tail it had not read) the new
    owner's first snapshot, on top of the old owner's, restores the same projection."""
    codec, cluster = Codec.default(), Cluster(partitions=1)
    log, core = MemoryLog(cluster), _core()
    core.start("a", "waits")
    core.start("b", "waits")
    marker = _append(cluster, log, core, 0)
    owner = PartitionStore(tmp_path / "owner", codec)
    catch_up({0: owner}, _records(log))
    written, taken = owner.take_snapshot()  # the old owner's snapshot, committed
    owner.snapshotted(taken)
    assert snapshot.MARKER_KEY in dict(written) and owner.journal_offset == marker
    core.signal("a", "go", "x")  # a ends
    core.start("c", "waits")
    end = _append(cluster, log, core, marker)

    copy = PartitionStore(tmp_path / "standby" / "p0", codec, standby=True)
    catch_up({0: copy}, _records(log))
    assert copy.journal_offset == end and copy.changed == {} and not copy.changing
    copy.saw_snapshot(marker, 3)  # it read the old owner's marker
    copy.close()
    core.signal("b", "go", "y")  # written after the standby's last read: the restore's tail
    _append(cluster, log, core, end)

    partitions = Partitions(tmp_path / "standby", codec)
    partitions.assigned([0])
    store = partitions.restore(log, lambda: False)[0]
    assert store.standby_mark() is None
    assert set(store.changed) == {"a", "b", "c"}
    assert store.changed["c"] == 0
    for run_id in "ab":  # from the first fact after the marker, not their whole history
        before = sum(1 for f in core.journal[:marker] if f.run_id == run_id)
        assert store.changed[run_id] == before
    records, _ = store.take_snapshot()
    image = Image()
    for key, value in [*written, *records]:  # <ns>.state: both owners' snapshots
        image.add(key, value)
    assert image.journal_offset == store.journal_offset
    rebuilt = PartitionStore(tmp_path / "next", codec)
    rebuilt.load(image.runs(), image.journal_offset)
    assert rebuilt.dump() == store.dump()
    partitions.close()


def test_a_copy_that_saw_no_snapshot_marks_every_run_for_its_owners_first_snapshot(
    tmp_path: Path,
):
    codec, cluster = Codec.default(), Cluster(partitions=1)
    log, core = MemoryLog(cluster), _core()
    for run_id in ("a", "b", "c"):
        core.start(run_id, "quick")
    _append(cluster, log, core, 0)
    copy = PartitionStore(tmp_path / "p0", codec, standby=True)
    catch_up({0: copy}, _records(log))
    assert copy.standby_mark() == (0, 0) and copy.changed == {}
    copy.close()
    partitions = Partitions(tmp_path, codec)
    partitions.assigned([0])
    store = partitions.restore(log, lambda: False)[0]
    assert store.changed == {"a": 0, "b": 0, "c": 0}
    partitions.close()


def test_a_copy_applies_its_owners_purges_once_it_reached_their_snapshot(tmp_path: Path):
    """Tombstones of heads are purges; a copy behind the snapshot's journal offset waits;
    a run started again under a purged id (ended after the purge, or not ended) stays."""
    codec, cluster = Codec.default(), Cluster(partitions=1)
    log, core = MemoryLog(cluster), _core()
    core.start("old", "quick")
    core.start("again", "waits")
    end = _append(cluster, log, core, 0)
    copy = PartitionStore(tmp_path / "p0", codec, standby=True)
    catch_up({0: copy}, _records(log))
    purged_at = core.now + 1
    state = "t.state"
    owners = OwnerSnapshots({}, state, {0: copy})
    for offset, (key, value) in enumerate(
        [
            (snapshot.chunk_key("old", 0), None),
            (snapshot.head_key("old"), None),
            (snapshot.head_key("again"), None),
            (snapshot.MARKER_KEY, snapshot.encode_marker(end + 1)),  # past the copy
        ]
    ):
        owners.add(LogRecord(state, 0, offset, key, value, timestamp_ms=purged_at))
    assert owners.apply({0: copy}) == 0  # the copy has not reached that snapshot
    assert copy.get("old").facts and copy.standby_mark() == (0, 0)
    copy.commit([], end + 1)  # it reached it
    assert owners.apply({0: copy}) == 1
    assert copy.get("old").facts == 0 and copy.get("again").facts  # not ended: kept
    assert copy.standby_mark() == (end + 1, 4)
    assert copy.tombstones == [] and copy.changed == {}  # the owner wrote them
    assert owners.apply({0: copy}) == 0  # applied once
