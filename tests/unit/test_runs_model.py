"""The runs read model (projections.runs) fed from an in-memory lifecycle topic."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping

import pytest

from runstream.engine.lifecycle import event
from runstream.engine.state import RunState
from runstream.engine.work import LogRecord
from runstream.projections.runs import RunQuery, RunsModel, fold
from runstream.schemas.codec import Codec
from runstream.schemas.records import LifecycleEvent, RunStarted, Status
from runstream.topics.catchup import TopicLayout

CODEC = Codec.default()


def started(run: str, at: int, workflow: str = "order", version: str = "1", **tags: str):
    return LifecycleEvent(
        "run.started",
        run,
        at_ms=at,
        workflow=workflow,
        version=version,
        status="running",
        tags=tags,
        input=b'{"n":1}',
    )


def ended(run: str, at: int, status: str = "completed", version: str = "1"):
    kind = {"completed": "run.completed", "failed": "run.failed"}[status]
    return LifecycleEvent(
        kind,
        run,
        at_ms=at,
        workflow="order",
        version=version,
        status=status,
        duration_ms=5,
        output=b"42",
    )


class ListSource:
    """A lifecycle topic in memory: partition -> encoded values, offsets from ``low``."""

    def __init__(self, topic_id: str = "t1", partitions: int = 2) -> None:
        self.topic_id = topic_id
        self.values: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        self.low: dict[int, int] = dict.fromkeys(self.values, 0)

    def add(self, *events: LifecycleEvent, p: int | None = None) -> None:
        for ev in events:
            part = p if p is not None else zlib.crc32(ev.run_id.encode()) % len(self.values)
            self.values[part].append(CODEC.encode(ev))

    def layout(self) -> TopicLayout:
        return TopicLayout(
            self.topic_id, {p: (self.low[p], len(v)) for p, v in self.values.items()}
        )

    def read(self, start: Mapping[int, int]) -> Iterator[tuple[list[LogRecord], dict[int, int]]]:
        for p, offset in start.items():
            records = [
                LogRecord("ns.lifecycle", p, o, None, self.values[p][o])
                for o in range(offset, len(self.values[p]))
            ]
            for i in range(0, len(records), 3):  # small batches: several WriteBatches
                chunk = records[i : i + 3]
                yield chunk, {p: chunk[-1].offset + 1}


@pytest.fixture
def model(tmp_path):
    m = RunsModel(tmp_path / "runs")
    yield m
    m.close()


def ids(page) -> list[str]:
    return [r.run_id for r in page.runs]


def test_fold_takes_tags_and_input_from_run_started_and_the_end_from_run_completed():
    row = fold(None, started("r1", 100, customer="c-9"))
    row = fold(
        row,
        LifecycleEvent(
            "step.completed", "r1", at_ms=150, workflow="order", version="1", status="running"
        ),
    )
    row = fold(row, ended("r1", 200))
    assert row is not None
    assert (row.status, row.tags, row.input, row.output) == (
        "completed",
        {"customer": "c-9"},
        '{"n":1}',
        "42",
    )
    assert (row.started_at_ms, row.ended_at_ms, row.steps, row.events) == (100, 200, 1, 3)


def test_fold_ignores_event_types_it_does_not_know():
    row = fold(None, started("r1", 100))
    assert fold(row, LifecycleEvent("run.teleported", "r1", at_ms=120, status="elsewhere")) is row
    assert fold(None, LifecycleEvent("run.teleported", "r2", at_ms=120)) is None


def test_the_run_started_lifecycle_event_carries_the_runs_tags_and_input():
    state = RunState("r1")
    fact = RunStarted(
        "r1", 10, workflow="order", version="2", input=b'{"a":1}', tags={"customer": "c-9"}
    )
    state.workflow, state.version, state.status = "order", "2", Status.RUNNING
    ev = event(fact, state)
    assert ev is not None and (ev.type, ev.tags, ev.input) == (
        "run.started",
        {"customer": "c-9"},
        b'{"a":1}',
    )


def test_list_filters_by_status_workflow_and_tag_newest_first(model):
    src = ListSource()
    src.add(started("a", 100, customer="c-1"), started("b", 200, "refund", customer="c-9"))
    src.add(started("c", 300, customer="c-9", region="eu"), ended("a", 400))
    model.catch_up(src)

    assert ids(model.find(RunQuery())) == ["c", "b", "a"]
    assert ids(model.find(RunQuery(status="running"))) == ["c", "b"]
    assert ids(model.find(RunQuery(status="completed"))) == ["a"]
    assert ids(model.find(RunQuery(workflow="order"))) == ["c", "a"]
    assert ids(model.find(RunQuery(tags={"customer": "c-9"}))) == ["c", "b"]
    assert ids(model.find(RunQuery(tags={"customer": "c-9", "region": "eu"}))) == ["c"]
    assert ids(model.find(RunQuery(workflow="order", tags={"customer": "c-9"}))) == ["c"]
    assert ids(model.find(RunQuery(since_ms=200))) == ["c", "b"]
    assert ids(model.find(RunQuery(until_ms=300))) == ["b", "a"]


def test_a_run_that_changes_status_leaves_its_old_status_index(model):
    src = ListSource()
    src.add(started("a", 100))
    model.catch_up(src)
    assert ids(model.find(RunQuery(status="running"))) == ["a"]
    src.add(ended("a", 200, "failed"))
    model.catch_up(src)
    assert ids(model.find(RunQuery(status="running"))) == []
    assert ids(model.find(RunQuery(status="failed"))) == ["a"]
    assert model.count(RunQuery(status="running")) == 0
    assert model.count(RunQuery(status="failed")) == 1


def test_pages_cover_every_match_once_in_order(model):
    src = ListSource()
    src.add(*(started(f"r{i:02}", 1000 + i // 2, customer=f"c-{i % 2}") for i in range(25)))
    model.catch_up(src)
    for query in (RunQuery(), RunQuery(tags={"customer": "c-1"}), RunQuery(status="running")):
        seen, after = [], None
        while True:
            page = model.find(query, limit=4, after=after)
            seen += ids(page)
            after = page.after
            if after is None:
                break
        expected = ids(model.find(query, limit=1000))
        assert seen == expected and len(set(seen)) == len(seen) == model.count(query)
    assert model.count(RunQuery(tags={"customer": "c-1"})) == 12


def test_versions_count_open_runs_per_workflow_and_version(model):
    src = ListSource()
    src.add(started("a", 1, version="1"), started("b", 2, version="1"), ended("a", 3))
    src.add(started("c", 4, version="2"), ended("c", 5, version="2"))
    model.catch_up(src)
    counts = {(v.workflow, v.version): (v.open, v.total) for v in model.versions()}
    assert counts == {("order", "1"): (1, 2), ("order", "2"): (0, 1)}
    assert model.count(RunQuery(workflow="order", version="1")) == 2


def test_catch_up_reads_each_record_once_and_nothing_when_nothing_is_new(model):
    src = ListSource()
    src.add(*(started(f"r{i}", i) for i in range(10)))
    first = model.catch_up(src)
    assert (first.read, first.rebuilt, first.partial) == (10, False, False)
    assert model.catch_up(src).read == 0
    src.add(ended("r3", 50))
    assert model.catch_up(src).read == 1
    assert model.count(RunQuery()) == 10
    assert [e.type for e in model.events("r3")] == ["run.started", "run.completed"]


def test_the_stored_offsets_survive_a_reopen(tmp_path):
    src = ListSource()
    src.add(started("a", 1), started("b", 2))
    model = RunsModel(tmp_path / "m")
    model.catch_up(src)
    model.close()
    again = RunsModel(tmp_path / "m")
    try:
        assert again.catch_up(src).read == 0
        assert again.get("a") is not None
    finally:
        again.close()


def test_a_recreated_topic_rebuilds_the_model_from_scratch(model):
    src = ListSource("t1")
    src.add(started("old", 1), started("old2", 2))
    model.catch_up(src)
    fresh = ListSource("t2")
    fresh.add(started("new", 3))
    done = model.catch_up(fresh)
    assert (done.read, done.rebuilt) == (1, True)
    assert ids(model.find(RunQuery())) == ["new"] and model.get("old") is None


def test_offsets_past_the_topics_end_rebuild_the_model(model):
    src = ListSource("same-id")
    src.add(started("a", 1), started("b", 2), p=0)
    model.catch_up(src)
    src.values[0] = src.values[0][:1]  # the topic is shorter than what we read
    done = model.catch_up(src)
    assert (done.read, done.rebuilt) == (1, True)
    assert model.count(RunQuery()) == 1


def test_events_dropped_by_retention_before_the_first_read_mark_the_model_partial(model):
    src = ListSource()
    src.add(started("gone", 1), started("kept", 2), p=0)
    src.low[0] = 1
    done = model.catch_up(src)
    assert (done.read, done.partial) == (1, True)
    assert ids(model.find(RunQuery())) == ["kept"]


def test_undecodable_records_are_skipped_and_read_past(model):
    src = ListSource()
    src.add(started("a", 1), p=0)
    src.values[0].append(b"garbage")
    src.add(started("b", 2), p=0)
    assert model.catch_up(src).read == 3
    assert ids(model.find(RunQuery())) == ["b", "a"]
    assert model.catch_up(src).read == 0


def test_a_bad_page_position_is_a_value_error(model):
    with pytest.raises(ValueError, match="not a page position"):
        model.find(RunQuery(), after="yesterday")


def test_an_unmatched_event_makes_no_run_row():
    ev = LifecycleEvent("event.unmatched", "~event/tick/k", at_ms=1, reason="nobody waited")
    assert fold(None, ev) is None


BIG = "x" * (70 << 10)  # 70 KiB: more than a 2-byte length can say


def test_a_tag_or_version_over_64_kib_is_clipped_in_the_index_never_a_wedge(model, caplog):
    src = ListSource()
    src.add(started("before", 1), started("big-tag", 2, note=BIG), p=0)
    src.add(started("big-version", 3, version=BIG), ended("big-version", 4, version=BIG), p=0)
    src.add(started("after", 5, note="small"), p=0)
    assert model.catch_up(src).read == 5
    assert model.offsets() == {0: 5}  # read past them
    assert model.catch_up(src).read == 0
    assert ids(model.find(RunQuery())) == ["after", "big-version", "big-tag", "before"]
    # the whole value still finds the run, and only it (the index holds it clipped)
    assert ids(model.find(RunQuery(tags={"note": BIG}))) == ["big-tag"]
    assert ids(model.find(RunQuery(tags={"note": BIG[:-1]}))) == []
    assert ids(model.find(RunQuery(tags={"note": "small"}))) == ["after"]
    row = model.get("big-version")
    assert row is not None and row.version == BIG  # the row keeps it whole
    assert model.count(RunQuery(version=BIG)) == 1
    counted = {v.version[:8]: v.statuses for v in model.versions()}
    assert counted["xxxxxxxx"] == {"completed": 1}
    assert "clipped" in caplog.text


def test_index_keys_of_ordinary_fields_keep_their_layout(model):
    # models written before long fields were clipped stay readable as they are
    src = ListSource()
    src.add(started("a", 1, customer="c-9"), p=0)
    model.catch_up(src)
    keys = set(model.db.keys())
    assert b"g\x00\x08customer\x00\x03c-9" + (2**63 - 2).to_bytes(8, "big") + b"a" in keys
    assert b"c\x00\x05order\x00\x011\x00\x07running" in keys
