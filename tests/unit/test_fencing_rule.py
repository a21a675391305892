"""Which writers of open transactions a takeover may fence (`topics.fencing`)."""

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from runstream.topics.fencing import abandoned, fence_abandoned, instance_of, transactional_ids


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


def test_the_fence_never_raises_when_no_admin_client_can_be_made():
    """The restore's admin client is made on first use (a metadata request): with the
    brokers out of reach that fails, and the fence must leave the transaction to its
    timeout instead of ending the restore."""

    def out_of_reach() -> AdminClient:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker"))

    config = {"bootstrap.servers": "127.0.0.1:1"}
    assert fence_abandoned(out_of_reach, config, "ns", "ns.journal", [0], own="me") == set()
