"""Large payloads by claim check (`engine.blobs`, `engine.rules.blobs`): the reference
encoding, the chunks, and the core's decisions about them with no broker (the store is the
Decider's in-memory one, as the shell's Kafka store caches what the core wrote)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from runstream import App
from runstream.engine import blobs, payload
from runstream.engine.blobs import MAGIC, MemoryBlobs, Ref, parse, refs_in, resolve, split
from runstream.engine.limits import Limits
from runstream.engine.reducer import fold
from runstream.engine.workflow import Registry, workflow_def
from runstream.errors import BlobUnavailable, Failure
from runstream.projections.runs import shown_text
from runstream.schemas.records import (
    Kind,
    LifecycleEvent,
    PublishEvent,
    Retry,
    Signal,
    StartRun,
    correlation_id,
)
from runstream.testing import WorkflowTester
from runstream.topics import lifecycle_wire

from .corehelp import Core

# -- the reference ------------------------------------------------------------------------


def test_a_reference_round_trips_and_plain_json_is_no_reference():
    data = b'"' + b"x" * 10_000 + b'"'
    ref, chunks = split(data, 4_000, at_ms=123)
    assert ref == Ref(hashlib.sha256(data).hexdigest(), len(data), 3, 123)
    assert parse(ref.encode()) == ref and ref.encode().startswith(MAGIC)
    assert len(ref.encode()) < 200
    assert [len(c) for c in chunks] == [4_000, 4_000, 2_002] and b"".join(chunks) == data
    assert ref.key(2) == f"{ref.sha256}/2".encode()
    for plain in (b"null", b'{"sha256": "x"}', b"", None):
        assert parse(plain) is None


def test_the_same_bytes_give_the_same_reference_whenever_written():
    a, _ = split(b"[1,2,3]" * 1000, 100, at_ms=1)
    b, _ = split(b"[1,2,3]" * 1000, 100, at_ms=2)
    assert (a.sha256, a.size, a.chunks) == (b.sha256, b.size, b.chunks)
    assert a.key(0) == b.key(0)  # a redo writes the same keys: compaction keeps one


@pytest.mark.parametrize(
    "bad",
    [
        MAGIC + b"not json",
        MAGIC + b'{"sha256": "ab", "size": 1, "chunks": 1, "at": 0}',  # not a sha256
        MAGIC + b'{"size": 1, "chunks": 1, "at": 0}',
        MAGIC + b'{"sha256": "' + b"a" * 64 + b'", "size": 1, "chunks": 0, "at": 0}',
    ],
)
def test_a_malformed_reference_is_a_clear_error(bad: bytes):
    with pytest.raises(BlobUnavailable, match="malformed"):
        parse(bad)


def test_verify_refuses_bytes_whose_hash_differs():
    ref, _ = split(b'"abc"', 10, at_ms=0)
    assert ref.verify(b'"abc"') == b'"abc"'
    with pytest.raises(BlobUnavailable, match="corrupt"):
        ref.verify(b'"abd"')


def test_resolve_reads_through_the_active_store_and_says_when_there_is_none():
    data = b'"' + b"v" * 100 + b'"'
    ref, _ = split(data, 50, at_ms=0)
    with pytest.raises(BlobUnavailable, match="no blob store"):
        resolve(ref.encode())
    store = MemoryBlobs()
    with blobs.active(store):
        with pytest.raises(BlobUnavailable, match="not found"):
            payload.loads(ref.encode())
        store.remember(ref, data)
        assert payload.loads(ref.encode()) == "v" * 100
    assert resolve(b"[1]") == b"[1]"  # a plain payload needs no store


def test_the_memory_store_lets_the_least_recently_used_go():
    store = MemoryBlobs(most=250)
    refs = []
    for i in range(3):
        data = bytes([65 + i]) * 100
        ref, _ = split(data, 100, at_ms=0)
        store.remember(ref, data)
        refs.append(ref)
    assert store.get(refs[0]) is None and store.get(refs[1]) and store.get(refs[2])


def test_refs_in_finds_the_references_of_a_records_payload_fields():
    ref, _ = split(b"1" * 500, 100, at_ms=0)
    assert refs_in(StartRun("r", "wf", input=ref.encode())) == [ref]
    assert refs_in(Signal("r", "s", payload=b"1", signal_id="x")) == []


# -- the core -------------------------------------------------------------------------

app = App("blobs")
SMALL = Limits(max_record=200_000, blob_threshold=10_000)  # chunks of 134,928 bytes


@app.step(retries=0)
def produce(n: int) -> str:
    return "x" * n


@app.workflow
async def big_step(ctx: Any, n: int) -> int:
    value = await ctx.step(produce, n)
    return len(value)


@app.workflow
async def echo(ctx: Any, value: Any) -> Any:
    return value


@app.workflow
async def two_steps(ctx: Any, n: int) -> int:
    a = await ctx.step(produce, n)
    b = await ctx.step(produce, n + 1)
    return len(a) + len(b)


def test_a_big_step_output_is_written_in_chunks_and_the_fact_carries_its_reference():
    core = Core(app.registry, limits=SMALL)
    core.start("r", "big_step", 300_000)
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == 300_000
    [done] = core.facts("r", "StepCompleted")
    ref = parse(done.output)
    assert ref is not None and ref.size == 300_002 and ref.at_ms == core.now
    [blob] = core.blobs
    assert blob.ref == ref and len(blob.chunks) == 3
    assert all(len(c) <= SMALL.payload for c in blob.chunks)
    assert hashlib.sha256(b"".join(blob.chunks)).hexdigest() == ref.sha256
    assert st.blob_bytes == 300_002 == fold("r", core.facts("r")).blob_bytes
    assert all(len(core.codec.encode(f)) < 2_000 for f in core.facts("r"))


def test_a_small_payload_stays_in_its_record():
    core = Core(app.registry, limits=SMALL)
    core.start("r", "big_step", 100)
    assert core.blobs == [] and core.state("r").blob_bytes == 0
    [done] = core.facts("r", "StepCompleted")
    assert parse(done.output) is None


def test_a_big_run_output_is_a_blob_the_client_resolves():
    core = Core(app.registry, limits=SMALL)
    data = payload.dumps("y" * 50_000)
    ref, _ = split(data, SMALL.payload, at_ms=0)
    core.decider.blobs.remember(ref, data)  # as a client wrote it
    core.start_raw("r", "echo", ref.encode())
    st = core.state("r")
    assert st.status == "completed"
    out = parse(st.output)
    assert out is not None and out.sha256 == ref.sha256  # the same bytes: the same blob
    with blobs.active(core.decider.blobs):
        assert payload.loads(st.output) == "y" * 50_000
    assert st.blob_bytes == 2 * len(data)  # the input's and the output's references


def test_a_recovered_run_replays_its_big_step_output_from_the_store():
    core = Core(app.registry, limits=SMALL)
    core.auto_run_steps = False
    core.start("r", "two_steps", 20_000)
    core.run_step(core.queued.pop(0))  # the first output recorded as a blob
    core.queued.clear()  # the second attempt's process crashed
    core.recover("r")
    while core.queued:
        core.run_step(core.queued.pop(0))
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == 40_001
    assert len(core.facts("r", "StepCompleted")) == 2


def test_a_run_past_its_blob_budget_fails_with_the_code_blob_budget():
    limits = Limits(max_record=200_000, blob_threshold=10_000, blob_budget=30_000)
    core = Core(app.registry, limits=limits)
    core.start("r", "two_steps", 20_000)
    st = core.state("r")
    assert st.status == "failed" and st.code == Failure.BLOB_BUDGET
    assert "budget is 30,000" in (st.error or "") and "to 40,005 bytes" in (st.error or "")
    assert len(core.blobs) == 1  # the first output fits the budget, the second would not
    [failed] = core.facts("r", "RunFailed")
    assert failed.code == "blob-budget" and st.blob_bytes == 20_002


def test_a_step_output_past_the_budget_fails_the_run_at_once_with_no_retry():
    limits = Limits(max_record=200_000, blob_threshold=10_000, blob_budget=15_000)
    core = Core(app.registry, limits=limits)
    core.start("r", "big_step", 20_000)
    st = core.state("r")
    assert st.status == "failed" and st.code == Failure.BLOB_BUDGET
    assert core.names("r")[-2:] == ["StepFailed", "RunFailed"] and core.blobs == []


def test_a_start_whose_input_passes_the_budget_is_rejected():
    core = Core(app.registry, limits=Limits(max_record=200_000, blob_budget=1_000))
    data = payload.dumps("z" * 5_000)
    ref, _ = split(data, SMALL.payload, at_ms=0)
    core.decider.blobs.remember(ref, data)
    core.start_raw("r", "echo", ref.encode())
    assert core.state("r").status == "rejected"
    [letter] = core.dead
    assert letter.code == "oversize" and "budget is 1,000" in letter.reason


def test_a_reference_to_nothing_is_a_dead_letter_and_a_rejected_start():
    core = Core(app.registry, limits=SMALL)
    ref, _ = split(b'"never written"', 100, at_ms=0)
    core.start_raw("r", "echo", ref.encode())
    assert core.state("r").status == "rejected"
    [letter] = core.dead
    assert letter.code == "blob-missing" and "not found" in letter.reason
    core.start_raw("m", "echo", MAGIC + b"{nonsense")
    assert core.dead[-1].code == "blob-missing" and "malformed" in core.dead[-1].reason


@app.workflow
async def waits(ctx: Any, n: Any) -> Any:
    return await ctx.wait_for_signal("go")


def test_a_signal_with_a_missing_blob_is_a_dead_letter_and_the_run_goes_on():
    core = Core(app.registry, limits=SMALL)
    core.start("r", "waits", 0)
    ghost, _ = split(b'"ghost"', 100, at_ms=0)
    core.command(Signal("r", "go", payload=ghost.encode(), signal_id="s1"))
    assert core.dead[-1].code == "blob-missing" and core.state("r").status == "running"
    data = payload.dumps(["big"] * 10_000)
    ref, _ = split(data, SMALL.payload, at_ms=0)
    core.decider.blobs.remember(ref, data)
    core.command(Signal("r", "go", payload=ref.encode(), signal_id="s2"))
    st = core.state("r")
    assert st.status == "completed"
    with blobs.active(core.decider.blobs):
        assert payload.loads(st.output) == ["big"] * 10_000


def test_blobs_off_keeps_the_old_limit():
    core = Core(app.registry, limits=Limits(max_record=200_000, blob_threshold=0))
    core.start("r", "big_step", 300_000)
    assert core.blobs == [] and core.state("r").status == "failed"
    [failed] = core.facts("r", "StepFailed")
    assert "the step's output is 300,002 bytes" in failed.error


# -- where large payloads meet the other features -------------------------------------

flaky_calls: list[int] = []


@app.step(retries=0)
def flaky(n: int) -> int:
    flaky_calls.append(n)
    if len(flaky_calls) == 1:
        raise RuntimeError("down")
    return n


@app.workflow
async def big_then_flaky(ctx: Any, n: int) -> int:
    value = await ctx.step(produce, n)
    return len(value) + await ctx.step(flaky, 1)


@app.workflow
async def rolls(ctx: Any, text: str) -> int:
    if len(text) < 30_000:
        ctx.continue_as_new(text * 2)
    return len(text)


@app.workflow
async def parent(ctx: Any, n: int) -> int:
    return await ctx.child(echo, "p" * n, run_id=f"{ctx.run_id}-kid")


def _with_store(core: Core, data: Any) -> bytes:
    """``data``'s reference, its bytes in the store as a client would have written them."""
    raw = payload.dumps(data)
    ref, _ = split(raw, SMALL.payload, at_ms=0)
    core.decider.blobs.remember(ref, raw)
    return ref.encode()


def test_a_retried_run_replays_its_big_step_output_and_does_not_write_it_again():
    flaky_calls.clear()
    core = Core(app.registry, limits=SMALL)
    core.start("r", "big_then_flaky", 20_000)
    assert core.state("r").status == "failed" and len(core.blobs) == 1
    core.command(Retry("r", "again", retry_id="x"))
    st = core.state("r")
    assert st.status == "completed" and payload.loads(st.output) == 20_001
    assert len(core.facts("r", "StepCompleted")) == 2 and len(core.blobs) == 1


def test_continue_as_new_carries_a_big_input_to_its_successor_as_a_reference():
    core = Core(app.registry, limits=SMALL)
    core.start("c", "rolls", "ab" * 5_000)
    for successor in ("c~1", "c~2"):  # 20,000 then 40,000 characters
        start = core.commands[-1]
        assert isinstance(start, StartRun) and start.run_id == successor
        assert parse(start.input) is not None
        core.command(start)
    assert core.state("c~1").status == "completed" and core.state("c~1").blob_bytes == 20_002
    assert core.state("c~2").status == "completed"
    assert payload.loads(core.state("c~2").output) == 40_000


def test_a_child_gets_a_big_input_as_a_reference_written_with_its_start():
    core = Core(app.registry, limits=SMALL)
    core.start("p", "parent", 50_000)
    start = core.commands[-1]
    ref = parse(start.input)
    assert ref is not None and [b.ref for b in core.blobs] == [ref]
    core.command(start)  # on the child's partition: it reads the blob
    assert core.state("p-kid").status == "completed"


def test_a_duplicate_start_with_a_reference_is_one_run():
    core = Core(app.registry, limits=SMALL)
    data = _with_store(core, "d" * 20_000)
    core.start_raw("d", "echo", data)
    core.start_raw("d", "echo", data)
    assert core.names("d").count("RunStarted") == 1 and core.dead == []
    assert core.state("d").blob_bytes == 2 * 20_002  # input and output, counted once


def test_a_cancelled_run_with_a_big_input_ends_and_a_restore_folds_its_blob_bytes():
    core = Core(app.registry, limits=SMALL)
    core.start_raw("w", "waits", _with_store(core, "c" * 30_000))
    core.cancel("w")
    st = core.state("w")
    assert st.status == "cancelled"
    assert fold("w", core.facts("w")).blob_bytes == st.blob_bytes == 30_002


def test_a_json_lifecycle_event_carries_a_reference_as_a_marker_and_reads_it_back():
    ref, _ = split(b'"' + b"q" * 300_000 + b'"', 100_000, at_ms=7)
    ev = LifecycleEvent(Kind.RUN_STARTED, "r", at_ms=1, input=ref.encode(), output=b"[1]")
    doc = json.loads(lifecycle_wire.to_json(ev))
    assert doc["input"] == {
        "$runstream_blob": {"sha256": ref.sha256, "size": 300_002, "chunks": 4, "at": 7}
    }
    back = lifecycle_wire.from_json(lifecycle_wire.to_json(ev))
    assert back.input == ref.encode() and back.output == b"[1]"


def test_a_read_model_shows_a_large_payload_it_cannot_read_as_what_it_is():
    data = payload.dumps("s" * 1_000)
    ref, _ = split(data, 100, at_ms=0)
    assert set(payload.shown(ref.encode())) == {"$blob"}  # no store here: never an error
    store = MemoryBlobs()
    store.remember(ref, data)
    with blobs.active(store):
        assert payload.shown(ref.encode()) == "s" * 1_000
        assert shown_text(ref.encode().decode()) == json.dumps("s" * 1_000)
    assert shown_text("[1, 2]") == "[1, 2]"


async def on_doc(ctx: Any, doc: dict) -> int:
    return len(doc["text"])


async def doc_batch(ctx: Any, docs: list) -> int:
    return len(docs)


def test_a_big_event_starts_its_workflow_and_a_batch_sets_it_aside_with_a_reason():
    reg = Registry()
    reg.add_workflow(workflow_def(on_doc, on_event="doc"))
    reg.add_workflow(workflow_def(doc_batch, on_event="doc", batch=2))
    core = Core(reg, limits=SMALL)
    data = _with_store(core, {"text": "t" * 50_000})
    core.command(
        PublishEvent(correlation_id("doc", "k"), "doc", event_id="e1", payload=data, key="k")
    )
    while core.commands:
        core.command(core.commands.pop(0))
    assert payload.loads(core.state("on_doc:e1").output) == 50_000
    [letter] = core.dead
    assert (
        letter.code == "oversize" and "cannot join a batch of workflow 'doc_batch'" in letter.reason
    )


def test_the_testing_kit_gives_a_big_output_back_as_its_value():
    t = WorkflowTester(app)
    run = t.start("big_step", 400_000)  # a 400,002-byte step output: past the threshold
    assert run.result() == 400_000
    run = t.start("echo", "e" * 400_000)  # and a run output
    assert run.result() == "e" * 400_000
    assert parse(run.state.output) is not None


def test_runs_show_reads_large_payloads_only_for_its_own_command():
    """`runstream runs show` resolves references through its namespace's blobs topic, for
    that command only: a process that goes on (a test session, a program invoking the CLI)
    keeps no blob store of it (before, the next reader of another namespace read through
    this one's topic)."""
    from click.testing import CliRunner

    from runstream.cli.main import cli

    assert blobs.ACTIVE.get() is None
    out = CliRunner().invoke(cli, ["runs", "show", "r1", "-n", "ns", "--bootstrap", "127.0.0.1:1"])
    assert out.exit_code != 0  # no broker there
    assert blobs.ACTIVE.get() is None
