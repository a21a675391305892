"""`ChangeWindow`: the counts a standby hands its next owner instead of the journal's
re-read. Never fewer records per run than the journal holds from the owner's marker on
(a run the next snapshot missed would be lost to the owner after that one)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstream import standby
from runstream.standby import ChangeWindow

RUNS = st.sampled_from([b"a", b"b", b"c", b"d", None])


@settings(max_examples=1000)  # a lagging marker inside an older segment is rare
@given(
    start=st.integers(0, 50),
    tail=st.lists(st.tuples(RUNS, st.booleans(), st.integers(0, 6)), max_size=80),
)
def test_the_counts_cover_every_record_from_the_marker_on(start, tail):
    """Records tailed one by one; now and then a marker (never ahead of the copy, never
    back) and a cut, as `Standbys._tail` does every half second."""
    window, records, marker, offset = ChangeWindow(start), [], start, start
    for key, cut, step in tail:
        window.add(offset, key)
        records.append((offset, key))
        offset += 1
        if cut:
            marker = min(marker + step, offset)  # the owner's snapshots may lag
            window.cut(marker)
    if marker <= 0:
        assert window.handover(marker, offset) is None
        return
    handover = window.handover(marker, offset)
    assert handover is not None and handover.read_to == offset
    counts = handover.runs
    exact: dict[str, int] = {}
    for o, key in records:
        if o >= marker and key is not None:
            exact[key.decode()] = exact.get(key.decode(), 0) + 1
    for run_id, n in exact.items():
        assert counts.get(run_id, 0) >= n, (run_id, counts, exact)
    everything = len([k for o, k in records if k is not None])
    assert sum(counts.values()) <= everything


def test_a_marker_drops_the_segments_wholly_before_it():
    window = ChangeWindow(10)
    window.add(10, b"old")
    window.add(11, b"old")
    window.cut(10)  # the copy's marker: a segment [10, 12) ends
    window.add(12, b"new")
    window.cut(12)  # the owner's next marker, at 12: [10, 12) is before it
    assert window.start == 12
    assert window.handover(12, 13) == ({"new": 1}, 13)


def test_a_marker_inside_a_segment_keeps_it_whole():
    window = ChangeWindow(10)
    window.add(10, b"before")
    window.add(11, b"after")
    window.cut(11)  # the marker falls inside [10, 12)
    assert window.handover(11, 12) == ({"before": 1, "after": 1}, 12)


def test_a_lagging_marker_inside_an_older_segment_keeps_that_one_and_those_after():
    window = ChangeWindow(0)
    for offset in range(3):
        window.add(offset, b"early")
    window.cut(0)  # [0, 3)
    for offset in range(3, 8):
        window.add(offset, b"middle")
    window.cut(0)  # [3, 8): the owner's snapshot still at 0
    window.add(8, b"late")
    window.cut(5)  # a marker inside [3, 8)
    assert window.start == 3
    assert window.handover(5, 9) == ({"middle": 5, "late": 1}, 9)


def test_no_counts_when_the_window_does_not_cover_the_marker_or_the_copys_end():
    window = ChangeWindow(20)
    window.add(20, b"a")
    assert window.handover(15, 21) is None  # records 15..19 were never counted here
    assert window.handover(20, 22) is None  # the copy is past what was counted
    assert window.handover(0, 21) is None  # no marker seen: every run is marked anyway
    assert window.handover(20, 21) == ({"a": 1}, 21)


def test_a_window_grown_past_its_bound_starts_again(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(standby, "WINDOW_RUNS", 3)
    window = ChangeWindow(0)
    for i, run in enumerate([b"a", b"b", b"c", b"d"]):
        window.add(i, run)
    window.cut(1)  # an owner whose snapshots lag: four runs counted, the bound is three
    assert window.start == 4
    assert window.handover(1, 4) is None  # the takeover reads the journal again
    window.add(4, b"e")
    window.cut(4)
    assert window.handover(4, 5) == ({"e": 1}, 5)


def test_the_copy_is_read_past_markers_its_records_never_show():
    """The reader's end (its EOF: the last stable offset) passes commit markers and
    aborted records; the takeover reads the journal from there, not from the last fact."""
    window = ChangeWindow(10)
    window.add(10, b"a")
    window.reached(12)  # offset 11 is the transaction's commit marker
    window.reached(11)  # an older position never moves it back
    assert window.handover(10, 11) == ({"a": 1}, 12)
