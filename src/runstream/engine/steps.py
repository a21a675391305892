"""What the core knows of a step body: the `StepContext` it may declare.

Step bodies run in the runtime (`runstream.runtime.steps`); the core only sees their
outcomes (`engine.work.StepOutcome`). `engine.workflow.step_def` looks for a parameter
annotated `StepContext`, so the type lives here, in the core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StepContext:
    """What a step body may know of its attempt, and its way to say it is alive.

    A step gets one when it declares a parameter annotated ``StepContext`` (the workflow
    passes the other arguments, as always)::

        @app.step(group="exports", heartbeat="10s")
        def export(job: dict, step: runstream.StepContext) -> dict:
            for n, chunk in enumerate(chunks(job)):
                step.heartbeat({"done": n})

    ``heartbeat`` keeps a remote attempt alive past its ``heartbeat`` interval (it is
    sent at most a few times per interval, however often it is called); for a step the
    engine runs itself it only records the latest details.
    """

    def __init__(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        attempt_id: str = "",
        beat: Callable[[Any], None] | None = None,
    ) -> None:
        self.run_id, self.seq, self.attempt, self.attempt_id = run_id, seq, attempt, attempt_id
        self.details: Any = None  # the latest heartbeat's
        self._beat = beat

    def heartbeat(self, details: Any = None) -> None:
        """Say the attempt is alive, with optional progress ``details`` (JSON-able)."""
        self.details = details
        if self._beat is not None:
            self._beat(details)
