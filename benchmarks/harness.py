"""What every workload needs: a broker, namespaces, engine processes, a lifecycle
watcher, an RSS sampler, statistics and the JSON record of a result.

Every process started here is tracked and stopped when the benchmark ends or is
interrupted (SIGINT, SIGTERM); engine processes also get SIGKILL from the kernel if the
harness itself dies (PR_SET_PDEATHSIG), and so does the broker (LocalKafka's
``die_with_parent``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import platform
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

import runstream
from runstream.dev import localkafka
from runstream.engine.partitioner import partition_for
from runstream.schemas.codec import Codec
from runstream.topics.admin import client_config, consume_ready, ensure_topics

from .brokerstats import BrokerStats, jvm_options

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 12
TERMINAL = ("run.completed", "run.failed", "run.cancelled", "run.dead", "run.rejected")


def log(msg: str) -> None:
    """Progress goes to stderr; stdout carries only the one-line summaries."""
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency_stats(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
        "mean": round(statistics.fmean(ms), 3) if ms else math.nan,
        "min": round(min(ms), 3) if ms else math.nan,
        "max": round(max(ms), 3) if ms else math.nan,
    }


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """Median, min and max over repeats (None values are skipped)."""
    vs = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vs:
        return None
    return {
        "median": round(statistics.median(vs), 3),
        "min": round(min(vs), 3),
        "max": round(max(vs), 3),
        "n": len(vs),
    }


def fmt_spread(s: dict[str, float] | None, unit: str = "", digits: int = 1) -> str:
    if s is None:
        return "n/a"
    f = f"{{:.{digits}f}}"
    if s["n"] == 1:
        return f"{f.format(s['median'])}{unit}"
    return f"{f.format(s['median'])}{unit} (min {f.format(s['min'])}, max {f.format(s['max'])})"


# ----------------------------------------------------------------- machine and versions


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "hostname": socket.gethostname(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_total_mb": round(psutil.virtual_memory().total / 2**20),
        "os": platform.platform(),
    }


def _java_version() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def versions() -> dict[str, Any]:
    import confluent_kafka

    lib, libnum = confluent_kafka.libversion()
    py = confluent_kafka.version()  # a str in 2.16 (a (str, int) tuple in older releases)
    return {
        "python": platform.python_version(),
        "confluent_kafka": py[0] if isinstance(py, tuple) else py,
        "librdkafka": lib,
        "librdkafka_num": libnum,
        "kafka_broker": localkafka.KAFKA_VERSION,
        "java": _java_version(),
        "runstream_git_commit": _git("rev-parse", "HEAD"),
        # uncommitted changes under src/ when measured (others edit it meanwhile)
        "runstream_src_changes": (_git("status", "--porcelain", "--", "src") or "").splitlines(),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return f"<{type(value).__name__}>"


def engine_settings(bootstrap: str, ns: str) -> dict[str, Any]:
    """The engine's settings as its own code builds them: the Settings defaults, and the
    librdkafka configs the Kafka edge gives the engine's producer and consumers and the
    client's producer (recorded as they are made, so nothing is duplicated here). Needs
    the namespace's topics to exist."""
    from unittest import mock

    import runstream.topics.kafka as edge
    from runstream.topics.spec import Topics
    from runstream.topics.watchdog import Watchdog

    producers: list[dict[str, Any]] = []
    consumers: list[dict[str, Any]] = []

    class RecordingProducer(Producer):
        def __init__(self, conf: dict[str, Any]) -> None:
            producers.append(dict(conf))
            super().__init__(conf)

    class RecordingConsumer(Consumer):
        def __init__(self, conf: dict[str, Any]) -> None:
            consumers.append(dict(conf))
            super().__init__(conf)

    defaults = runstream.Settings()
    settings = defaults.model_copy(
        update={"instance_id": "bench-1", "create_topics": False, "bootstrap_servers": bootstrap}
    )
    with (
        mock.patch.object(edge, "Producer", RecordingProducer),
        mock.patch.object(edge, "Consumer", RecordingConsumer),
    ):
        log = edge.open_engine_log(settings, Topics(ns), "bench-1", Watchdog(False), lambda: False)
        assert log is not None
        log.close()
        runstream.Client(ns, bootstrap).close()
    engine = next(p for p in producers if "transactional.id" in p)
    client = next(p for p in producers if "transactional.id" not in p)
    by_group = {c.get("group.id", "?").removeprefix(f"{ns}."): c for c in consumers}
    return {
        "settings_defaults": _jsonable(defaults.model_dump(mode="json")),
        "engine_producer": _jsonable(engine),
        "engine_consumer": _jsonable(by_group.get("engine", {})),
        "engine_restore_consumer": _jsonable(by_group.get("restore", {})),
        "client_producer": _jsonable(client),
        "broker_overrides": "runstream.dev.localkafka.LocalKafka single node defaults "
        "(RF 1, 2 network + 2 io threads, -Xmx512m)",
    }


# ----------------------------------------------------------------- processes


def _pdeathsig() -> None:
    # In the child before exec: SIGKILL it when the harness dies, whatever the cause.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)


class Sampler(threading.Thread):
    """Samples the RSS of tracked processes and of all their descendants every
    ``interval`` s (``runstream worker`` runs the engine in a child process of a
    supervisor). Peaks are kept per group (the sum over the group's live processes),
    per group's largest single process, and per process."""

    def __init__(self, interval: float = 0.1) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.interval = interval
        self._groups: dict[str, dict[int, psutil.Process]] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.peak: dict[str, int] = {}
        self.peak_single: dict[str, int] = {}
        self.peak_pid: dict[int, int] = {}
        self.last: dict[str, int] = {}
        self.cpu: dict[int, float] = {}  # pid -> user+system seconds, last seen
        self.seen: dict[str, set[int]] = {}  # group -> every pid sampled since reset()

    def track(self, group: str, pid: int) -> None:
        with contextlib.suppress(psutil.Error), self._lock:
            self._groups.setdefault(group, {})[pid] = psutil.Process(pid)

    def reset(self) -> None:
        with self._lock:
            for d in (self.peak, self.peak_single, self.peak_pid, self.cpu, self.seen):
                d.clear()
            for group in self._groups.values():
                for pid in [p for p, proc in group.items() if not proc.is_running()]:
                    del group[pid]

    def tree(self, group: str) -> list[psutil.Process]:
        """The group's tracked processes and their descendants, alive now."""
        procs: dict[int, psutil.Process] = {}
        for pid, proc in list(self._groups.get(group, {}).items()):
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    procs[pid] = proc
                    for child in proc.children(recursive=True):
                        procs[child.pid] = child
        return list(procs.values())

    def sample(self) -> None:
        with self._lock:
            for name in self._groups:
                total = biggest = 0
                for proc in self.tree(name):
                    try:
                        rss = proc.memory_info().rss
                        t = proc.cpu_times()
                    except psutil.Error:
                        continue
                    self.seen.setdefault(name, set()).add(proc.pid)
                    self.cpu[proc.pid] = t.user + t.system
                    total += rss
                    biggest = max(biggest, rss)
                    self.peak_pid[proc.pid] = max(self.peak_pid.get(proc.pid, 0), rss)
                self.last[name] = total
                self.peak[name] = max(self.peak.get(name, 0), total)
                self.peak_single[name] = max(self.peak_single.get(name, 0), biggest)

    def rss(self, group: str) -> int:
        """The group's RSS now (bytes)."""
        self.sample()
        return self.last.get(group, 0)

    def cpu_seconds(self, group: str) -> float:
        """CPU seconds of every process of the group sampled since reset()."""
        return sum(self.cpu.get(pid, 0.0) for pid in self.seen.get(group, ()))

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._halt.set()

    def peaks_mb(self) -> dict[str, float]:
        self.sample()
        out = {g: round(v / 2**20, 1) for g, v in self.peak.items()}
        for g, v in self.peak_single.items():
            out[f"{g}_largest_process"] = round(v / 2**20, 1)
        return out


def tree_cpu(pids: Iterable[int]) -> dict[int, float]:
    """pid -> user+system CPU seconds now, of the given processes and all their
    descendants (from /proc, via psutil)."""
    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    out[proc.pid] = t.user + t.system
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two tree_cpu() readings (a process born in between
    counts from zero; one that ended in between is lost, which W2 does not do)."""
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())


def listening_pids(port: int) -> list[int]:
    """Pids listening on a TCP port (an external broker: its JVM), or [] when unknown."""
    with contextlib.suppress(psutil.Error):
        return sorted(
            {
                c.pid
                for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
            }
        )
    return []


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Engine:
    """One engine instance: ``python -m runstream worker benchmarks.flows:app``."""

    sampled_as = "engine"  # its group in the RSS and CPU sampler

    def __init__(
        self,
        bench: Bench,
        ns: str,
        instance: str,
        state_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.bench, self.ns, self.instance, self.state_dir = bench, ns, instance, state_dir
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self.pids: list[int] = []  # every process this instance ran as (restarts)
        self.started_at = 0.0

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "runstream",
            "worker",
            "benchmarks.flows:app",
            "--instance",
            self.instance,
            "--state-dir",
            str(self.state_dir),
            "--partitions",
            str(PARTITIONS),
        ]

    def start(self) -> Engine:
        self._spawn()
        if self not in self.bench.engines:
            self.bench.engines.append(self)
        return self

    def _spawn(self) -> None:
        """Start ``command`` with the bench's namespace and broker, logging to a file."""
        env = {
            **os.environ,
            "RUNSTREAM_BENCH_NS": self.ns,
            "RUNSTREAM_BOOTSTRAP_SERVERS": self.bench.bootstrap,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **self.env,
        }
        logfile = self.bench.work / f"{self.ns}.{self.instance}.{len(self.logs)}.log"
        self.logs.append(logfile)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(logfile, "ab") as out:
            self.started_at = time.perf_counter()
            self.proc = subprocess.Popen(
                self.command,
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_pdeathsig,
            )
        self.pids.append(self.proc.pid)
        self.bench.sampler.track(self.sampled_as, self.proc.pid)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[psutil.Process]:
        """The processes below `runstream worker` (its supervised engine process)."""
        if not self.alive():
            return []
        assert self.proc is not None
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def kill(self) -> int | None:
        """SIGKILL `runstream worker` and every process below it at once: a crash of the
        machine's engine. Returns the exit code of the `runstream worker` process."""
        if self.alive():
            assert self.proc is not None
            below = self.children()
            self.proc.send_signal(signal.SIGKILL)
            for child in below:
                with contextlib.suppress(psutil.Error):
                    child.kill()
            self.proc.wait(10)
            # not our children: psutil.wait_procs would poll them with a growing interval
            # (over a second); the next engine must not start before they are gone
            deadline = time.monotonic() + 10
            while any(_running(c) for c in below) and time.monotonic() < deadline:
                time.sleep(0.002)
        return self.proc.returncode if self.proc else None

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (graceful), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"engine {self.instance} (pid {self.proc.pid}) ignored SIGTERM; SIGKILL")
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def problems(self) -> list[str]:
        """WARNING/ERROR lines and tracebacks of this engine's logs (first 20)."""
        out = []
        for line in self.log_text().splitlines():
            if re.search(r" (WARNING|ERROR|CRITICAL) |Traceback|Error:", line):
                out.append(line[:500])
        return out[:20]


class Bench:
    """The broker, the work dir and every process of one benchmark session."""

    def __init__(
        self,
        bootstrap: str | None = None,
        keep: bool = False,
        broker_config: dict[str, str] | None = None,
        broker_jvm: list[str] | None = None,
        broker_metrics: bool = False,
    ) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="runstream-bench-"))
        self.keep = keep
        # the local broker's server.properties and JVM options beyond its defaults, and
        # whether to read its request metrics and GC log after each workload
        self.broker_config = broker_config or {}
        self.broker_jvm = broker_jvm or []
        self.broker_stats: BrokerStats | None = None
        self._broker_metrics = broker_metrics
        self.kafka: localkafka.LocalKafka | None = None
        self.bootstrap = bootstrap or ""
        self.external = bootstrap is not None
        self.engines: list[Engine] = []
        self.sampler = Sampler()
        self.broker_startup_s: float | None = None
        self.warmup: dict[str, Any] | None = None  # the broker warm-up, once done

    def __enter__(self) -> Bench:
        signal.signal(signal.SIGTERM, _raise_exit)
        # also when started in the background, where SIGINT comes ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.sampler.start()
        try:
            if not self.external:
                libs = localkafka.ensure_jars(progress=log)
                jvm = list(self.broker_jvm)
                if self._broker_metrics:
                    port, gc_log = localkafka.free_port(), self.work / "broker-gc.log"
                    jvm += jvm_options(port, gc_log)
                    self.broker_stats = BrokerStats(self.work, port, gc_log)
                self.kafka = localkafka.LocalKafka(
                    self.work / "kafka",
                    nodes=1,
                    libs=libs,
                    die_with_parent=True,
                    progress=log,
                    overrides=self.broker_config,
                    jvm_opts=jvm,
                )
                self.bootstrap = self.kafka.start()
                self.broker_startup_s = round(self.kafka.startup_seconds, 2)
                for pid in self.kafka.pids:
                    self.sampler.track("broker", pid)
                log(
                    f"broker up at {self.bootstrap} (pid {self.kafka.pids}) in "
                    f"{self.broker_startup_s}s; work dir {self.work}"
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def settle(self, quiet_pct: float = 15.0, hold_s: float = 3.0, limit_s: float = 90.0) -> float:
        """Wait until the broker JVM has used under ``quiet_pct`` of a core for ``hold_s``
        seconds running (at most ``limit_s``); the seconds waited. After heavy load (the
        warm-up, W2) the broker compacts its offsets and transaction logs and collects its
        garbage for a while, and a latency measured meanwhile measures that instead."""
        if self.kafka is None:
            return 0.0
        os.sync()  # write the last workload's dirty pages back now, not during the next one
        procs = [psutil.Process(pid) for pid in self.kafka.pids]
        began = quiet_since = time.monotonic()
        last = sum(sum(p.cpu_times()[:2]) for p in procs)
        while time.monotonic() - began < limit_s:
            time.sleep(0.5)
            now = sum(sum(p.cpu_times()[:2]) for p in procs)
            busy, last = (now - last) / 0.5 * 100, now
            if busy > quiet_pct:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= hold_s:
                break
        waited = time.monotonic() - began
        log(f"broker settled after {waited:.1f}s")
        return round(waited, 1)

    def close(self) -> None:
        self.stop_engines()
        if self.kafka is not None:
            log("stopping the broker")
            self.kafka.stop()
            self.kafka = None
        self.sampler.stop()
        if not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            log(f"kept {self.work}")

    def stop_engines(self) -> None:
        for engine in self.engines:
            with contextlib.suppress(Exception):
                engine.stop()
        self.engines = []

    def broker_pids(self) -> tuple[list[int], str]:
        """The broker's processes and where they come from: the harness's own broker, or
        for ``--bootstrap`` the process listening on its port (shared with whoever else
        uses that broker)."""
        if self.kafka is not None:
            return list(self.kafka.pids), "the broker this harness started"
        port = int(self.bootstrap.split(",")[0].rsplit(":", 1)[-1])
        pids = listening_pids(port)
        return pids, (
            f"the external broker listening on port {port} (pid {pids}); its CPU includes "
            "any other client of that broker meanwhile"
            if pids
            else f"unknown: no process seen listening on port {port}"
        )

    # -- namespaces

    def namespace(self, workload: str, repeat: int) -> str:
        ns = (
            f"bench-{workload.lower()}-{datetime.now().strftime('%H%M%S')}-{repeat}-"
            + (uuid.uuid4().hex[:6])
        )
        ensure_topics(self.bootstrap, ns, PARTITIONS)
        return ns

    def state_dir(self, ns: str) -> Path:
        return self.work / "state" / ns

    def engines_for(
        self, ns: str, instances: int = 1, env: dict[str, str] | None = None, warm: bool = True
    ) -> list[Engine]:
        engines = [
            Engine(self, ns, f"bench-{i + 1}", self.state_dir(ns), env).start()
            for i in range(instances)
        ]
        if warm:
            wait_ready(self, ns, engines)
        return engines


def _raise_exit(*_: object) -> None:
    raise SystemExit(143)


# ----------------------------------------------------------------- readiness


def run_ids_per_partition(prefix: str, per_partition: int = 1) -> list[str]:
    """Run ids that cover every partition ``per_partition`` times (murmur2, like Kafka)."""
    need = {p: per_partition for p in range(PARTITIONS)}
    ids, i = [], 0
    while need:
        rid = f"{prefix}-{i}"
        p = partition_for(rid.encode(), PARTITIONS)
        if p in need:
            ids.append(rid)
            need[p] -= 1
            if not need[p]:
                del need[p]
        i += 1
    return ids


def group_assigned(bootstrap: str, group: str) -> tuple[str, int, int]:
    """(state, members, assigned partitions) of a consumer group."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client_config(bootstrap))
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    except KafkaException:
        return ("unknown", 0, 0)
    assigned = sum(len(m.assignment.topic_partitions) for m in desc.members if m.assignment)
    return (str(desc.state).rsplit(".", 1)[-1], len(desc.members), assigned)


def wait_ready(bench: Bench, ns: str, engines: list[Engine], timeout: float = 180) -> float:
    """Until the group has every engine as a member with all partitions assigned, and a
    warm-up W1 run on every partition completed (so every partition is restored).
    Returns the seconds it took."""
    began = time.perf_counter()
    deadline = time.monotonic() + timeout
    while True:
        for e in engines:
            if not e.alive():
                raise BenchError(
                    f"engine {e.instance} exited during start-up "
                    f"(code {e.proc and e.proc.returncode}):\n" + tail(e.log_text())
                )
        state, members, assigned = group_assigned(bench.bootstrap, f"{ns}.engine")
        if state == "STABLE" and members == len(engines) and assigned == PARTITIONS:
            break
        if time.monotonic() > deadline:
            raise BenchError(
                f"engine group of {ns} not stable after {timeout}s: {state}, "
                f"{members} members, {assigned} partitions assigned"
            )
        time.sleep(0.2)
    with runstream.Client(ns, bench.bootstrap) as client:
        ids = [
            client.start("w1", 0, run_id=rid, wait=False)
            for rid in run_ids_per_partition(f"ready-{uuid.uuid4().hex[:6]}")
        ]
        for rid in ids:
            left = max(1.0, deadline - time.monotonic())
            out = client.result(rid, timeout=left)
            if out != 3:
                raise BenchError(f"warm-up run {rid} returned {out!r}, expected 3")
    return time.perf_counter() - began


class BenchError(RuntimeError):
    pass


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ----------------------------------------------------------------- watching topics


def _end_offsets(consumer: Consumer, topic: str) -> list[TopicPartition]:
    md = consumer.list_topics(topic, timeout=30).topics[topic]
    out = []
    for p in sorted(md.partitions):
        deadline = time.monotonic() + 30
        while True:  # a new topic's leaders may not be ready yet
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        out.append(TopicPartition(topic, p, high))
    return out


def end_offsets(bootstrap: str, topic: str) -> list[TopicPartition]:
    consumer = Consumer({**client_config(bootstrap), "group.id": f"bench-{uuid.uuid4().hex}"})
    try:
        return _end_offsets(consumer, topic)
    finally:
        consumer.close()


class TopicWatcher(threading.Thread):
    """Reads every partition of a topic (read_committed) from its end offsets as taken
    at construction (explicit offsets, so nothing produced after construction is
    missed), and passes each record whose key starts with ``key_prefix`` to
    ``on_record(name, rec, received_perf_counter)``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        key_prefix: bytes = b"",
        on_record: Callable[[str, dict[str, Any], float], None] | None = None,
    ) -> None:
        super().__init__(daemon=True, name=f"watch-{topic}")
        self.topic = topic
        self.key_prefix = key_prefix
        self.on_record = on_record or (lambda *_: None)
        self.codec = Codec.default()
        self.consumer = Consumer(
            {
                **client_config(bootstrap),
                "group.id": f"bench-watch-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
            }
        )
        self.consumer.assign(_end_offsets(self.consumer, topic))
        self._halt = threading.Event()
        self.errors: list[str] = []
        self.records = 0
        self.start()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                # Not consume(1000, 0.05): it waits out the 50 ms for a full batch, which
                # held every completion back until then and paced W2's client by it.
                msgs = consume_ready(self.consumer, 0.05, 1000)
                now, wall_ms = time.perf_counter(), time.time() * 1000
                for msg in msgs:
                    if msg.error() is not None:
                        self.errors.append(str(msg.error()))
                        continue
                    key = msg.key() or b""
                    if not key.startswith(self.key_prefix):
                        continue
                    self.records += 1
                    name, rec = self.codec.decode_raw(msg.value())
                    rec["_seen_ms"] = wall_ms  # when this consumer got it (committed by then)
                    rec["_produced_ms"] = msg.timestamp()[1]  # the producer's CreateTime
                    self.on_record(name, rec, now)
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class Lifecycle:
    """Terminal and suspension events of runs, from ``<ns>.lifecycle``."""

    def __init__(self, bootstrap: str, ns: str, key_prefix: bytes = b"") -> None:
        self.cond = threading.Condition()
        self.terminal: dict[str, tuple[str, dict[str, Any], float]] = {}
        self.terminal_count: dict[str, int] = {}
        self.suspended: dict[str, float] = {}
        self.completions: queue.SimpleQueue[tuple[str, str, dict[str, Any], float]] = (
            queue.SimpleQueue()
        )
        self.watcher = TopicWatcher(bootstrap, f"{ns}.lifecycle", key_prefix, self._on)

    def _on(self, name: str, rec: dict[str, Any], now: float) -> None:
        if name != "LifecycleEvent":
            return
        kind, rid = rec["type"], rec["run_id"]
        if kind in TERMINAL:
            rec = {k: rec[k] for k in ("at_ms", "output", "error", "reason")}  # keep it small
            with self.cond:
                self.terminal_count[rid] = self.terminal_count.get(rid, 0) + 1
                self.terminal.setdefault(rid, (kind, rec, now))
                self.cond.notify_all()
            self.completions.put((rid, kind, rec, now))
        elif kind == "run.suspended":
            with self.cond:
                self.suspended.setdefault(rid, now)
                self.cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def wait_count(self, what: str, n: int, timeout: float) -> bool:
        """Until at least ``n`` runs are ``what`` ("suspended" or "terminal")."""
        seen = self.suspended if what == "suspended" else self.terminal
        return self.wait(lambda: len(seen) >= n, timeout)

    def wait_run(self, what: str, run_id: str, timeout: float) -> bool:
        """Until run ``run_id`` is ``what`` ("suspended" or "terminal")."""
        seen = self.suspended if what == "suspended" else self.terminal
        return self.wait(lambda: run_id in seen, timeout)

    def stop(self) -> None:
        self.watcher.stop()


# ----------------------------------------------------------------- results


def floor_figures() -> dict[str, Any] | None:
    """The floor measured on this machine, if benchmarks/results/floor.json exists."""
    path = RESULTS / "floor.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    m = machine()
    same = all(data.get("machine", {}).get(k) == m[k] for k in ("hostname", "nproc", "cpu_model"))
    return data if same else None


def write_result(workload: str, result: dict[str, Any], summary: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{workload}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"{summary} -> {path.relative_to(ROOT)}", flush=True)
    return path


def base_record(bench: Bench, workload: str, title: str, argv: list[str]) -> dict[str, Any]:
    return {
        "workload": workload,
        "title": title,
        "command": "python -m benchmarks " + " ".join(argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(),
        "broker": {
            "bootstrap": bench.bootstrap,
            "external": bench.external,
            "nodes": 1,
            "startup_s": bench.broker_startup_s,
            "warmup": bench.warmup,
            "config": bench.broker_config,  # beyond the local broker's defaults
            "jvm": bench.broker_jvm,
        },
        "partitions": PARTITIONS,
    }


def finish_record(record: dict[str, Any]) -> dict[str, Any]:
    record["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return record


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
