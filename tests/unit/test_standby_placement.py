"""Where the warm copies go (`standby.placement`): every member computes the same answer
from the group's assignment, each partition gets up to N standbys, never its owner."""

from __future__ import annotations

from collections import Counter

from runstream.standby import placement

HELD = {"ns.engine.a": [0, 1], "ns.engine.b": [2, 3], "ns.engine.c": [4, 5]}


def test_each_member_keeps_the_partitions_of_the_member_before_it():
    assert placement(HELD, "ns.engine.b", 1) == {0, 1}
    assert placement(HELD, "ns.engine.c", 1) == {2, 3}
    assert placement(HELD, "ns.engine.a", 1) == {4, 5}  # the order wraps around


def test_with_n_replicas_each_partition_has_n_standbys_none_of_them_its_owner():
    for n in (1, 2):
        copies: Counter[int] = Counter()
        for me, mine in HELD.items():
            warm = placement(HELD, me, n)
            assert not warm & set(mine)
            copies.update(warm)
        assert copies == dict.fromkeys(range(6), n)


def test_more_replicas_than_other_members_means_every_other_members_partitions():
    assert placement(HELD, "ns.engine.a", 5) == {2, 3, 4, 5}


def test_a_member_alone_or_unknown_or_without_replicas_keeps_nothing():
    assert placement({"ns.engine.a": [0, 1, 2]}, "ns.engine.a", 1) == set()
    assert placement(HELD, "ns.engine.z", 1) == set()
    assert placement(HELD, "ns.engine.a", 0) == set()


def test_a_copy_no_other_member_owns_is_kept_until_the_takeover_claims_it():
    """When the owner dies the group stops listing it before the survivor owns its
    partitions: dropping the copies then lost the standby's counts, and its takeover read
    the journal again."""
    copies = {0, 1}
    assert placement({"ns.engine.b": [2, 3]}, "ns.engine.b", 1, copies) == {0, 1}  # unowned
    assert placement({"ns.engine.b": [0, 1, 2, 3]}, "ns.engine.b", 1, copies) == {0, 1}  # mine
    assert placement({}, "ns.engine.b", 1, copies) == {0, 1}  # the group mid-rebalance
    owned_by_c = {"ns.engine.a": [4, 5], "ns.engine.b": [2, 3], "ns.engine.c": [0, 1]}
    assert placement(owned_by_c, "ns.engine.b", 1, copies) == {4, 5}  # another's now: let go
