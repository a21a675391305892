"""The RocksDB projection, on a real Rdict in tmp_path."""

from __future__ import annotations

from runstream.engine import payload
from runstream.engine.workflow import Registry, workflow_def
from runstream.projections.store import PartitionStore
from runstream.schemas.codec import Codec

from .corehelp import Core


async def nap(ctx, x: int) -> int:
    await ctx.sleep(30)
    return await ctx.step(abs, x)


def test_commit_then_reopen_gives_same_state_indexes_and_offset(tmp_path):
    codec = Codec.default()
    reg = Registry()
    reg.add_workflow(workflow_def(nap))
    core = Core(reg)
    core.start("r1", "nap", -5)
    store = PartitionStore(tmp_path / "p0", codec)
    live = core.state("r1")
    encoded = [codec.encode(f) for f in core.facts("r1")]
    store.commit([(store.get("r1"), live.copy(), encoded)], journal_offset=42)
    assert list(store.timers()) == [(core.now + 30_000, "r1", 1)]
    store.close()

    again = PartitionStore(tmp_path / "p0", codec)  # same process: the LOCK was released
    assert again.journal_offset == 42
    assert again.get("r1") == live
    core.advance(30)
    before, after = again.get("r1"), core.state("r1")
    new = [codec.encode(f) for f in core.facts("r1")[before.facts :]]
    again.commit([(before, after.copy(), new)], journal_offset=50)
    assert list(again.timers()) == [] and again.running() == []
    assert payload.loads(again.get("r1").output) == 5
    dump = again.dump()
    again.close()
    third = PartitionStore(tmp_path / "p0", codec)
    assert third.dump() == dump and third.get("r1") == after
    third.close()
