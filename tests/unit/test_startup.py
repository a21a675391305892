"""What a restart pays before the engine runs: `runstream worker` forks its first engine
once its options are read, before it imports any of the engine, and becomes that engine's
supervisor (a process of the standard library alone), which adopts it: the command line
is imported once per start, the engine once, in the engine process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from runstream.supervisor import supervise

#: What only the engine process needs: the Kafka client, the codec, the projections, the
#: engine itself.
ENGINE_MODULES = ("confluent_kafka", "fastavro", "rocksdict", "runstream.worker")

SUPERVISED_WORKER = f"""
import os, sys

def execv(path, argv):  # where the supervisor would take over: what was imported?
    adopted = int(argv[argv.index("--adopt") + 1])
    os.waitpid(adopted, 0)  # the first engine, forked: it cannot load its App and ends
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


def test_an_adopted_engine_that_dies_is_replaced_by_one_the_supervisor_starts(
    tmp_path: Path,
) -> None:
    crash = [sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]
    first = os.posix_spawn(sys.executable, crash, os.environ)  # a child no Popen tracks
    second = tmp_path / "second"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = supervise(
            [sys.executable, "-c", f"open({str(second)!r}, 'w').close()"],
            delay=0,
            adopt=first,
        )
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == 0 and second.exists()
