"""The topic declarations, without a broker."""

from __future__ import annotations

from runstream.topics.spec import topic_specs

MiB = 1024 * 1024
TIME_INDEX_ENTRY = 12  # bytes: the larger of Kafka's two index entries (offset: 8)


def test_every_topic_maps_small_index_files() -> None:
    # Kafka preallocates each new segment's offset and time index at segment.index.bytes
    # (default 10 MiB, sparse) and maps them; the first touch of such a mapping reads
    # ahead over it (3 ms at 10 MiB on an 8 MiB-readahead disk, stalling the broker).
    for spec in topic_specs("shop", task_groups=["mail"]):
        assert int(spec.configs["segment.index.bytes"]) <= MiB, spec.name


def test_small_index_files_do_not_roll_segments_early() -> None:
    # A segment rolls when either index is full: the entries it holds times the bytes of
    # log between two entries must stay well above a few hundred MiB of log.
    for spec in topic_specs("shop", task_groups=["mail"]):
        entries = int(spec.configs["segment.index.bytes"]) // TIME_INDEX_ENTRY
        assert entries * int(spec.configs["index.interval.bytes"]) >= 256 * MiB, spec.name
