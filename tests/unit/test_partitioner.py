"""Kafka's Java murmur2 partitioner, in pure Python."""

from __future__ import annotations

import random

import pytest

from runstream.engine.partitioner import murmur2, partition_for

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (signed ints, as Java returns them)
JAVA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("key", "expected"), JAVA_VECTORS)
def test_murmur2_matches_kafka_utils_test(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def _reference_murmur2(data: bytes) -> int:
    """A line-by-line transcription of Java's Utils.murmur2 with explicit int32 wrapping."""

    def i32(x: int) -> int:
        x &= 0xFFFFFFFF
        return x - (1 << 32) if x & 0x80000000 else x

    def ushr(x: int, n: int) -> int:  # Java's >>>
        return (x & 0xFFFFFFFF) >> n

    length = len(data)
    m, r = 0x5BD1E995, 24
    h = i32(0x9747B28C ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = i32(data[i4] | data[i4 + 1] << 8 | data[i4 + 2] << 16 | data[i4 + 3] << 24)
        k = i32(k * m)
        k ^= ushr(k, r)
        k = i32(k * m)
        h = i32(h * m)
        h = i32(h ^ k)
    rest, base = length % 4, length & ~3
    if rest == 3:
        h = i32(h ^ data[base + 2] << 16)
    if rest >= 2:
        h = i32(h ^ data[base + 1] << 8)
    if rest >= 1:
        h = i32(h ^ data[base])
        h = i32(h * m)
    h = i32(h ^ ushr(h, 13))
    h = i32(h * m)
    return i32(h ^ ushr(h, 15))


def test_murmur2_matches_reference_for_every_length() -> None:
    rng = random.Random(7)
    for length in [*range(0, 70), 255, 256, 257, 1000]:
        for _ in range(5):
            data = rng.randbytes(length)
            assert murmur2(data) == _reference_murmur2(data), data


def test_reference_transcription_agrees_with_java_vectors() -> None:
    for key, expected in JAVA_VECTORS:
        assert _reference_murmur2(key) == expected


def test_partition_is_to_positive_modulo() -> None:
    # toPositive(-790332482) = 1357151166
    assert partition_for(b"foobar", 10) == 1357151166 % 10 == 6
    assert partition_for(b"foobar", 50) == 16
    for key, expected in JAVA_VECTORS:
        for n in (1, 3, 12, 64):
            assert partition_for(key, n) == (expected & 0x7FFFFFFF) % n


def test_partition_in_range_stable_and_spread() -> None:
    keys = [f"run-{i}".encode() for i in range(6000)]
    parts = [partition_for(k, 12) for k in keys]
    assert all(0 <= p < 12 for p in parts)
    assert parts == [partition_for(k, 12) for k in keys]  # cached or not, same answer
    counts = [parts.count(p) for p in range(12)]
    assert min(counts) > 350  # about 500 each
    assert partition_for(b"x", 1) == 0


def test_partition_accepts_bytes_like_keys() -> None:
    assert partition_for(bytearray(b"foobar"), 50) == partition_for(b"foobar", 50)
    assert partition_for(memoryview(b"foobar"), 50) == partition_for(b"foobar", 50)
