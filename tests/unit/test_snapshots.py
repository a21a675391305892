"""Snapshots of the projection (`projections.snapshot`, `PartitionStore.take_snapshot`
and `load`) and the purge of finished runs, on a real Rdict in tmp_path; no broker."""

from __future__ import annotations

import random

import pytest

from runstream.engine.work import LogRecord
from runstream.engine.workflow import Registry, StepPolicy, step_def, workflow_def
from runstream.projections import snapshot
from runstream.projections.snapshot import Image, Unreadable
from runstream.projections.store import PartitionStore, catch_up
from runstream.schemas.codec import Codec
from runstream.schemas.records import Pause, Retry, Status

from .corehelp import Core


def boom(x: int) -> int:
    raise ValueError("no")


async def waits(ctx) -> str:
    return await ctx.wait_for_signal("go")


async def many(ctx, n: int) -> int:
    for i in range(n):
        await ctx.step(abs, i)
    return n


async def fails(ctx) -> int:
    return await ctx.step(boom, 1)


def _core() -> Core:
    reg = Registry()
    for wf in (waits, many, fails):
        reg.add_workflow(workflow_def(wf))
    reg.add_step(step_def(boom, StepPolicy(retries=0)))
    return Core(reg)


def _sync(store: PartitionStore, core: Core) -> None:
    """Commit what the core decided since to the projection, as the worker does."""
    changes = []
    for run_id, after in core.states.items():
        before = store.get(run_id)
        new = [core.codec.encode(f) for f in core.facts(run_id)[before.facts :]]
        if new:
            changes.append((before, after.copy(), new))
    store.commit(changes, store.journal_offset + sum(len(c[2]) for c in changes))


def _image(records: list[tuple[bytes, bytes | None]]) -> Image:
    image = Image()
    for key, value in records:
        image.add(key, value)
    return image


def test_cut_is_greedy_and_a_longer_history_only_adds_chunks_after_the_last():
    assert snapshot.cut([]) == []
    assert snapshot.cut([10] * 130) == [0, 64, 128]
    big = snapshot.CHUNK_BYTES
    assert snapshot.cut([10, big, 10, 10]) == [0, 1, 2]  # a larger fact goes alone
    rng = random.Random(7)
    sizes = [rng.choice([10, 1000, big // 3, big + 1]) for _ in range(500)]
    whole = snapshot.cut(sizes)
    for k in range(1, 500, 17):
        prefix = snapshot.cut(sizes[:k])
        assert whole[: len(prefix)] == prefix
        # cut again from the last chunk's start: the same chunks as the whole history's
        assert snapshot.cut(sizes[prefix[-1] :], prefix[-1]) == whole[len(prefix) - 1 :]


def test_a_snapshot_loaded_into_an_empty_projection_is_the_same_projection(tmp_path):
    core, codec = _core(), Codec.default()
    core.start("waiting", "waits")
    core.start("long", "many", 150)
    core.start("failed", "fails")
    store = PartitionStore(tmp_path / "a", codec)
    _sync(store, core)
    records, _ = store.take_snapshot()
    image = _image(records)
    assert image.journal_offset == store.journal_offset
    assert {r.run_id for r in image.runs()} == {"waiting", "long", "failed"}
    restored = PartitionStore(tmp_path / "b", codec)
    assert restored.load(image.runs(), image.journal_offset) == 3
    assert restored.dump() == store.dump()  # facts, indexes and the journal offset
    assert not restored.changing  # nothing to write again


def test_a_growing_run_rewrites_only_its_last_chunk(tmp_path):
    core = _core()
    core.start("w", "waits")
    store = PartitionStore(tmp_path / "p", Codec.default())
    written = Image()  # what the compacted topic holds
    for i in range(300):  # 300 signals: a long history, a snapshot after each
        core.signal("w", "other", i)
        _sync(store, core)
        records, _ = store.take_snapshot()
        chunks = [v for k, v in records if k.startswith(b"w\x00")]
        assert len(chunks) <= 2  # the last chunk, and one just begun
        facts = sum(len(snapshot._split(v[2:])) for v in chunks if v is not None)
        assert facts <= snapshot.CHUNK + 1  # not the whole history
        for key, value in records:
            written.add(key, value)
    [run] = written.runs()
    assert run.facts == [Codec.default().encode(f) for f in core.facts("w")]


def test_a_snapshot_taken_but_not_committed_is_taken_again(tmp_path):
    core = _core()
    core.start("w", "waits")
    store = PartitionStore(tmp_path / "p", Codec.default())
    _sync(store, core)
    first, taken = store.take_snapshot()
    assert not store.changing
    store.untake(taken)
    again, _ = store.take_snapshot()
    assert again == first


def test_what_changed_since_the_last_snapshot_committed_survives_a_reopen(tmp_path):
    """An owner that lets a partition go before its next snapshot, and takes it back later
    from its own disk, still writes what changed meanwhile (else ``<ns>.state`` would
    miss facts its marker says it has)."""
    core, codec = _core(), Codec.default()
    core.start("a", "waits")
    core.start("b", "waits")
    store = PartitionStore(tmp_path / "p", codec)
    _sync(store, core)
    _, taken = store.take_snapshot()
    store.snapshotted(taken)  # committed: a and b are in <ns>.state
    core.signal("a", "other", 1)
    _sync(store, core)
    dump = store.dump()
    store.close()
    again = PartitionStore(tmp_path / "p", codec)
    assert again.changed == {"a": 2} and again.dump() == dump  # bookkeeping is no content
    records, taken = again.take_snapshot()
    assert {k for k, _ in records} == {b"a\x00\x00\x00\x00\x00", b"a", snapshot.MARKER_KEY}
    again.untake(taken)  # did not commit: still due after a reopen
    again.close()
    third = PartitionStore(tmp_path / "p", codec)
    assert third.changed == {"a": 2}
    _, taken = third.take_snapshot()
    third.snapshotted(taken)
    third.close()
    assert PartitionStore(tmp_path / "p", codec).changed == {}


def test_the_image_reads_tombstones_and_refuses_what_it_cannot_read():
    image = _image(
        [
            (b"r\x00\x00\x00\x00\x00", snapshot.encode_chunk([b"a", b"bc"])),
            (b"r", snapshot.encode_head(2, None)),
            (b"gone\x00\x00\x00\x00\x00", snapshot.encode_chunk([b"x"])),
            (b"gone", snapshot.encode_head(1, None)),
            (b"gone\x00\x00\x00\x00\x00", None),
            (b"gone", None),
            (snapshot.MARKER_KEY, snapshot.encode_marker(7)),
        ]
    )
    assert [(r.run_id, r.facts) for r in image.runs()] == [("r", [b"a", b"bc"])]
    assert image.journal_offset == 7
    with pytest.raises(Unreadable, match="format 2"):
        Image().add(b"r", b"\x02H\x00\x00\x00\x01")
    with pytest.raises(Unreadable, match="cut short"):
        Image().add(b"r", b"\x01H\x00")
    lacking = _image([(b"r", snapshot.encode_head(3, None))])
    with pytest.raises(Unreadable, match="has 0 facts, not 3"):
        list(lacking.runs())


def test_only_terminal_runs_past_the_retention_are_purged(tmp_path):
    """Running, waiting and paused runs are never finished; a failed run is (terminal),
    until a retry makes it run again; the purge takes facts and index keys, and leaves
    tombstones for the snapshot."""
    core = _core()
    core.start("done", "many", 2)
    core.start("waiting", "waits")
    core.start("paused", "waits")
    core.command(Pause("paused", "by test", pause_id="p1"))
    core.start("failed", "fails")
    core.start("retried", "fails")
    assert core.state("failed").status is Status.FAILED
    core.command(Retry("retried", retry_id="r1"))  # fails again at once: ended later
    store = PartitionStore(tmp_path / "p", Codec.default())
    _sync(store, core)
    store.take_snapshot()
    ended_at = core.now
    assert store.finished(ended_at, 100) == []  # ended at `now`: not before it
    assert sorted(store.finished(ended_at + 1, 100)) == ["done", "failed", "retried"]
    assert store.finished(ended_at + 1, 1) == ["done"]  # bounded work per tick
    store.purge("done")
    assert store.get("done").facts == 0 and store.finished(ended_at + 1, 100) == [
        "failed",
        "retried",
    ]
    assert not any(k[1:].startswith(b"done") for k, _ in store.dump())
    records, _ = store.take_snapshot()
    assert (b"done", None) in records and (b"done\x00\x00\x00\x00\x00", None) in records


def test_a_run_id_started_again_after_its_purge_replays_as_a_new_run(tmp_path):
    """The journal keeps the purged run's facts; the new run of the same id must not fold
    on top of them when a projection is rebuilt from the journal."""
    core = _core()
    core.start("r", "many", 1)
    old = list(core.journal)
    core.states.pop("r")  # purged
    core.start("r", "waits")
    new = core.journal[len(old) :]
    codec = Codec.default()
    journal = [LogRecord("t.journal", 0, i, b"r", codec.encode(f)) for i, f in enumerate(old + new)]
    store = PartitionStore(tmp_path / "p", codec)
    catch_up({0: store}, journal)
    state = store.get("r")
    assert state.workflow == "waits" and state.facts == len(new)
    assert store.journal_offset == len(journal)
    assert list(store.facts("r")) == new


def test_after_the_purge_a_retry_is_refused_and_a_start_starts_a_new_run():
    """As documented: a failed run can be retried only while it is kept; once purged its
    id is unknown to the engine, and a start with it starts a new run."""
    core = _core()
    core.start("r", "fails")
    assert core.state("r").status is Status.FAILED
    core.states.pop("r")  # what the purge leaves: no state
    core.command(Retry("r", retry_id="late"))
    assert [d.code for d in core.dead] == ["unknown-run"]
    core.start("r", "waits")
    assert core.state("r").workflow == "waits" and core.state("r").status is Status.RUNNING


def test_a_tick_purges_old_finished_runs_but_not_one_the_batch_decided(tmp_path):
    """`Snapshots.take`: the purge comes before the snapshot records (tombstones first),
    with a run.purged event; a run the batch about to commit decided (a retry, say) waits
    for a later tick."""
    from runstream.snapshots import Snapshots
    from runstream.topics.spec import Topics

    core = _core()
    core.start("old", "many", 1)
    core.start("busy", "many", 1)
    core.start("live", "waits")
    store = PartitionStore(tmp_path / "p", Codec.default())
    _sync(store, core)
    ticks = Snapshots("t.state", 1.0, 60.0, Topics("t"), Codec.default())
    now = core.now + 61_000
    out = ticks.take(now, {0: store}, busy={"busy"})
    assert store.get("old").facts == 0 and store.get("busy").facts > 0
    state = [o for o in out if o.topic == "t.state"]
    assert [(o.key, o.value) for o in state[:2]] == [
        (b"old\x00\x00\x00\x00\x00", None),
        (b"old", None),
    ]
    [event] = [o for o in out if o.topic == "t.lifecycle"]
    decoded = Codec.default().decode(event.value)
    assert (decoded.type, decoded.run_id, decoded.status) == ("run.purged", "old", "completed")
    ticks.committed()
    assert ticks.take(now + 500, {0: store}) == []  # not due yet
    out = ticks.take(now + 1000, {0: store})
    assert store.get("busy").facts == 0 and store.get("live").facts == 2
    assert ticks.purged == 2


def test_a_projection_written_before_snapshots_existed_writes_no_marker(tmp_path):
    """A projection the previous release wrote (facts, a journal offset, no record of what
    changed since a snapshot) cannot say which of its runs the snapshot topic lacks: a
    marker from it would let a new owner restore none of its earlier runs. It writes no
    snapshot (its next owner reads the journal, as before) until it is rebuilt."""
    import gc

    from rocksdict import Options, Rdict, WriteBatch

    from runstream.snapshots import Snapshots

    core = _core()
    core.start("w", "waits")
    store = PartitionStore(tmp_path / "p", Codec.default())
    _sync(store, core)
    store.close()
    db = Rdict(str(tmp_path / "p"), Options(raw_mode=True))  # as the previous release left it
    old = WriteBatch(raw_mode=True)
    for key in list(db.keys()):
        if key[:1] == b"d" or key == b"msnapshots":
            old.delete(key)
    db.write(old)
    db.close()
    del db
    gc.collect()
    store = PartitionStore(tmp_path / "p", Codec.default())
    assert store.get("w").facts > 0 and not store.changing
    ticks = Snapshots("t.state", 1.0, 0.0)
    assert ticks.take(core.now, {0: store}) == []
    core.start("w2", "waits")  # and later changes do not make it whole either
    _sync(store, core)
    assert ticks.take(core.now + 1000, {0: store}) == []


def test_a_snapshot_that_does_not_commit_again_and_again_backs_off(tmp_path):
    """A snapshot too large for a transaction aborts the batch that carried it: taken again
    at once the first time, then ever later, so batches keep committing meanwhile."""
    from runstream.snapshots import Snapshots

    core = _core()
    core.start("w", "waits")
    store = PartitionStore(tmp_path / "p", Codec.default())
    _sync(store, core)
    ticks = Snapshots("t.state", 1.0, 0.0)
    for now, retaken_at in ((10_000, 10_000), (10_000, 12_000), (20_000, 24_000)):
        assert ticks.take(now, {0: store})  # the snapshot, with its marker
        ticks.aborted(now_ms=now)
        assert not ticks.due(retaken_at - 1) or retaken_at == now
        assert ticks.due(retaken_at)
    assert ticks.take(30_000, {0: store})
    ticks.committed()
    core.start("w2", "waits")
    _sync(store, core)
    assert ticks.take(31_000, {0: store})
    ticks.aborted(now_ms=31_000)
    assert ticks.due(31_000)  # a first abort after a commit: again at once
