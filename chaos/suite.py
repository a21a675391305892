"""The chaos run: a private 3-node cluster, two engine instances and a task worker under a
steady workload, a nemesis that breaks one thing at a time, then the checks.

Every fault is healed before the next one starts, so the cluster always keeps a quorum
(replication 3, ``min.insync.replicas`` 2: one broker away at a time) and the workload can
always make progress between faults; the faults themselves are the dangerous moments.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

import runstream
from runstream.audit import audit
from runstream.dev import localkafka
from runstream.topics.admin import client_config, ensure_topics

from . import check

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 6
ENGINES = ("e0", "e1")
#: An engine or a broker SIGSTOPped this long outlives its session and transaction timeouts
#: (10 s each by default): the group moves its partitions, the coordinator aborts its
#: transaction, and it wakes up as a zombie that must be fenced.
PAUSE_S = 14.0
SETTLE_S = 300.0  # after the last fault, every run must have ended within this


@dataclass
class Result:
    runs: int
    faults: Counter[str]
    violations: list[str]
    figures: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        figures = ", ".join(f"{k} {v}" for k, v in self.figures.items())
        verdict = "no violation" if not self.violations else f"{len(self.violations)} violations"
        return f"{self.runs} runs; faults: {faults}; {figures}; {verdict}"


class Processes:
    """The engine instances (each under its supervisor) and the task worker."""

    def __init__(self, bootstrap: str, ns: str, out: Path) -> None:
        self.bootstrap, self.ns, self.out = bootstrap, ns, out
        self.state = out / "state"
        self.step_log = out / "steps.log"
        self.engines = {name: self._spawn_engine(name) for name in ENGINES}
        self.worker = self._spawn_worker()
        self.faulted: dict[int, list[tuple[float, float]]] = {}  # pid -> (from, to) faults

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RUNSTREAM_CHAOS_NS": self.ns,
            "RUNSTREAM_CHAOS_STEP_LOG": str(self.step_log),
            "RUNSTREAM_BOOTSTRAP_SERVERS": self.bootstrap,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
            "PYTHONFAULTHANDLER": "1",
        }

    def _popen(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.out / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "runstream", *argv],
                env=self._env(),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _spawn_engine(self, name: str) -> subprocess.Popen[bytes]:
        argv = ["worker", "chaos.app:app", "--instance", name, "--state-dir", str(self.state)]
        return self._popen(name, [*argv, "--partitions", str(PARTITIONS)])

    def _spawn_worker(self) -> subprocess.Popen[bytes]:
        return self._popen("tasks", ["tasks", "serve", "chaos.app:app", "--group", "remote"])

    def engine_pid(self, name: str) -> int | None:
        """The pid of the engine process itself (its supervisor's child), from its health."""
        try:
            health = json.loads((self.state / self.ns / name / "health.json").read_text())
            pid = int(health["pid"])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        # health.json may still name a process that died (and whose pid was reused)
        return pid if b"chaos.app:app" in cmdline and b"--no-supervise" in cmdline else None

    def note(self, pid: int, began: float) -> None:
        self.faulted.setdefault(pid, []).append((began, time.time()))

    def stop(self) -> list[str]:
        """SIGTERM to every process; what went wrong in the stop of each, if anything."""
        procs = {**self.engines, "tasks": self.worker}
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        problems = []
        for name, proc in procs.items():
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                problems.append(f"{name} did not stop within 60 s of SIGTERM")
                continue
            if code != 0:
                problems.append(f"{name} exited {code} at the end: {self._last_words(name)}")
        return problems

    def _last_words(self, name: str) -> str:
        """The last CRITICAL or ERROR line of a process's log (why it ended)."""
        lines = (self.out / f"{name}.log").read_text(errors="replace").splitlines()
        said = [line for line in lines if "CRITICAL" in line or "ERROR" in line]
        return said[-1] if said else "(nothing logged)"


class Nemesis:
    """Breaks one thing at a time until ``deadline``, heals it, waits a little, again.

    It runs on the main thread: a broker it restarts dies with the thread that started it
    (`LocalKafka`'s die-with-parent signal is bound to the starting thread, not the process).
    """

    def __init__(
        self,
        kafka: localkafka.LocalKafka,
        procs: Processes,
        rng: random.Random,
        deadline: float,
        say: Callable[[str], None],
    ) -> None:
        self.kafka, self.procs, self.rng, self.deadline, self.say = (
            kafka,
            procs,
            rng,
            deadline,
            say,
        )
        self.faults: Counter[str] = Counter()

    def run(self) -> None:
        actions = {
            "engine SIGKILL": self._kill_engine,
            "engine SIGSTOP": self._pause_engine,
            "task worker SIGKILL": self._kill_worker,
            "task worker SIGSTOP": self._pause_worker,
            "broker SIGKILL": self._kill_broker,
            "broker SIGSTOP": self._pause_broker,
        }
        time.sleep(10)  # let the load start
        while time.monotonic() < self.deadline:
            name = self.rng.choice(sorted(actions))
            what = actions[name]()
            self.faults[name] += 1
            self.say(f"nemesis: {what}")
            time.sleep(self.rng.uniform(3, 8))

    # -- engines and the task worker
    def _kill_engine(self) -> str:
        name = self.rng.choice(ENGINES)
        pid = self.procs.engine_pid(name)
        if pid is None:
            return f"engine {name} has no pid yet"
        began = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # its supervisor starts it again
        self.procs.note(pid, began)
        return f"engine {name} (pid {pid}) SIGKILLed"

    def _pause_engine(self) -> str:
        name = self.rng.choice(ENGINES)
        pid = self.procs.engine_pid(name)
        if pid is None:
            return f"engine {name} has no pid yet"
        return self._pause(pid, f"engine {name}")

    def _kill_worker(self) -> str:
        proc, began = self.procs.worker, time.time()
        proc.kill()
        proc.wait(10)
        self.procs.note(proc.pid, began)
        time.sleep(self.rng.uniform(0.5, 3))
        self.procs.worker = self.procs._spawn_worker()
        return f"task worker (pid {proc.pid}) SIGKILLed and started again"

    def _pause_worker(self) -> str:
        return self._pause(self.procs.worker.pid, "task worker")

    def _pause(self, pid: int, who: str) -> str:
        began, seconds = time.time(), self.rng.uniform(PAUSE_S / 2, PAUSE_S)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.procs.note(pid, began)
        return f"{who} (pid {pid}) SIGSTOPped for {seconds:.1f}s"

    # -- brokers
    def _victim(self) -> tuple[int, str]:
        """A broker: the engine group's coordinator, or any, at random."""
        if self.rng.random() < 0.5:
            with contextlib.suppress(Exception):
                admin = AdminClient(client_config(self.kafka.bootstrap))
                group = f"{self.procs.ns}.engine"
                desc = admin.describe_consumer_groups([group])[group].result(10)
                return desc.coordinator.id - 1, " (the engine group's coordinator)"
        return self.rng.randrange(self.kafka.nodes), ""

    def _kill_broker(self) -> str:
        node, why = self._victim()
        self.kafka.kill_node(node)
        down = self.rng.uniform(2, 10)
        time.sleep(down)
        self.kafka.restart_node(node)
        return f"broker {node}{why} SIGKILLed, restarted after {down:.1f}s"

    def _pause_broker(self) -> str:
        node, why = self._victim()
        seconds = self.rng.uniform(PAUSE_S / 2, PAUSE_S)
        self.kafka.pause_node(node)
        time.sleep(seconds)
        self.kafka.resume_node(node)
        return f"broker {node}{why} SIGSTOPped for {seconds:.1f}s"


class Load(threading.Thread):
    """Starts ``order`` runs at ``rate`` per second until ``deadline``; each gets its signal
    and its event at once (buffered: the run waits for them later)."""

    def __init__(self, bootstrap: str, ns: str, rate: float, deadline: float) -> None:
        super().__init__(daemon=True)
        self.client = runstream.Client(ns, bootstrap)
        self.rate, self.deadline = rate, deadline
        self.started: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        began = time.monotonic()
        try:
            while time.monotonic() < self.deadline:
                i = len(self.started)
                send(self.client, i)
                self.started.append(i)
                delay = began + (i + 1) / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(120)
        with contextlib.suppress(runstream.RunstreamError):
            self.client.close()
        if self.error is not None:
            raise self.error


def run_id(i: int) -> str:
    return f"order-{i}"


def send(client: runstream.Client, i: int) -> None:
    """Everything run ``i`` is sent; idempotent (by run id, signal id and event id), so a
    client that lost some of it to a broker's death sends it all again."""
    rid = run_id(i)
    client.start("order", i, run_id=rid, wait=False)
    client.signal(rid, "go", i, signal_id=f"{rid}/go")
    client.publish("paid", {"i": i}, key=rid, ttl="1h", event_id=f"{rid}/paid", wait=False)


def run(
    minutes: float,
    out: Path,
    *,
    seed: int | None = None,
    rate: float = 2.0,
    say: Callable[[str], None] = print,
) -> Result:
    """One chaos run of ``minutes`` of faults; its files (logs, state) go under ``out``."""
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    say(f"chaos: seed {seed}, {minutes:g} minutes, files in {out}")
    libs = localkafka.ensure_jars(progress=lambda _: None)
    kafka = localkafka.LocalKafka(out / "kafka", nodes=3, libs=libs, die_with_parent=True)
    bootstrap = kafka.start()
    ns = f"chaos{uuid.uuid4().hex[:6]}"
    procs: Processes | None = None
    try:
        ensure_topics(bootstrap, ns, PARTITIONS, 3, task_groups=["remote"])
        tail = check.JournalTail(bootstrap, ns, PARTITIONS)
        tail.start()
        procs = Processes(bootstrap, ns, out)
        deadline = time.monotonic() + minutes * 60
        load = Load(bootstrap, ns, rate, deadline)
        load.start()
        nemesis = Nemesis(kafka, procs, rng, deadline, say)
        nemesis.run()
        load.finish()
        say(f"chaos: {len(load.started)} runs started; healed; waiting for every run to end")
        outputs, settled = _settle(bootstrap, ns, load.started)
        survivors = {pid for name in ENGINES if (pid := procs.engine_pid(name)) is not None}
        survivors.add(procs.worker.pid)
        stopped = procs.stop()
        procs_faulted = procs.faulted
        report = audit(bootstrap, ns, expect_finished=True)
        journal = check.read_journal(bootstrap, ns)
        tail.stop()
        tailed = check.tail_problems(bootstrap, ns, PARTITIONS, tail.seen)
    finally:
        if procs is not None:
            with contextlib.suppress(Exception):
                procs.stop()
        kafka.stop()
    violations = [str(v) for v in report.violations]
    violations += check.outputs(outputs)
    found, figures = check.steps(procs.step_log, journal, procs_faulted, survivors, out)
    violations += found
    violations += check.events(journal, [run_id(i) for i in load.started])
    violations += tailed
    violations += stopped
    figures["settled after the last fault"] = f"{settled:.0f}s"
    figures["journal records seen by the live tail"] = len(tail.seen)
    return Result(len(load.started), nemesis.faults, violations, figures)


def _settle(bootstrap: str, ns: str, started: list[int]) -> tuple[dict[int, Any], float]:
    began = time.monotonic()
    client = runstream.Client(ns, bootstrap)
    try:
        for i in started:  # whatever a broker's death lost of them
            send(client, i)
        client.flush(120)
        outputs: dict[int, Any] = {}
        deadline = time.monotonic() + SETTLE_S
        for i in started:
            try:
                left = max(1.0, deadline - time.monotonic())
                outputs[i] = client.result(run_id(i), timeout=left)
            except (runstream.RunstreamError, TimeoutError) as exc:
                outputs[i] = exc
        return outputs, time.monotonic() - began
    finally:
        client.close()
