"""A restore reads each journal partition to an end offset Kafka gave: an answer without
one (a negative offset, as for a partition whose leader was killed mid-question) must be
asked again, never read as "nothing to read" (the 3-node drill's skipped handover)."""

import pytest
from confluent_kafka import KafkaException

from runstream.topics.admin import transient
from runstream.topics.kafka import known_ends


def test_end_offsets_kafka_gave_are_kept():
    assert known_ends("j", {0: 91, 1: 0}) == {0: 91, 1: 0}


def test_a_partition_without_an_end_offset_is_a_transient_refusal():
    with pytest.raises(KafkaException) as refused:
        known_ends("j", {0: -1, 1: 91})
    assert transient(refused.value.args[0])
    assert "partitions [0]" in str(refused.value.args[0])
