"""Task group pause: an operator holds every remote step of a task group still.

The pause is a fact on each journal partition: the entity ``~taskgroup/<group>/<p>.<salt>``
(`partitioner.task_group_id`), which hashes to partition ``p``, records GroupPaused and
GroupUnpaused; a client sends one Pause (or Unpause) per partition. So the owner of a
partition, after a crash or a handover, restores the pause with the runs it holds, from
the journal: nothing else needs to be asked.

While its group is paused on the run's partition, a remote attempt that is due (a first
attempt, a retry whose backoff ended, a step whose permit came) is not sent: the run
records StepHeld at its seq (the step waits, on "group G paused"), and the group's
entity records TaskHeld for it, in the same decision (both keys are on the partition).
Attempts already sent finish and are recorded as usual. On unpause the entity sends
each holder a ReleaseTask: the run starts the attempt then, with its whole timeout (the
clock of a step that was never sent does not run). A run that ended meanwhile (a cancel,
its execution timeout) ignores it. Duplicates change nothing: a pause of a paused group,
an unpause of a group not paused, a command id recorded already, a ReleaseTask for a step
not held.
"""

from __future__ import annotations

from runstream.engine.partitioner import task_group_id
from runstream.engine.rules import core
from runstream.engine.rules.context import Rejected, Rules
from runstream.engine.state import RunState, TaskGroupState
from runstream.engine.work import Batch
from runstream.schemas.records import (
    GroupPaused,
    GroupUnpaused,
    Kind,
    LifecycleEvent,
    Pause,
    Reason,
    ReleaseTask,
    StepHeld,
    TaskHeld,
    Unpause,
    task_group_of,
)


def pause(ctx: Rules, b: Batch, st: TaskGroupState, cmd: Pause) -> None:
    """Pause the group on this partition (a fact: who, why)."""
    _check(ctx, b, st)
    if st.paused is not None or (cmd.pause_id and cmd.pause_id in st.pause_ids):
        return
    reason, by = ctx.limits.clip(cmd.reason or "paused"), ctx.limits.clip(cmd.by)
    core.emit(b, st, GroupPaused(st.run_id, b.now, reason=reason, by=by, pause_id=cmd.pause_id))


def unpause(ctx: Rules, b: Batch, st: TaskGroupState, cmd: Unpause) -> None:
    """Unpause the group on this partition: every run holding a step of it is told."""
    _check(ctx, b, st)
    if st.paused is None or (cmd.pause_id and cmd.pause_id in st.pause_ids):
        return
    held, group = list(st.held), task_group_of(st.run_id)
    reason, by = ctx.limits.clip(cmd.reason or "unpaused"), ctx.limits.clip(cmd.by)
    core.emit(b, st, GroupUnpaused(st.run_id, b.now, reason=reason, by=by, pause_id=cmd.pause_id))
    for run_id, seq in held:
        b.effects.commands.append(ReleaseTask(run_id, seq, group=group, sent_at_ms=b.now))


def _check(ctx: Rules, b: Batch, st: TaskGroupState) -> None:
    """Refuse an id that is not the one its partition's runs read (a foreign producer's)."""
    p = b.partition_of(st.run_id)
    if st.run_id != task_group_id(task_group_of(st.run_id), p, ctx.partitions):
        raise Rejected(
            Reason.BAD_RUN_ID,
            f"{st.run_id!r} is not the id of a task group's pause on partition {p} "
            "(send group pauses with runstream tasks pause or Client.pause_group)",
        )


def holds(
    ctx: Rules, b: Batch, st: RunState, seq: int, name: str, group: str, attempt: int
) -> bool:
    """Whether the remote attempt due at ``seq`` waits for its paused group (then it is
    recorded as held, on the run and on the group's entity, once)."""
    p = b.partition_of(st.run_id)
    ent = b.state(p, task_group_id(group, p, ctx.partitions))
    assert isinstance(ent, TaskGroupState)
    if ent.paused is None:
        return False
    if not isinstance(st.pending.get(seq), StepHeld):
        core.emit(
            b, st, StepHeld(st.run_id, b.now, seq=seq, name=name, attempt=attempt, group=group)
        )
        b.effects.lifecycle.append(
            LifecycleEvent(
                Kind.STEP_HELD, st.run_id, at_ms=b.now, workflow=st.workflow,
                version=st.version, status=st.status, step=name, seq=seq, attempt=attempt,
                reason=f"task group {group!r} paused: {ent.paused.reason}",
            )
        )  # fmt: skip
    if (st.run_id, seq) not in ent.held:  # again after an unpause and a new pause
        core.emit(b, ent, TaskHeld(ent.run_id, b.now, holder=st.run_id, seq=seq))
    return True


def release(ctx: Rules, b: Batch, st: RunState, cmd: ReleaseTask) -> None:
    """The group of the step held at ``cmd.seq`` was unpaused: the run goes on (its
    step is sent, or held again if the group was paused again meanwhile)."""
    if isinstance(st.pending.get(cmd.seq), StepHeld) and not st.terminal:
        core.advance(ctx, b, st)
