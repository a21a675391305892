"""Which writers of open transactions a takeover may fence (`topics.fencing`)."""

from runstream.topics.fencing import abandoned, instance_of, transactional_ids


def test_the_instance_of_a_writer_is_all_but_its_life_even_with_dots_in_the_id():
    assert instance_of("engine-1.0badc0de") == "engine-1"
    assert instance_of("eu.west.a.0badc0de") == "eu.west.a"


def test_only_writers_gone_from_the_group_and_not_this_instance_are_abandoned():
    members = {"orders.engine.a", "orders.engine.b"}
    writers = ["a.11111111", "c.22222222", "me.33333333", "c.44444444"]
    assert abandoned(writers, members, "orders", own="me") == {"c"}


def test_a_member_of_another_namespaces_group_does_not_keep_a_writer_alive():
    assert abandoned(["a.11111111"], {"billing.engine.a"}, "orders", own="me") == {"a"}


def test_both_producers_of_an_instance_are_fenced():
    assert transactional_ids("orders", "a") == ["orders.engine.a", "orders.engine.a.b"]
