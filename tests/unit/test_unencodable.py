"""Text UTF-8 cannot carry (a lone surrogate, as a ``"\\ud83d"`` JSON escape gives) never
makes a decision unencodable (issue 19, defect 2): free texts are cleaned where facts are
made (`Limits.clip`), and a decision whose records still cannot be encoded (a name or key
the workflow made of such text) is undone and dead-lettered by the decision guard."""

from __future__ import annotations

import pytest

from runstream.engine.limits import Limits, clean
from runstream.engine.work import Batch
from runstream.engine.workflow import Registry, StepPolicy, step_def, workflow_def
from runstream.errors import TerminalStepError
from runstream.schemas.codec import Codec
from runstream.schemas.records import Signal, StartRun
from runstream.topics.outbox import outbox
from runstream.topics.spec import Topics

from .corehelp import Core

CUT = b'"A\\ud83d"'  # JSON of "A" and half an emoji: json.loads gives 'A\ud83d'


async def quotes_its_input(ctx, text: str) -> None:
    raise ValueError(f"cannot take {text}")


def fails_quoting(text: str) -> None:
    raise TerminalStepError(f"cannot take {text}")


async def steps_on_it(ctx, text: str) -> None:
    await ctx.step(fails_quoting, text)


async def waits_for_a_signal_named_by_its_input(ctx, name: str) -> None:
    await ctx.wait_for_signal(name)


async def signalled_then_waits_as_told(ctx, _: str) -> str:
    name = await ctx.wait_for_signal("go")
    await ctx.wait_for_signal(name)
    return "done"


async def completes(ctx, x: int) -> int:
    return x


async def starts_a_child_named_by_its_input(ctx, name: str) -> int:
    return await ctx.child(completes, 1, run_id=name)


async def waits_for_an_event_keyed_by_its_input(ctx, key: str) -> None:
    await ctx.wait_for_event("paid", key=key)


def core() -> Core:
    reg = Registry()
    for wf in (
        quotes_its_input,
        steps_on_it,
        waits_for_a_signal_named_by_its_input,
        signalled_then_waits_as_told,
        completes,
        starts_a_child_named_by_its_input,
        waits_for_an_event_keyed_by_its_input,
    ):
        reg.add_workflow(workflow_def(wf))
    reg.add_step(step_def(fails_quoting, StepPolicy(retries=0)))
    return Core(reg)


def encodes(c: Core) -> None:
    """Every record the core produced encodes, as the shell will encode it."""
    codec = Codec.default()
    for record in [*c.journal, *c.lifecycle, *c.commands, *c.dead, *c.tasks]:
        codec.encode(record)
    for _, info in c.replies:
        codec.encode(info)


def test_clip_replaces_lone_surrogates_and_joins_the_halves_of_a_pair():
    clip = Limits().clip
    assert clip("A\ud83d") == "A\ufffd"
    assert clip("\ude00 and \ud83d") == "\ufffd and \ufffd"
    assert clip("\ud83d\ude00!") == "\U0001f600!"  # both halves: the emoji again
    assert clip("plain, é, \U0001f600") == "plain, é, \U0001f600"
    assert clean("ascii only") == "ascii only"
    clipped = Limits(text=10).clip("\ud83d" * 20)
    assert clipped.startswith("\ufffd" * 10) and clipped.encode()


def test_a_run_failing_with_its_lone_surrogate_input_in_the_error_fails_with_it_cleaned():
    c = core()
    c.command(StartRun("bad", "quotes_its_input", input=CUT))
    c.start("good", "completes", 7)
    (failed,) = c.facts("bad", "RunFailed")
    assert failed.error == "ValueError: cannot take A\ufffd"
    assert "\ufffd" in failed.traceback
    assert c.state("bad").status == "failed" and c.state("good").status == "completed"
    assert not c.dead
    encodes(c)


def test_a_local_step_raising_lone_surrogate_text_fails_with_it_cleaned():
    c = core()
    c.command(StartRun("bad", "steps_on_it", input=CUT))
    (step_failed,) = c.facts("bad", "StepFailed")
    assert step_failed.error == "TerminalStepError: cannot take A\ufffd"
    (failed,) = c.facts("bad", "RunFailed")
    assert (
        failed.error
        == "StepError: step 'fails_quoting' failed: TerminalStepError: cannot take A\ufffd"
    )
    encodes(c)


def test_a_start_whose_decision_names_a_wait_with_such_text_is_dead_lettered_and_rejected():
    c = core()
    c.command(StartRun("bad", "waits_for_a_signal_named_by_its_input", input=CUT))
    c.start("good", "completes", 7)
    (letter,) = c.dead
    assert (letter.code, letter.run_id) == ("unencodable", "bad")
    assert letter.reason.startswith(
        "the decision cannot be recorded: cannot encode SignalAwaited: field(s) name hold text "
        "UTF-8 cannot carry (a lone surrogate)"
    )
    assert c.names("bad") == ["RunRejected"]  # RunStarted was undone with the rest
    assert c.facts("bad")[0].code == "unencodable"
    assert c.state("bad").status == "rejected" and c.state("good").status == "completed"
    encodes(c)


@pytest.mark.parametrize(
    "workflow", ["starts_a_child_named_by_its_input", "waits_for_an_event_keyed_by_its_input"]
)
def test_a_start_whose_workflow_makes_an_id_of_such_text_is_refused_as_unencodable(workflow):
    """The id is checked (its size in UTF-8) before any record holds it: that check fails
    on such text, and the guard refuses the decision as unencodable, not as a bug."""
    c = core()
    c.command(StartRun("bad", workflow, input=CUT))
    (letter,) = c.dead
    assert (letter.code, letter.run_id) == ("unencodable", "bad")
    assert letter.reason.startswith("the decision cannot be recorded: ")
    assert "holds text UTF-8 cannot carry (a lone surrogate)" in letter.reason
    assert c.names("bad") == ["RunRejected"] and not c.commands
    encodes(c)


def test_a_later_unencodable_decision_is_undone_and_dead_lettered_and_the_run_goes_on():
    c = core()
    c.start("r", "signalled_then_waits_as_told", "x")
    before, facts = c.state("r").copy(), len(c.journal)
    # The value arrives as JSON; its lone surrogate would become the next wait's name.
    c.command(Signal("r", "go", payload=CUT, signal_id="s-1"))
    (letter,) = c.dead
    assert (letter.code, letter.run_id) == ("unencodable", "r")
    assert "SignalAwaited" in letter.reason and letter.value is not None  # the Signal, kept
    assert len(c.journal) == facts and c.state("r") == before  # nothing of it remains
    c.signal("r", "go", "next")
    c.signal("r", "next", None)
    assert c.state("r").status == "completed"
    encodes(c)


class Counting(Codec):
    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    def encode(self, record):
        self.encoded += 1
        return super().encode(record)


def test_the_guard_hands_the_bytes_it_encoded_to_the_shell_each_record_encoded_once():
    c = core()
    c.decider.codec = counting = Counting()
    b: Batch = c.start("good", "completes", 7)
    fx = b.effects
    assert counting.encoded == len(fx.facts) + len(fx.lifecycle) > 0  # by the guard
    assert fx.encoded.facts == [Codec.default().encode(f) for f in fx.facts]
    assert fx.encoded.lifecycle == [Codec.default().encode(e) for e in fx.lifecycle]
    counting.encoded = 0
    records, by_run = outbox(b, Topics("t"), counting, 1)
    assert counting.encoded == 0  # the outbox encodes nothing again
    assert [r.value for r in records] == [*fx.encoded.facts, *fx.encoded.lifecycle]
    assert by_run == {"good": fx.encoded.facts}
