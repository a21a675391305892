"""Standby replicas (`runstream.standby`) with real processes: an instance keeps warm
copies of the partitions the instance before it owns, so when that owner is SIGKILLed
the survivor restores only the facts written since its copy's last batch, not the
partitions' whole journal, and every run still finishes once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runstream.audit import audit
from runstream.engine.partitioner import partition_for
from runstream.projections.store import PartitionStore
from runstream.schemas.codec import Codec

from .kit import (
    PARTITIONS,
    client_or_none,
    journal_ends,
    kill,
    owns,
    results,
    spawn_worker,
    terminate,
    wait_for,
)
from .test_snapshots import _snapshot_runs, _state_images

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ENV = {"RUNSTREAM_STANDBYS": "1", "RUNSTREAM_SESSION_TIMEOUT_MS": "6000"}
RESTORED = re.compile(r"partitions \[([\d, ]+)\] restored: (\d+) facts")


def _stored_offset(store_dir: Path) -> int:
    """The journal offset a projection reflects (read-only: its writer keeps it open)."""
    if not (store_dir / "CURRENT").exists():
        return -1
    store = PartitionStore(store_dir, Codec.default(), read_only=True)
    try:
        return store.journal_offset
    finally:
        store.close()


def _w1_once_both_run(state: Path, ns: str) -> list[int]:
    """The partitions w1 owns once w1 and w2 both own some."""
    wait_for(
        lambda: owns(state, ns, "w1") and owns(state, ns, "w2"),
        timeout=60,
        what="both instances to own partitions",
    )
    return owns(state, ns, "w1")


def _restores(log: Path) -> list[tuple[set[int], int]]:
    return [
        ({int(p) for p in m.group(1).split(",")}, int(m.group(2)))
        for m in RESTORED.finditer(log.read_text())
    ]


def test_a_standby_takes_a_killed_owners_partitions_restoring_only_the_last_facts(
    kafka_bootstrap, ns, tmp_path
):
    state = tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", tmp_path / "steps.log", **ENV)
    w2 = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: owns(state, ns, "w1"), timeout=60, what="w1 to own partitions")
        history = [f"h-{i}" for i in range(300)]
        for run_id in history:  # a history the survivor must not read again
            client.start("three_steps", 0, run_id=run_id, wait=False)
        client.flush(30)
        assert results(client, history, timeout=120) == dict.fromkeys(history, 3)

        w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", tmp_path / "steps.log", **ENV)
        theirs = _w1_once_both_run(state, ns)
        ends = journal_ends(kafka_bootstrap, ns)
        copies = {p: state / ns / "w2" / f"p{p}" for p in theirs}
        wait_for(
            lambda: all(_stored_offset(copies[p]) >= ends.get(p, 0) for p in theirs),
            timeout=60,
            what=f"w2's standby copies of {theirs} to catch up",
        )
        history_facts = sum(ends.get(p, 0) for p in theirs)

        live = [f"l-{i}" for i in range(40)]
        for run_id in live:  # under way at the kill: their steps take 1 s each
            client.start("shifts", 1.0, run_id=run_id, wait=False)
        client.flush(30)
        wait_for(
            lambda: (
                (tmp_path / "steps.log").exists()
                and len((tmp_path / "steps.log").read_text().splitlines()) >= 20
            ),
            timeout=60,
            what="steps under way",
        )
        kill(w1)
        outputs = results(client, live, timeout=180)
        client.close()
    finally:
        if w1.poll() is None:
            kill(w1)
        if w2 is not None:
            assert terminate(w2, timeout=60) == 0

    assert outputs == dict.fromkeys(live, 6)
    taken = [(ps, n) for ps, n in _restores(tmp_path / "w2.log") if ps & set(theirs)]
    assert taken, "w2 never restored the killed owner's partitions"
    ps, facts = taken[-1]
    assert set(theirs) <= ps
    # a restore from the journal alone reads every fact of those partitions (thousands);
    # the standby copies leave only what the last moments wrote
    assert history_facts > 1000
    assert facts * 5 < history_facts, f"restored {facts} facts of {history_facts}"
    report = audit(kafka_bootstrap, ns, expect_finished=True)
    assert report.ok, report.violations[:5]
    print(f"\ntakeover of {theirs}: restored {facts} facts; their journal held {history_facts}")


def _copy(store_dir: Path) -> tuple[int, dict[str, int], tuple[int, int] | None]:
    """A projection's journal offset, each run's fact count, and its standby mark."""
    store = PartitionStore(store_dir, Codec.default(), read_only=True)
    try:
        runs = {run_id: store.get(run_id).facts for run_id in store.ids("")}
        return store.journal_offset, runs, store.standby_mark()
    finally:
        store.close()


def _theirs(run_ids: list[str], partitions: list[int]) -> list[str]:
    return [r for r in run_ids if partition_for(r.encode(), PARTITIONS) in partitions]


def test_a_standby_copy_drops_the_runs_its_owner_purged(kafka_bootstrap, ns, tmp_path):
    """With finished_retention the owner purges finished runs and tombstones them in
    ``<ns>.state``; the standby's copies of its partitions drop them too (they would
    otherwise keep every run the owner ever ran), and keep the live ones."""
    env = {**ENV, "RUNSTREAM_SNAPSHOT_INTERVAL": "0.5", "RUNSTREAM_FINISHED_RETENTION": "1"}
    state = tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", **env)
    w2 = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", **env)
        theirs = _w1_once_both_run(state, ns)
        done = [f"done-{i}" for i in range(40)]
        live = [f"live-{i}" for i in range(8)]
        for run_id in done:
            client.start("three_steps", 0, run_id=run_id, wait=False)
        for run_id in live:
            client.start("approval", None, run_id=run_id, wait=False)
        client.flush(30)
        assert results(client, done, timeout=120) == dict.fromkeys(done, 3)
        done_there, live_there = _theirs(done, theirs), _theirs(live, theirs)
        assert done_there and live_there
        copies = {p: state / ns / "w2" / f"p{p}" for p in theirs}

        def runs_in_copies() -> set[str]:
            return {r for p in theirs for r in _copy(copies[p])[1]}

        wait_for(
            lambda: set(live_there) <= runs_in_copies() and not set(done_there) & runs_in_copies(),
            timeout=60,
            what="the standby copies to drop the purged runs",
        )
        assert all((_copy(copies[p])[2] or (0, 0))[0] > 0 for p in theirs)  # markers seen
        client.close()
    finally:
        kill(w1)
        if w2 is not None:
            assert terminate(w2, timeout=60) == 0
    assert "standby replicas stopped" not in (tmp_path / "w2.log").read_text()


def test_after_a_takeover_from_a_standby_the_snapshots_hold_what_the_old_owner_never_wrote(
    kafka_bootstrap, ns, tmp_path
):
    """w1 writes no snapshot after the runs it starts last (60 s interval); w2's standby
    copy tailed them without tracking changes. After SIGKILL of w1, w2's snapshots must
    still hold them, or the next owner restoring from ``<ns>.state`` would lose them."""
    state = tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", **ENV, RUNSTREAM_SNAPSHOT_INTERVAL="60")
    w2 = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        wait_for(lambda: owns(state, ns, "w1"), timeout=60, what="w1 to own partitions")
        history = [f"h-{i}" for i in range(60)]  # before the snapshot of w1's handover
        for run_id in history:
            client.start("three_steps", 0, run_id=run_id, wait=False)
        client.flush(30)
        assert results(client, history, timeout=120) == dict.fromkeys(history, 3)
        w2 = spawn_worker(
            kafka_bootstrap, ns, state, "w2", **ENV, RUNSTREAM_SNAPSHOT_INTERVAL="0.5"
        )
        theirs = _w1_once_both_run(state, ns)
        late = [f"late-{i}" for i in range(40)]  # after w1's last snapshot
        for run_id in late:
            client.start("approval", None, run_id=run_id, wait=False)
        client.flush(30)
        late_there = _theirs(late, theirs)
        assert late_there
        copies = {p: state / ns / "w2" / f"p{p}" for p in theirs}
        wait_for(
            lambda: set(late_there) <= {r for p in theirs for r in _copy(copies[p])[1]},
            timeout=60,
            what="w2's standby copies to hold the late runs",
        )
        assert all((_copy(copies[p])[2] or (0, 0))[0] > 0 for p in theirs)  # a marker seen
        kill(w1)
        wait_for(lambda: len(owns(state, ns, "w2")) == PARTITIONS, timeout=60, what="takeover")

        def snapshots_match() -> bool:
            images = _state_images(kafka_bootstrap, ns)
            for p in theirs:
                offset, runs, _ = _copy(copies[p])
                image = images[p]
                if image.journal_offset != offset:
                    return False
                if {r.run_id: len(r.facts) for r in image.runs()} != runs:
                    return False
            return True

        wait_for(snapshots_match, timeout=60, what="w2's snapshots to hold every run")
        # the runs changed since w1's marker came from the standby's counts, not a re-read
        handed = re.findall(
            r"the standby handed over \[([\d, ]+)\]",
            (tmp_path / "w2.log").read_text(),
        )
        assert handed and set(theirs) <= {int(p) for p in handed[-1].split(",")}
        for run_id in late_there:  # and the runs go on
            client.signal(run_id, "approve", "ann")
        approved = {"approved": True, "by": "ann"}
        assert results(client, late_there, timeout=120) == {r: approved for r in late_there}
        client.close()
    finally:
        if w1.poll() is None:
            kill(w1)
        if w2 is not None:
            assert terminate(w2, timeout=60) == 0


def test_a_standby_with_an_empty_disk_fills_its_copies_from_the_snapshots(
    kafka_bootstrap, ns, tmp_path
):
    """A standby that starts with no copy reads the owner's snapshots, then the journal
    from their offset (not from its beginning), and ends up with the owner's projection."""
    env = {**ENV, "RUNSTREAM_SNAPSHOT_INTERVAL": "0.5"}
    state = tmp_path / "state"
    state.mkdir()
    w1 = spawn_worker(kafka_bootstrap, ns, state, "w1", **env)
    w2 = None
    try:
        client = wait_for(lambda: client_or_none(ns, kafka_bootstrap), what="topics")
        history = [f"h-{i}" for i in range(60)]
        for run_id in history:
            client.start("three_steps", 0, run_id=run_id, wait=False)
        client.flush(30)
        assert results(client, history, timeout=120) == dict.fromkeys(history, 3)
        wait_for(
            lambda: set(history) <= _snapshot_runs(kafka_bootstrap, ns),
            timeout=60,
            what="a snapshot of the history",
        )
        w2 = spawn_worker(kafka_bootstrap, ns, state, "w2", **env)
        theirs = _w1_once_both_run(state, ns)
        for run_id in [f"late-{i}" for i in range(12)]:  # after the copies were filled
            client.start("approval", None, run_id=run_id, wait=False)
        client.flush(30)
        log = tmp_path / "w2.log"
        filled = re.compile(r"standby copy of partition (\d+) filled from its snapshot: (\d+)")
        wait_for(
            lambda: {int(m[1]) for m in filled.finditer(log.read_text())} >= set(theirs),
            timeout=60,
            what="w2's copies filled from the snapshots",
        )
        assert all(int(m[2]) > 0 for m in filled.finditer(log.read_text()))

        def same() -> bool:
            for p in theirs:
                owner = _copy(state / ns / "w1" / f"p{p}")
                copy = _copy(state / ns / "w2" / f"p{p}")
                if owner[:2] != copy[:2]:
                    return False
            return True

        wait_for(same, timeout=60, what="w2's copies to equal w1's projections")
        client.close()
    finally:
        kill(w1)
        if w2 is not None:
            assert terminate(w2, timeout=60) == 0
