"""What a restart pays before the engine runs: `runstream worker` becomes its
supervisor (a process of the standard library alone) before it imports any of the
engine, so an engine is imported once per start, in the engine process."""

from __future__ import annotations

import subprocess
import sys

#: What only the engine process needs: the Kafka client, the codec, the projections, the
#: engine itself.
ENGINE_MODULES = ("confluent_kafka", "fastavro", "rocksdict", "runstream.worker")

SUPERVISED_WORKER = f"""
import os, sys

def execv(path, argv):  # where the supervisor would take over: what was imported?
    print(argv[1:3], sorted(m for m in sys.modules if m.startswith({ENGINE_MODULES!r})))
    sys.exit(0)

os.execv = execv
sys.argv = ["runstream", "worker", "no_such_module:app"]
from runstream.cli.main import main
main()
"""


def test_a_supervised_worker_execs_its_supervisor_before_importing_the_engine():
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISED_WORKER], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['-m', 'runstream.supervisor'] []"
