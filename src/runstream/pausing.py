"""Pause and unpause many runs at once (`Client.pause_where`, ``runstream runs pause
--where``): the runs are selected from the runs read model, then each is sent a
command. Pause and unpause change nothing on a run already so, so no job file is kept
as for a bulk cancel: run the same command again and it sends what is left."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runstream.operations import caught_up, select
from runstream.projections.runs import CLOSED
from runstream.schemas.records import Status
from runstream.settings import Settings

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
    with caught_up(ns, settings, base) as (model, _):
        runs = []
        for run_id in select(model, where):
            row = model.get(run_id)
            status = "" if row is None else row.status
            if (status == Status.PAUSED) if unpause else status not in (*CLOSED, Status.PAUSED):
                runs.append(run_id)
    if dry_run or not runs:
        return PauseReport(where, runs, dry_run=dry_run)
    client = connect()
    send = client.unpause if unpause else client.pause
    for run_id in runs:
        send(run_id, reason=reason, by=by, wait=False)
    client.flush()  # Kafka has every one
    return PauseReport(where, runs)
