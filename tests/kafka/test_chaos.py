"""Five minutes of the chaos suite (`python -m chaos`, issue 20) in the test command: a
private 3-node cluster, two engine instances and a task worker under load while a nemesis
SIGKILLs and SIGSTOPs them and the brokers; then no invariant of `chaos.check` may be
violated. RUNSTREAM_CHAOS_MINUTES changes the length; longer runs: `python -m chaos`."""

from __future__ import annotations

import os

import pytest

from chaos.suite import run

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MINUTES = float(os.environ.get("RUNSTREAM_CHAOS_MINUTES", "5"))


# the faults, then up to 5 minutes for every run to end, and the cluster's start and stop
@pytest.mark.timeout(int(MINUTES * 60) + 900)
def test_five_minutes_of_faults_break_no_invariant(tmp_path):
    result = run(MINUTES, tmp_path, say=lambda line: print(line, flush=True))
    print(result.summary())
    assert result.faults.total() >= 1, "the nemesis injected nothing"
    assert result.violations == [], "\n".join(result.violations[:50])
