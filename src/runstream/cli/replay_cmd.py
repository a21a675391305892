"""`runstream replay`: does the code about to be deployed still fit the recorded runs?

Reads runs' facts from ``<ns>.journal``, folds them into each run's state
(`engine.reducer`), and replays the workflow of MODULE:APP against that history with
`engine.replay`, which never runs a step: a recorded operation returns its recorded
result, the first unrecorded one ends the replay. A run fits when, at every sequence
number, the code asks for what the history recorded. Otherwise the first divergence is
named: the sequence number, the operation the history has, the one the code asks for.
Exit status 0 when every run fits, 1 when one does not.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from runstream.cli import exits, options
from runstream.engine.partitioner import partition_for
from runstream.engine.reducer import apply
from runstream.engine.replay import replay
from runstream.engine.requests import Blocked, Failed, NonDeterministic, Overran, requested_op
from runstream.engine.state import RunState, Status
from runstream.engine.workflow import Registry
from runstream.errors import DecodeError, RunNotFound
from runstream.runtime.budget import ActivationBudget
from runstream.schemas.codec import Codec
from runstream.schemas.records import FACTS, IdKind, id_kind
from runstream.settings import Settings
from runstream.topics.admin import check_copartitioned
from runstream.topics.spec import Topics

#: ``--status open``: every run that has not ended (running, compensating, parked).
OPEN = "open"
_STATUSES = [OPEN, *(s.value for s in Status if s is not Status.REJECTED)]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether one run's history fits the code; if not, where it first diverges."""

    run_id: str
    workflow: str
    version: str
    status: str
    facts: int
    problem: str | None = None  # None: it fits
    seq: int | None = None
    recorded: str | None = None  # the operation the history has at ``seq``
    requested: str | None = None  # the operation the code asks for there

    @property
    def fits(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}

    def diverged(self, seq: int, recorded: str, requested: str) -> Verdict:
        """This run, not fitting at ``seq``."""
        problem = f"at seq {seq} the history has {recorded!r}, the code asks for {requested!r}"
        return replace(self, problem=problem, seq=seq, recorded=recorded, requested=requested)

    def line(self) -> str:
        what = f"run {self.run_id!r} ({self.workflow} version {self.version}, {self.status})"
        return f"{what} fits" if self.fits else f"{what} does not fit: {self.problem}"


def check(
    state: RunState,
    registry: Registry,
    now_ms: int,
    guard: AbstractContextManager[None] | None = None,
) -> Verdict:
    """Replay ``state``'s history against the workflows of ``registry``; steps never run."""
    fits = _verdict(state)
    wf = registry.get(state.workflow, state.version)
    if wf is None:
        problem = f"the code has no workflow {state.workflow!r} version {state.version!r}"
        return replace(fits, problem=problem)
    outcome = replay(wf, state, registry, now_ms, guard).outcome
    ended = state.status is Status.COMPLETED  # its code returned: nothing may follow
    match outcome:
        case NonDeterministic(err):
            return fits.diverged(err.seq, err.expected, err.found)
        case Blocked(request) if ended:
            return fits.diverged(request.seq, "the end", requested_op(request))
        case Failed(error) if ended:
            return replace(fits, problem=f"the code fails where the run completed: {error}")
        case Overran():
            return replace(fits, problem="the workflow code ran past its activation_budget")
    return fits


def _verdict(state: RunState, problem: str | None = None) -> Verdict:
    status = state.status.value
    return Verdict(state.run_id, state.workflow, state.version, status, state.facts, problem)


def selected(state: RunState, workflow: str, statuses: tuple[str, ...]) -> bool:
    """Whether ``--workflow``/``--status`` pick this run (a rejected start is no run)."""
    if not state.exists or state.workflow != workflow:
        return False
    return state.status.value in statuses or (OPEN in statuses and not state.terminal)


class History:
    """Runs folded from the journal, and the runs whose records could not be read."""

    def __init__(self) -> None:
        self.states: dict[str, RunState] = {}
        self.unreadable: dict[str, str] = {}  # run id (the record's key) -> why

    def add(self, key: bytes | None, value: bytes | None, where: str, codec: Codec) -> None:
        try:
            fact = codec.decode(value)
            if not isinstance(fact, FACTS):
                raise DecodeError("not-a-fact", f"{fact.AVRO} is not a journal fact")
        except DecodeError as exc:
            run_id = (key or b"").decode(errors="replace")
            self.unreadable.setdefault(run_id, f"journal record {where} is unreadable: {exc}")
            return
        run_id = fact.run_id  # type: ignore[attr-defined]
        if id_kind(run_id) is not IdKind.RUN:  # an entity's facts: no workflow code to replay
            return
        state = self.states.get(run_id)
        if state is None:
            state = self.states[run_id] = RunState(run_id)
        apply(state, fact)  # type: ignore[arg-type]


def read_history(
    settings: Settings, ns: str, run_id: str | None = None, progress: Progress | None = None
) -> History:
    """Fold ``<ns>.journal`` (only ``run_id``'s partition and records, if given)."""
    bootstrap = settings.bootstrap()
    partitions = check_copartitioned(
        bootstrap, ns, timeout=settings.connect_timeout, kafka=settings.kafka
    )
    journal, codec, history = Topics(ns).journal, Codec.default(), History()
    key = None if run_id is None else run_id.encode()
    parts = None if key is None else [partition_for(key, partitions)]
    task = None if progress is None else progress.add_task(f"reading {journal}", total=None)
    for batch in options.read_topic(settings, journal, parts):
        for rec in batch:
            if key is None or rec.key == key:
                history.add(rec.key, rec.value, f"{rec.partition}:{rec.offset}", codec)
        if progress is not None and task is not None:
            progress.advance(task, len(batch))
    return history


@click.command("replay")
@click.argument("run_id", required=False)
@click.option("--app", "target", required=True, metavar="MODULE:APP", help="The code to check.")
@options.namespace
@options.bootstrap
@click.option("--workflow", default=None, help="Check every run of this workflow instead.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(_STATUSES),
    help="With --workflow: the runs' status (repeatable; default: open, every run not ended).",
)
@options.json_output
def replay_cmd(
    run_id: str | None,
    target: str,
    namespace: str,
    bootstrap: str | None,
    workflow: str | None,
    statuses: tuple[str, ...],
    as_json: bool,
) -> None:
    """Replay RUN_ID's recorded history against the code in MODULE:APP, running no step,
    and say whether it fits; if not, name the first divergence. With --workflow instead of
    RUN_ID: every run of that workflow (the check to run before a deploy). Exit 1 if a run
    does not fit."""
    if (run_id is None) == (workflow is None):
        raise click.UsageError("give a RUN_ID, or --workflow (with --status) for many runs")
    if run_id is not None and statuses:
        raise click.UsageError("--status goes with --workflow")
    try:
        registry: Registry = options.load_app(target).registry
    except (ImportError, AttributeError) as exc:  # a typo in MODULE:APP: say so in one line
        raise click.BadParameter(f"cannot load {target!r}: {exc}", param_hint="--app") from None
    settings = Settings().with_bootstrap(bootstrap)
    budget = ActivationBudget(settings.activation_budget)
    try:
        if run_id is not None:
            verdicts = [_one(settings, namespace, run_id, registry, budget)]
            if as_json:
                click.echo(json.dumps(verdicts[0].to_dict(), indent=2))
            else:
                click.echo(verdicts[0].line())
        else:
            assert workflow is not None
            verdicts = _many(
                settings, namespace, workflow, statuses or (OPEN,), registry, budget, as_json
            )
    finally:
        budget.close()
    if not all(v.fits for v in verdicts):
        sys.exit(exits.NO)


def _one(
    settings: Settings, ns: str, run_id: str, registry: Registry, budget: ActivationBudget
) -> Verdict:
    history = read_history(settings, ns, run_id)
    if run_id in history.unreadable:
        return _verdict(history.states.get(run_id, RunState(run_id)), history.unreadable[run_id])
    state = history.states.get(run_id)
    if state is None:
        raise RunNotFound(f"no run {run_id!r} in {Topics(ns).journal}; check the id and -n")
    if not state.exists:
        raise RunNotFound(f"run {run_id!r} was rejected, never started: nothing to replay")
    return check(state, registry, _now_ms(), budget(run_id))


def _many(
    settings: Settings,
    ns: str,
    workflow: str,
    statuses: tuple[str, ...],
    registry: Registry,
    budget: ActivationBudget,
    as_json: bool,
) -> list[Verdict]:
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as progress:
        history = read_history(settings, ns, progress=progress)
        runs, verdicts = [], []
        for state in history.states.values():
            if state.run_id in history.unreadable:
                if selected(state, workflow, statuses) or not state.exists:
                    verdicts.append(_verdict(state, history.unreadable[state.run_id]))
            elif selected(state, workflow, statuses):
                runs.append(state)
        for run_id in history.unreadable.keys() - history.states.keys():  # nothing readable
            verdicts.append(_verdict(RunState(run_id), history.unreadable[run_id]))
        now = _now_ms()
        task = progress.add_task(f"replaying {workflow}", total=len(runs))
        for state in runs:
            verdicts.append(check(state, registry, now, budget(state.run_id)))
            progress.advance(task)
    misfits = sorted((v for v in verdicts if not v.fits), key=lambda v: v.run_id)
    which = "/".join(statuses)
    summary = f"{len(verdicts)} {which} runs of {workflow}: {len(verdicts) - len(misfits)} fit"
    summary += f", {len(misfits)} do not" if misfits else ""
    if as_json:
        out = {
            "workflow": workflow,
            "statuses": list(statuses),
            "runs": len(verdicts),
            "fit": len(verdicts) - len(misfits),
            "misfits": [v.to_dict() for v in misfits],
        }
        click.echo(json.dumps(out, indent=2))
        return verdicts
    if misfits:
        columns = ("RUN", "VERSION", "STATUS", "SEQ", "HISTORY HAS", "CODE ASKS FOR / PROBLEM")
        table = Table(*columns, box=box.SIMPLE, pad_edge=False)
        for v in misfits:
            seq = "" if v.seq is None else str(v.seq)
            table.add_row(
                v.run_id, v.version, v.status, seq, v.recorded or "", v.requested or v.problem
            )
        Console(soft_wrap=True).print(table)
    click.echo(summary)
    return verdicts


def _now_ms() -> int:
    return int(time.time() * 1000)
