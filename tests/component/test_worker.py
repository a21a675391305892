"""The worker's own logic over the in-memory log: abort and redo, undo of a failed
decision, forwarding, revocation mid-batch, one timer entry per timer.

Real RocksDB (in tmp_path), real threads for step bodies, the real core; only Kafka is
the in-memory twin (`memlog`). What Kafka itself does is tested in ``tests/kafka``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import runstream
from runstream.audit import check_run
from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.engine.requests import Overrun
from runstream.engine.rules import HANDLERS, Entry, Rules
from runstream.runtime.inbox import IDLE_WAIT, JOINING_POLL
from runstream.schemas.codec import Codec
from runstream.schemas.records import Record, Signal, StartRun

from .memlog import ABORTABLE, Cluster, MemoryLog

CODEC = Codec.default()


def make_app(ns: str, bodies: Counter[str], gate: threading.Event | None = None) -> runstream.App:
    app = runstream.App(ns)

    @app.step
    def add_one(x: int) -> int:
        bodies[f"add_one {x}"] += 1
        return x + 1

    @app.step
    def slow(x: int) -> int:
        bodies[f"slow {x}"] += 1
        assert gate is not None and gate.wait(10)
        return x

    @app.workflow
    async def three(ctx: runstream.Context, x: int) -> int:
        for _ in range(3):
            x = await ctx.step(add_one, x)
        return x

    @app.workflow
    async def gated(ctx: runstream.Context, x: int) -> int:
        return await ctx.step(slow, x)

    @app.step
    def dawdle(x: int) -> int:
        bodies[f"dawdle {x}"] += 1
        time.sleep(0.3)
        return x

    @app.workflow
    async def dawdles(ctx: runstream.Context, x: int) -> int:
        x = await ctx.step(dawdle, x)
        x = await ctx.step(add_one, x)
        return await ctx.step(add_one, x)

    @app.workflow
    async def nap(ctx: runstream.Context) -> str:
        await ctx.sleep(3600)
        return "rested"

    return app


class Rig:
    """One worker over the shared in-memory cluster, driven one loop turn at a time."""

    def __init__(
        self, app: runstream.App, cluster: Cluster, tmp: Path, name: str = "w1", **settings: Any
    ) -> None:
        self.cluster, self.log = cluster, MemoryLog(cluster, app.namespace)
        settings = runstream.Settings(
            instance_id=name, state_dir=tmp, exit_on_hang=False, **settings
        )
        self.worker = runstream.Worker(app, settings, log=self.log)
        assert self.worker._connect() is self.log

    def turn(self) -> None:
        w = self.worker
        w._restore_assigned(self.log)
        w._process(self.log, w._poll(self.log))

    def until(self, done: Callable[[], bool], turns: int = 500) -> None:
        for _ in range(turns):
            self.turn()
            if done():
                return
            time.sleep(0.002)
        raise AssertionError("not done")

    def close(self) -> None:
        self.worker._close()


def send(cluster: Cluster, ns: str, cmd: Record, partition: int | None = None) -> None:
    key = cmd.run_id.encode()  # type: ignore[attr-defined]
    home = partition_for(key, cluster.partitions)
    cluster.append(
        f"{ns}.commands", home if partition is None else partition, key, CODEC.encode(cmd)
    )


def start(cluster: Cluster, ns: str, run_id: str, workflow: str, value: Any = None) -> None:
    send(cluster, ns, StartRun(run_id, workflow, input=payload.dumps(value)))


def facts(cluster: Cluster, ns: str, run_id: str | None = None) -> list[Any]:
    out = [CODEC.decode(v) for _, _, _, v in cluster.all(f"{ns}.journal")]
    return [f for f in out if run_id is None or f.run_id == run_id]


def ended(cluster: Cluster, ns: str) -> dict[str, Any]:
    """run id -> its output, for every completed run."""
    return {
        f.run_id: payload.loads(f.output)
        for f in facts(cluster, ns)
        if type(f).__name__ == "RunCompleted"
    }


def dead_letters(cluster: Cluster, ns: str) -> list[Any]:
    return [CODEC.decode(v) for _, _, _, v in cluster.all(f"{ns}.dlq")]


@pytest.fixture
def ns() -> str:
    return "mem"


def test_an_aborted_transaction_is_redone_without_loss_or_double_steps(tmp_path, ns):
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path)
    rig.log.assign([0, 1, 2, 3])
    for i in range(10):
        start(cluster, ns, f"r{i}", "three", i * 10)
    rig.log.fail("send_offsets_to_transaction", ABORTABLE)  # the batch of starts
    rig.turn()
    rig.turn()
    assert rig.log.aborts == 1 and not facts(cluster, ns)  # nothing of it is visible
    rig.log.fail("send_offsets_to_transaction", ABORTABLE)  # a batch that records step outcomes
    rig.until(lambda: len(ended(cluster, ns)) == 10)
    assert rig.log.aborts == 2
    assert ended(cluster, ns) == {f"r{i}": i * 10 + 3 for i in range(10)}
    assert set(bodies.values()) == {1} and len(bodies) == 30  # no body ran twice
    for i in range(10):
        assert check_run(facts(cluster, ns, f"r{i}"), expect_finished=True) == []
    rig.close()


def test_a_failed_decision_is_undone_and_dead_lettered_while_its_batch_commits(
    tmp_path, ns, monkeypatch
):
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path)
    rig.log.assign([0, 1, 2, 3])
    rig.turn()
    for run_id in ("ok1", "bad", "ok2"):
        start(cluster, ns, run_id, "nap")
    rig.until(lambda: {"ok1", "bad", "ok2"} <= {f.run_id for f in facts(cluster, ns)})
    kind, signal_rule = HANDLERS[Signal]

    def buggy(rules: Rules, b: Any, st: Any, cmd: Signal) -> None:
        signal_rule(rules, b, st, cmd)  # records SignalBuffered, then fails
        if st.run_id == "bad":
            raise RuntimeError("a bug in a rule")

    monkeypatch.setitem(HANDLERS, Signal, Entry(kind, buggy))
    for run_id in ("ok1", "bad", "ok2"):
        send(cluster, ns, Signal(run_id, "hello", payload=b"1", signal_id=f"s-{run_id}"))
    rig.until(lambda: len(dead_letters(cluster, ns)) == 1)
    (letter,) = dead_letters(cluster, ns)
    assert (letter.code, letter.run_id) == ("internal-error", "bad")
    assert "a bug in a rule" in letter.reason and letter.source_topic == f"{ns}.commands"
    buffered = [f.run_id for f in facts(cluster, ns) if type(f).__name__ == "SignalBuffered"]
    assert sorted(buffered) == ["ok1", "ok2"]  # the bad decision left nothing behind
    rig.close()


def test_a_command_on_the_wrong_partition_is_forwarded_to_its_own(tmp_path, ns):
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path)
    rig.log.assign([0, 1, 2, 3])
    home = partition_for(b"lost", cluster.partitions)
    wrong = (home + 1) % cluster.partitions
    send(cluster, ns, StartRun("lost", "three", input=b"1"), partition=wrong)
    rig.until(lambda: "lost" in ended(cluster, ns))
    assert ended(cluster, ns)["lost"] == 4
    commands = cluster.all(f"{ns}.commands")
    assert sorted(p for p, _, k, _ in commands if k == b"lost") == sorted([wrong, home])  # once
    assert {p for p, _, k, _ in cluster.all(f"{ns}.journal") if k == b"lost"} == {home}
    assert cluster.committed[wrong] == 1  # the misplaced one is consumed, not read again
    rig.close()


def test_a_step_that_ends_within_the_handover_timeout_is_committed_before_the_partition_goes(
    tmp_path, ns
):
    cluster, bodies, gate = Cluster(), Counter[str](), threading.Event()
    app = make_app(ns, bodies, gate)
    w1 = Rig(app, cluster, tmp_path, "w1", handover_timeout=10)
    w1.log.assign([0, 1, 2, 3])
    start(cluster, ns, "g", "gated", 7)
    w1.until(lambda: bodies["slow 7"] == 1)  # its step body runs on w1
    p = partition_for(b"g", cluster.partitions)
    w1.log.revoke([p])
    threading.Timer(0.3, gate.set).start()  # the body ends while w1 hands p over
    w1.turn()  # revoked inside poll, mid-flight: waits for the step, commits it
    assert "StepCompleted" in [type(f).__name__ for f in facts(cluster, ns, "g")]
    w2 = Rig(app, cluster, tmp_path, "w2")
    w2.log.assign([p])
    w2.until(lambda: "g" in ended(cluster, ns))
    assert ended(cluster, ns) == {"g": 7}
    assert bodies["slow 7"] == 1  # never again on w2
    run = [type(f).__name__ for f in facts(cluster, ns, "g")]
    assert "RunRecovered" not in run and "StepHandedOver" not in run
    assert check_run(facts(cluster, ns, "g"), expect_finished=True) == []
    w1.close()
    w2.close()


def test_a_step_still_running_at_the_handover_timeout_runs_again_uncharged_on_the_next_owner(
    tmp_path, ns
):
    cluster, bodies, gate = Cluster(), Counter[str](), threading.Event()
    app = make_app(ns, bodies, gate)
    w1 = Rig(app, cluster, tmp_path, "w1", handover_timeout=0.2)
    w1.log.assign([0, 1, 2, 3])
    start(cluster, ns, "g", "gated", 7)
    w1.until(lambda: bodies["slow 7"] == 1)  # its step body runs on w1
    p = partition_for(b"g", cluster.partitions)
    w1.log.revoke([p])
    w1.turn()  # revoked inside poll, mid-flight: the step outlives the handover timeout
    w2 = Rig(app, cluster, tmp_path, "w2")
    w2.log.assign([p])
    w2.until(lambda: bodies["slow 7"] == 2)  # started again at once, not held for a recovery
    gate.set()  # both bodies return now: only w2's outcome may be recorded
    w2.until(lambda: "g" in ended(cluster, ns))
    for _ in range(5):
        w1.turn()
    assert ended(cluster, ns) == {"g": 7}
    run = facts(cluster, ns, "g")
    names = [type(f).__name__ for f in run]
    assert names.count("StepCompleted") == 1
    assert "RunRecovered" not in names  # a handover is not a crash: nothing charged
    (handed,) = [f for f in run if type(f).__name__ == "StepHandedOver"]
    assert handed.ran and handed.attempt == 1
    started = [f for f in run if type(f).__name__ == "StepStarted"]
    assert [(f.attempt, f.isolated) for f in started] == [(1, False), (1, False)]
    assert check_run(run, expect_finished=True) == []
    assert w1.worker.stats["aborted"] == 0 and w1.worker.stats["handed_over"] == 1
    w1.close()
    w2.close()


def test_an_outcome_set_back_by_an_aborted_commit_is_committed_by_the_handover(tmp_path, ns):
    """The commit of a step's outcome aborts and the batch is to be redone, then the
    partition is revoked: the handover commits that outcome (its body ran), it does not
    hand the step over to run again."""
    cluster, bodies, gate = Cluster(), Counter[str](), threading.Event()
    app = make_app(ns, bodies, gate)
    w1 = Rig(app, cluster, tmp_path, "w1", chain_budget=0)
    w1.log.assign([0, 1, 2, 3])
    start(cluster, ns, "g", "gated", 7)
    w1.until(lambda: bodies["slow 7"] == 1)
    w1.log.fail("send_offsets_to_transaction", ABORTABLE)
    gate.set()
    w1.until(lambda: w1.log.aborts == 1)  # the outcome waits for the redo
    w1.log.revoke([partition_for(b"g", cluster.partitions)])
    w1.turn()  # revoked before the redo
    w2 = Rig(app, cluster, tmp_path, "w2")
    w2.log.assign([0, 1, 2, 3])
    w2.until(lambda: "g" in ended(cluster, ns))
    assert bodies["slow 7"] == 1
    assert "StepHandedOver" not in [type(f).__name__ for f in facts(cluster, ns, "g")]
    w1.close()
    w2.close()


def test_the_client_that_started_a_run_hears_its_end_from_the_next_owner(tmp_path, ns):
    """The start's question is in RunStarted: the instance that owns the run when it ends
    answers it, though the one that took the start is gone."""
    cluster, bodies, gate = Cluster(), Counter[str](), threading.Event()
    app = make_app(ns, bodies, gate)
    w1 = Rig(app, cluster, tmp_path, "w1", handover_timeout=0)
    w1.log.assign([0, 1, 2, 3])
    cmd = StartRun("g", "gated", input=payload.dumps(7), reply_to="client-1", request_id="q1")
    send(cluster, ns, cmd)
    w1.until(lambda: bodies["slow 7"] == 1)
    w1.log.revoke([0, 1, 2, 3])
    w1.turn()
    w2 = Rig(app, cluster, tmp_path, "w2")
    w2.log.assign([0, 1, 2, 3])
    gate.set()
    w2.until(lambda: "g" in ended(cluster, ns))
    replies = [(k, CODEC.decode(v)) for _, _, k, v in cluster.all(f"{ns}.replies")]
    assert [(k, r.request_id, r.status) for k, r in replies] == [(b"client-1", "q1", "completed")]
    w1.close()
    w2.close()


def test_a_sleeping_run_has_one_timer_entry_however_often_it_is_touched(tmp_path, ns):
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path)
    rig.log.assign([0, 1, 2, 3])
    start(cluster, ns, "sleeper", "nap")
    rig.until(lambda: len(rig.worker._inbox.timers) == 1)
    for i in range(20):  # each signal commits a fact of the run, its timer unchanged
        send(cluster, ns, Signal("sleeper", "poke", payload=b"1", signal_id=f"s{i}"))
        rig.turn()
    assert len(facts(cluster, ns, "sleeper")) == 22
    assert len(rig.worker._inbox.timers) == 1 and len(rig.worker._inbox.timers._heap) == 1
    rig.close()


def _commits_of(cluster: Cluster, ns: str, run_id: str, log: MemoryLog) -> int:
    """How many transactions wrote facts of ``run_id`` (the journal records each commit's
    facts together, and MemoryLog counts commits as they happen)."""
    return len({batch for batch, f in log.journal_batches if f.run_id == run_id})


def test_a_chain_of_quick_steps_commits_in_one_transaction(tmp_path, ns):
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path, chain_budget=2.0)
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: len(rig.worker._owned) == 4)  # restored: commands from now on are fresh
    start(cluster, ns, "quick", "three", 1)
    rig.until(lambda: "quick" in ended(cluster, ns))
    names = [type(f).__name__ for f in facts(cluster, ns, "quick")]
    assert names == ["RunStarted", *["StepStarted", "StepCompleted"] * 3, "RunCompleted"]
    assert _commits_of(cluster, ns, "quick", rig.log) == 1
    rig.close()


def test_a_command_a_former_owner_may_have_seen_commits_each_step_start_first(tmp_path, ns):
    cluster, bodies = Cluster(), Counter[str]()
    start(cluster, ns, "old", "three", 1)  # on the log before this instance took over
    rig = Rig(make_app(ns, bodies), cluster, tmp_path, chain_budget=2.0)
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: "old" in ended(cluster, ns))
    # the step the old command starts is committed first; its outcome, ours, chains on
    assert _commits_of(cluster, ns, "old", rig.log) == 2
    start(cluster, ns, "new", "three", 1)  # fresh: chained
    rig.until(lambda: "new" in ended(cluster, ns))
    assert _commits_of(cluster, ns, "new", rig.log) == 1
    rig.close()


def test_steps_a_chain_ran_before_its_aborted_commit_do_not_run_again(tmp_path, ns):
    """The outcomes of an aborted chain are kept: the redone batch schedules the same
    attempts, which take them instead of running their bodies a second time."""
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path, chain_budget=2.0)
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: len(rig.worker._owned) == 4)  # restored: commands from now on are fresh
    for i in range(5):
        start(cluster, ns, f"r{i}", "three", i * 10)
    rig.log.fail("send_offsets_to_transaction", ABORTABLE)  # the chain of the starts
    rig.until(lambda: len(ended(cluster, ns)) == 5)
    assert rig.log.aborts == 1
    assert ended(cluster, ns) == {f"r{i}": i * 10 + 3 for i in range(5)}
    assert set(bodies.values()) == {1} and len(bodies) == 15  # no body ran twice
    for i in range(5):
        assert check_run(facts(cluster, ns, f"r{i}"), expect_finished=True) == []
    rig.close()


def test_a_step_still_running_when_its_chain_aborts_runs_once(tmp_path, ns):
    """The chain's budget ran out with the step still running, and the commit aborted: the
    redone batch schedules the attempt again, and it waits for the one running."""
    cluster, bodies, gate = Cluster(), Counter[str](), threading.Event()
    rig = Rig(make_app(ns, bodies, gate), cluster, tmp_path, chain_budget=0.01)
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: len(rig.worker._owned) == 4)
    start(cluster, ns, "g", "gated", 7)
    rig.log.fail("send_offsets_to_transaction", ABORTABLE)
    rig.until(lambda: rig.log.aborts == 1)
    rig.until(lambda: facts(cluster, ns, "g"))  # redone and committed, the body still held
    gate.set()
    rig.until(lambda: "g" in ended(cluster, ns))
    assert ended(cluster, ns) == {"g": 7}
    assert bodies == {"slow 7": 1}
    assert check_run(facts(cluster, ns, "g"), expect_finished=True) == []
    rig.close()


def test_after_an_aborted_commit_no_step_runs_ahead_of_the_next_commit(tmp_path, ns):
    """A commit aborted (an instance SIGSTOPped past its session wakes up with its
    transaction aborted and its partitions perhaps taken by another owner, which may have run
    and committed the run's next steps). Until one of its commits succeeds again, the
    instance starts no step before its start is committed: a zombie's commits fail, so it
    runs no new body. (Found by the chaos suite: a woken instance ran a step that another
    owner had committed half a second before.)"""
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path, chain_budget=0.05)
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: len(rig.worker._owned) == 4)  # restored: commands from now on are fresh
    start(cluster, ns, "z", "dawdles", 1)  # its slow step outlasts the first chain's budget
    rig.log.fail("send_offsets_to_transaction", ABORTABLE, times=10_000)  # a zombie, fenced
    rig.until(lambda: rig.log.aborts >= 1)
    deadline = time.monotonic() + 1.0  # the slow step's outcome comes back meanwhile
    while time.monotonic() < deadline:
        rig.turn()
    assert bodies == {"dawdle 1": 1}  # its outcome started no body ahead of a commit
    rig.log._faults.clear()  # the instance is the owner again (it rejoined the group)
    rig.until(lambda: "z" in ended(cluster, ns))
    assert ended(cluster, ns) == {"z": 3}
    assert set(bodies.values()) == {1}
    assert check_run(facts(cluster, ns, "z"), expect_finished=True) == []
    rig.close()


def test_a_remote_attempt_taken_over_by_a_new_owner_still_times_out(tmp_path, ns):
    """The new owner's first liveness check only grants the attempt a full heartbeat
    interval from the takeover: a state change with no fact, which must still be kept
    and its timer armed, so the silent attempt times out after that interval."""
    cluster, app = Cluster(), runstream.App(ns)

    @app.step(group="nobody", heartbeat=1, retries=0)
    def far(x: int) -> int:
        raise AssertionError("a remote step never runs in the engine")

    @app.workflow
    async def remote(ctx: runstream.Context, x: int) -> int:
        return await ctx.step(far, x)

    w1 = Rig(app, cluster, tmp_path, "w1")
    w1.log.assign([0, 1, 2, 3])
    start(cluster, ns, "r", "remote", 1)
    w1.until(lambda: "StepStarted" in [type(f).__name__ for f in facts(cluster, ns, "r")])
    w1.close()
    time.sleep(1.1)  # its heartbeat interval passes while no instance owns the run
    w2 = Rig(app, cluster, tmp_path, "w2")
    w2.log.assign([0, 1, 2, 3])
    w2.until(lambda: len(w2.worker._owned) == 4)
    w2.turn()  # the liveness check: one interval from the takeover, no fact
    assert not [f for f in facts(cluster, ns, "r") if type(f).__name__ == "StepFailed"]
    p = partition_for(b"r", cluster.partitions)
    assert (p, "r", 1) in w2.worker._inbox.timers._due  # armed again for that interval
    w2.until(lambda: "StepFailed" in [type(f).__name__ for f in facts(cluster, ns, "r")], 3000)
    assert w2.worker._owned.load(p, "r").status == "failed"
    w2.close()


def test_an_instance_owning_no_partition_polls_briefly_so_its_assignment_is_restored_at_once(
    tmp_path, ns
):
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path)
    waits: list[float] = []
    poll = rig.log.poll

    def noting(timeout: float, limit: int) -> list[Any]:
        waits.append(timeout)
        return poll(timeout, limit)

    rig.log.poll = noting  # type: ignore[method-assign]
    rig.turn()  # nothing assigned yet
    rig.log.assign([0, 1, 2, 3])
    rig.turn()  # the assignment comes inside this poll
    rig.turn()  # restored: idle, no timer, so the usual wait
    assert waits == [JOINING_POLL, JOINING_POLL, IDLE_WAIT]
    assert len(rig.worker._owned) == 4
    rig.close()


def test_a_batch_dropped_by_an_overrun_reads_again_the_commands_it_had_not_decided(
    tmp_path, ns, monkeypatch
):
    """An activation overrun ends the deciding of a batch at any item: every command the
    batch took is read again, those not decided yet too (not only the consumed ones)."""
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path)
    rig.log.assign([0, 1, 2, 3])
    rig.turn()
    for i in range(10):
        start(cluster, ns, f"r{i}", "three", i * 10)
    decider = rig.worker._decider
    assert decider is not None
    handle = decider.handle

    def overrun_once(b: Any, item: Any) -> Any:
        monkeypatch.setattr(decider, "handle", handle)
        raise Overrun()

    monkeypatch.setattr(decider, "handle", overrun_once)
    rig.turn()
    assert rig.worker.stats["aborted"] == 1 and not facts(cluster, ns)
    rig.until(lambda: len(ended(cluster, ns)) == 10)
    assert ended(cluster, ns) == {f"r{i}": i * 10 + 3 for i in range(10)}
    rig.close()


def _freeze(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the process's monotonic clock on by ``seconds``, as a SIGSTOP that long would
    (the group's session ran on meanwhile; the process saw nothing of it)."""
    now = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: now() + seconds)


def _frozen_then_fenced_runs_nothing_ahead(
    rig: Rig, cluster: Cluster, ns: str, bodies: Counter[str], before: dict[str, int]
) -> None:
    """Start run "s" of the rig's ``stalls`` workflow, which freezes the instance and
    fences its commits on the way: while they fail, only ``before`` ran (its step
    `after` did not run ahead); then the instance commits and the run ends."""
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: len(rig.worker._owned) == 4)
    start(cluster, ns, "s", "stalls", 1)
    rig.until(lambda: rig.log.aborts >= 3)
    assert bodies == before  # `after` did not run ahead of the failing commits
    rig.log._faults.clear()
    rig.until(lambda: "s" in ended(cluster, ns))
    assert ended(cluster, ns)["s"] == 2
    assert bodies == {**before, "after": 1}
    assert check_run(facts(cluster, ns, "s"), expect_finished=True) == []
    rig.close()


def test_an_instance_frozen_past_its_session_runs_no_step_ahead_of_its_next_commit(
    tmp_path, ns, monkeypatch
):
    """A process frozen (SIGSTOP, a paused VM) longer than its group session wakes up a
    zombie: another owner may have taken its partitions and run their steps, and it only
    learns so at its next commit, which fails. Its chain ran steps ahead of that commit
    (found by the chaos suite: four bodies of a limit-2 step at once). A commit that sent
    offsets proves the instance was a member when it was made; once the last proof is
    older than the session allows, no step starts before a commit proves it again."""
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path, chain_budget=2.0)
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: len(rig.worker._owned) == 4)  # restored: commands from now on are fresh
    start(cluster, ns, "before", "three", 1)
    rig.until(lambda: "before" in ended(cluster, ns))
    assert _commits_of(cluster, ns, "before", rig.log) == 1  # a member: it chains
    _freeze(monkeypatch, 14.0)  # past the 10 s session
    start(cluster, ns, "z", "three", 10)
    rig.log.fail("send_offsets_to_transaction", ABORTABLE, times=10_000)  # a zombie, fenced
    rig.until(lambda: rig.log.aborts >= 3)
    assert "add_one 10" not in bodies  # nothing ran ahead of a commit that failed
    rig.log._faults.clear()  # it is still the owner after all (its session held)
    rig.until(lambda: "z" in ended(cluster, ns))
    assert ended(cluster, ns)["z"] == 13
    assert _commits_of(cluster, ns, "z", rig.log) == 2  # the start first, then it chains
    assert set(bodies.values()) == {1}
    assert check_run(facts(cluster, ns, "z"), expect_finished=True) == []
    rig.close()


def test_an_instance_frozen_during_its_chain_starts_no_further_step_ahead_of_the_commit(
    tmp_path, ns, monkeypatch
):
    """The freeze may fall inside a chain (a step body ran while the process stood still):
    the outcome that comes after it is decided, but the step it schedules waits for the
    commit, which fails while the instance is a zombie."""
    cluster, bodies, app = Cluster(), Counter[str](), runstream.App(ns)
    rig: Rig

    @app.step
    def stall(x: int) -> int:
        bodies["stall"] += 1
        if bodies["stall"] == 1:
            _freeze(monkeypatch, 14.0)
            rig.log.fail("send_offsets_to_transaction", ABORTABLE, times=10_000)
        return x

    @app.step
    def after(x: int) -> int:
        bodies["after"] += 1
        return x + 1

    @app.workflow
    async def stalls(ctx: runstream.Context, x: int) -> int:
        return await ctx.step(after, await ctx.step(stall, x))

    rig = Rig(app, cluster, tmp_path, chain_budget=2.0)
    _frozen_then_fenced_runs_nothing_ahead(rig, cluster, ns, bodies, {"stall": 1})


def test_a_step_queued_ahead_of_a_commit_that_aborts_waits_for_the_next_commit(tmp_path, ns):
    """A chain's step may wait in the queue behind busy step threads. If the commit then
    aborts (a zombie's does), it must not start later on its own: it is dropped from the
    queue and the redone batch starts it once a commit succeeds."""
    cluster, bodies = Cluster(), Counter[str]()
    rig = Rig(make_app(ns, bodies), cluster, tmp_path, chain_budget=0.05, step_concurrency=1)
    rig.log.assign([0, 1, 2, 3])
    rig.until(lambda: len(rig.worker._owned) == 4)
    start(cluster, ns, "busy", "dawdles", 1)  # its 0.3 s step holds the only step thread
    rig.until(lambda: "dawdle 1" in bodies)
    start(cluster, ns, "queued", "three", 10)  # its step waits behind it
    rig.log.fail("send_offsets_to_transaction", ABORTABLE, times=10_000)  # a zombie, fenced
    rig.until(lambda: rig.log.aborts >= 1)
    deadline = time.monotonic() + 1.0  # the busy step ends meanwhile: the thread is free
    while time.monotonic() < deadline:
        rig.turn()
    assert bodies == {"dawdle 1": 1}  # the queued step did not start after the abort
    rig.log._faults.clear()
    rig.until(lambda: {"busy", "queued"} <= ended(cluster, ns).keys())
    assert ended(cluster, ns) == {"busy": 3, "queued": 13}
    assert set(bodies.values()) == {1}
    for run_id in ("busy", "queued"):
        assert check_run(facts(cluster, ns, run_id), expect_finished=True) == []
    rig.close()


def test_an_instance_frozen_while_it_decides_starts_no_step_ahead_of_the_commit(
    tmp_path, ns, monkeypatch
):
    """The freeze may fall while the batch is decided (the run's code ran while the
    process stood still): the steps it schedules wait for the commit."""
    cluster, bodies, app = Cluster(), Counter[str](), runstream.App(ns)
    rig: Rig

    @app.step
    def after(x: int) -> int:
        bodies["after"] += 1
        return x + 1

    @app.workflow
    async def stalls(ctx: runstream.Context, x: int) -> int:
        if not bodies["frozen"]:  # its first activation, as the batch is decided
            bodies["frozen"] += 1
            _freeze(monkeypatch, 14.0)
            rig.log.fail("send_offsets_to_transaction", ABORTABLE, times=10_000)
        return await ctx.step(after, x)

    rig = Rig(app, cluster, tmp_path, chain_budget=2.0)
    _frozen_then_fenced_runs_nothing_ahead(rig, cluster, ns, bodies, {"frozen": 1})
