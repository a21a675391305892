"""The files an engine instance keeps beside its projections, in its state directory.

- ``health.json``: what the instance is doing (connecting, restoring, running, draining,
  stopped), its pid and partitions; `runstream workers` reads it.
- ``stuck-runs.json``: runs whose workflow code blocked in a call that could not be
  interrupted (see `runtime.budget`); the restarted instance parks them first.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Container
from pathlib import Path
from typing import Any

log = logging.getLogger("runstream.worker")

STUCK = (
    "workflow code blocked in a call that never returned and could not be interrupted "
    "by its time budget (Settings.activation_budget); parked"
)


class InstanceFiles:
    """One instance's files under ``state_dir`` (``<state>/<namespace>/<instance>``)."""

    def __init__(self, state_dir: Path, instance_id: str) -> None:
        self.dir, self.instance_id = state_dir, instance_id

    def write_health(self, status: str, partitions: list[int]) -> None:
        health = {
            "instance": self.instance_id,
            "status": status,
            "pid": os.getpid(),
            "at": time.time(),
            "partitions": partitions,
        }
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "health.json").write_text(json.dumps(health))
        except OSError as exc:
            log.warning("cannot write health.json: %s", exc)

    def read_stuck(self) -> dict[str, str]:
        try:
            return dict(json.loads((self.dir / "stuck-runs.json").read_text()))
        except (OSError, ValueError):
            return {}

    def write_stuck(self, runs: dict[str, str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "stuck-runs.json").write_text(json.dumps(runs))


class StuckRuns(dict[str, str]):
    """Run id -> why parked, for runs whose workflow code blocked the process, kept in
    ``stuck-runs.json`` so the restarted instance parks them before running them again."""

    def __init__(self, files: InstanceFiles) -> None:
        super().__init__(files.read_stuck())
        self._files = files

    def add(self, run_id: str) -> None:
        self[run_id] = STUCK
        self._files.write_stuck(self)

    def release(self, runs: Container[str]) -> None:
        """The runs of ``runs`` moved on (resumed, cancelled, ...): no longer stuck."""
        gone = [r for r in self if r in runs]
        for run_id in gone:
            del self[run_id]
        if gone:
            self._files.write_stuck(self)


def read_health(namespace_dir: Path) -> list[dict[str, Any]]:
    """The health of every instance under ``<state>/<namespace>``, with ``alive`` (its
    process still runs) and ``age_s`` (seconds since it last wrote)."""
    rows = []
    for path in sorted(namespace_dir.glob("*/health.json")):
        try:
            health = dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        health["alive"] = _alive(int(health["pid"]))
        health["age_s"] = round(time.time() - float(health.pop("at")), 1)
        rows.append(health)
    return rows


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
