"""Each command kind is accepted only for its own kind of id, and entity ids are
unambiguous (issue 19, defect 11)."""

from __future__ import annotations

import pytest

from runstream.engine.workflow import Registry, workflow_def
from runstream.schemas.codec import MAGIC
from runstream.schemas.records import (
    RUN_PERMIT_SEQ,
    Acquire,
    Cancel,
    Grant,
    PublishEvent,
    Reason,
    Release,
    ScheduleCommand,
    Signal,
    Subscribe,
    correlation_id,
    limit_id,
    schedule_id,
)

from .corehelp import Core


async def sleeper(ctx) -> str:
    await ctx.sleep(60)
    return "woke"


def _core() -> Core:
    reg = Registry()
    reg.add_workflow(workflow_def(sleeper))
    core = Core(reg)
    core.start("r", "sleeper")
    return core


@pytest.mark.parametrize(
    "cmd",
    [
        Acquire("r", "x", seq=1, concurrency=1),
        Release("r", "x", seq=1),
        ScheduleCommand("r", "set", workflow="sleeper", input=b"null", cron="* * * * *"),
        PublishEvent("r", "paid", event_id="e1", payload=b"1"),
        Subscribe("r", "paid", subscriber="x", seq=1),
    ],
    ids=lambda c: type(c).__name__,
)
def test_an_entity_command_keyed_by_a_run_id_is_dead_lettered(cmd):
    core = _core()
    before = core.names("r")
    core.command(cmd)
    assert [d.code for d in core.dead] == ["bad-run-id"]
    assert core.names("r") == before  # nothing was written into the run's journal
    core.advance(61)  # and its timer is still the run's own
    assert core.state("r").status == "completed"


@pytest.mark.parametrize(
    "cmd",
    [
        Acquire(correlation_id("paid", "1"), "x", seq=1, concurrency=1),
        Release(schedule_id("nightly"), "x", seq=1),
        ScheduleCommand(limit_id("q"), "set", workflow="sleeper", input=b"null", cron="* * * * *"),
        PublishEvent(limit_id("q"), "paid", event_id="e1", payload=b"1"),
        PublishEvent(  # not its key
            correlation_id("paid", "2"), "paid", event_id="e1", payload=b"1", key="1"
        ),
        Subscribe(correlation_id("other", ""), "paid", subscriber="r", seq=1),
        Signal(limit_id("q"), "go", payload=b"1", signal_id="s1"),
        Cancel(correlation_id("paid", "1")),
        Grant(limit_id("q"), 1, limit=limit_id("q")),
    ],
    ids=lambda c: f"{type(c).__name__}-{c.run_id}",
)
def test_a_command_keyed_by_an_id_of_another_kind_is_dead_lettered(cmd):
    core = _core()
    core.command(cmd)
    assert [d.code for d in core.dead] == ["bad-run-id"]
    assert core.journal == core.facts("r")  # no entity was written to


def test_entity_commands_with_their_own_ids_are_accepted():
    core = _core()
    core.command(Acquire(limit_id("q"), "r", seq=5, concurrency=1))
    core.command(
        PublishEvent(
            correlation_id("paid", "1"), "paid", event_id="e1", payload=b"1", key="1", ttl_ms=9
        )
    )
    core.command(
        ScheduleCommand(
            schedule_id("n"), "set", workflow="sleeper", input=b"null", cron="0 * * * *"
        )
    )
    assert core.dead == []


def test_entity_ids_are_unambiguous():
    assert correlation_id("order/placed", "42") != correlation_id("order", "placed/42")
    assert limit_id("a/b") != limit_id("a", "b")
    assert limit_id("a", "b/c") != limit_id("a/b", "c")
    assert limit_id("a/b") != limit_id("a/b", "")
    assert limit_id("a%2Fb") != limit_id("a/b")
    ids = {
        correlation_id(n, k)
        for n in ("", "a", "a/", "/a", "a/b", "a%2Fb", "a%", "b")
        for k in ("", "b", "/b", "b/", "a/b", "%2F", "/")
    }
    assert len(ids) == 8 * 7


def test_ids_whose_parts_have_no_slash_stay_as_they_were():
    assert correlation_id("order.placed", "42") == "~event/order.placed/42"
    assert correlation_id("paid", "") == "~event/paid/"
    assert limit_id("db") == "~limit/db"
    assert limit_id("checkout", "ada") == "~limit/checkout/ada"
    assert limit_id("n", "x" * 300).startswith("~limit/") and len(limit_id("n", "x" * 300)) == 71


async def keyed(ctx, order: dict) -> str:
    return await ctx.wait_for_signal("go")


def test_a_forged_release_frees_no_permit_and_withdraws_no_request():
    reg = Registry()
    reg.add_workflow(workflow_def(keyed, concurrency_key=lambda order: order["customer"]))
    core = Core(reg)
    limit = limit_id("keyed", "ann")

    def pump() -> None:
        while core.commands:
            core.command(core.commands.pop(0))

    core.start("a", "keyed", {"customer": "ann"})
    pump()
    core.start("b", "keyed", {"customer": "ann"})
    pump()
    assert core.state(limit).queue[0].holder == "b"  # a holds the only permit
    core.command(Release(limit, "a", seq=RUN_PERMIT_SEQ))  # by someone who is not a
    core.command(Release(limit, "b", seq=RUN_PERMIT_SEQ))  # nor b
    pump()
    ent = core.state(limit)
    assert list(ent.held) == [("a", RUN_PERMIT_SEQ)] and [q.holder for q in ent.queue] == ["b"]
    core.signal("a", "go", 1)  # a ends: its own release frees the permit for b
    pump()
    assert list(core.state(limit).held) == [("b", RUN_PERMIT_SEQ)]
    assert "PermitReceived" in core.names("b")


def test_a_permit_asked_before_request_ids_existed_is_still_released():
    core = _core()
    limit = limit_id("q")
    core.command(Acquire(limit, "old", seq=5, concurrency=1))  # as an older engine sent it
    core.command(Acquire(limit, "new", seq=6, concurrency=1))
    core.command(Release(limit, "old", seq=5))  # its release names no request either
    assert list(core.state(limit).held) == [("new", 6)]


def test_a_record_of_a_schema_this_engine_does_not_know_says_to_upgrade_and_redrive():
    """A rolling deploy: a newer engine or client wrote a record type or version this
    engine does not know (Avro single-object encoding, unknown fingerprint). It was
    dead-lettered as undecodable like garbage; the letter now says what it likely is
    and what to do."""
    core = _core()
    core.record(MAGIC + bytes(8) + b"\x02x", key=b"r1")
    [letter] = core.dead
    assert letter.code == Reason.UNKNOWN_SCHEMA
    assert "newer" in letter.reason and "redrive" in letter.reason
    core.record(b"garbage", key=b"r1")
    assert core.dead[-1].code == Reason.UNDECODABLE
