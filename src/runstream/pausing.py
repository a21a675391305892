"""Pause and unpause many runs at once (`Client.pause_where`, ``runstream runs pause
--where``): the runs are selected from the runs read model, then each is sent a
command. Pause and unpause change nothing on a run already so, so no job file is kept
as for a bulk cancel: run the same command again and it sends what is left.

``key=K`` selects the runs of a limit's concurrency key (a workflow's
``concurrency_key``): the runs read model does not know the key (it is computed by the
App from the input), the journal does. Its run permit's request (PermitRequested at
`RUN_PERMIT_SEQ`) names the limit ``limit_id(workflow, key)``; the selection reads the
journal once, from its start, as `runstream tasks status` does."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runstream.errors import DecodeError
from runstream.operations import caught_up, select
from runstream.projections.runs import CLOSED
from runstream.schemas.codec import Codec
from runstream.schemas.records import RUN_PERMIT_SEQ, PermitRequested, Status, limit_id
from runstream.settings import Settings
from runstream.topics.admin import client_config
from runstream.topics.kafka import read_to_end
from runstream.topics.spec import Topics

#: The condition of a bulk pause that selects by a limit's concurrency key.
KEY = "key"

if TYPE_CHECKING:
    from runstream.client import Client


@dataclass(frozen=True)
class PauseReport:
    """What a bulk pause or unpause did: its conditions and the runs it sent the
    command to (on a dry run: the runs it would send it to)."""

    where: dict[str, str]
    runs: list[str]
    dry_run: bool = False


def who() -> str:
    """Who asks, for the run's history: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def bulk(
    ns: str,
    settings: Settings,
    connect: Callable[[], Client],
    where: dict[str, str],
    *,
    unpause: bool,
    reason: str,
    by: str,
    dry_run: bool,
    base: Path | None,
) -> PauseReport:
    """Pause every open run matching ``where`` that is not paused (``unpause``: unpause
    every paused one). ``connect`` gives the client, asked for only if there is a run."""
    key = where.get(KEY)
    with caught_up(ns, settings, base) as (model, _):
        found: dict[str, str] = {}  # run -> its workflow
        for run_id in select(model, where):
            row = model.get(run_id)
            status = "" if row is None else row.status
            if (status == Status.PAUSED) if unpause else status not in (*CLOSED, Status.PAUSED):
                found[run_id] = "" if row is None else row.workflow
    if key is not None and found:
        permits = run_permits(ns, settings)
        found = {r: wf for r, wf in found.items() if permits.get(r) == limit_id(wf, key)}
    runs = list(found)
    if dry_run or not runs:
        return PauseReport(where, runs, dry_run=dry_run)
    client = connect()
    send = client.unpause if unpause else client.pause
    for run_id in runs:
        send(run_id, reason=reason, by=by, wait=False)
    client.flush()  # Kafka has every one
    return PauseReport(where, runs)


def run_permits(ns: str, settings: Settings) -> dict[str, str]:
    """Run id -> the limit its run permit was last asked of (`RUN_PERMIT_SEQ`), from the
    namespace's journal read from its start."""
    config = client_config(settings.bootstrap(), settings.kafka)
    codec, out = Codec.default(), {}  # every fact decoded: a few µs each
    for batch in read_to_end(config, Topics(ns).journal):
        for rec in batch:
            try:
                fact = codec.decode(rec.value)
            except DecodeError:  # not ours to judge here; the engine wrote it
                continue
            if isinstance(fact, PermitRequested) and fact.seq == RUN_PERMIT_SEQ:
                out[fact.run_id] = fact.limit
    return out
