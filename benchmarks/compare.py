"""``python -m benchmarks compare [--peers DIR] [--rounds N] [flags]``: Runstream beside its
peers, on the same machine in the same sitting (BENCHMARKS.md, "Side by side").

Runs Runstream's harness and each peer's harness interleaved (Runstream, Restate, DBOS,
Temporal, Runstream, Restate, ...), ``--rounds`` rounds. One *leg* is one round of one system's
workloads:

* Runstream: ``python -m benchmarks floor W1 W2 W3 W4 --repeat N`` (one broker, one warm-up),
  read from ``benchmarks/results/<W>.json``;
* Restate: ``RUNS=1 [SKIP_INSTALL=1] bash run.sh --reps N --max-attempts N ...`` in a writable
  copy of ``<peers>/restate`` (default ``/tmp/peer-restate``), read from ``runs/run1.json``;
* DBOS: ``ROUNDS=1 QUIET_WAIT_S=.. ROUND_QUIET_S=.. bash run.sh`` in a writable copy of
  ``<peers>/dbos`` (default ``/tmp/peer-dbos``), read from ``out/*.json`` (its run.sh has no
  size flags: one full round, sensitivity runs included);
* Temporal: ``ROUNDS=1 bash run.sh`` in a writable copy of ``<peers>/temporal`` (default
  ``/tmp/peer-temporal``), read from ``out/*.json`` (one repetition of each workload, W1 and
  W2 with activities and with local activities).

Before each leg: whatever the previous leg left running is ended (by pid; this process is a
child subreaper, so every process a leg started, daemons included, is its descendant), the
peer's ports are checked, and the CPU model, load average and CPU steal (from /proc/stat,
over ``--steal-window`` seconds) are recorded.

Writes ``benchmarks/results/compare.json``, ``benchmarks/results/compare.md`` (printed too)
and, per leg, the files it read and its log under ``benchmarks/results/compare/``.

Nothing here imports runstream: only subprocesses and the JSON files they write.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
ARCHIVE = RESULTS / "compare"
SYSTEMS = ("runstream", "restate", "dbos", "temporal")
NAMES = {"runstream": "Runstream", "restate": "Restate", "dbos": "DBOS", "temporal": "Temporal"}
RUNSTREAM_WORKLOADS = ("floor", "W1", "W2", "W3", "W3b", "W4")
PORTS = {
    "runstream": (),
    "restate": (8080, 9070, 5122, 9080),
    "dbos": (5432,),
    "temporal": (7233,),
}
STABILITY_GOAL = 0.15  # the spread across rounds the figures should stay within
PR_SET_CHILD_SUBREAPER = 36


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] compare: {msg}", file=sys.stderr, flush=True)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ----------------------------------------------------------------- the command line


def shown(path: str | Path) -> str:
    """``path`` as a report shows it: relative to the repository when it is in it or
    beside it (``.venv/bin/python``, ``../shared/peers``), so a report names no one
    machine's layout; anything else (a --work or --runstream-root) as given."""
    p = Path(path)
    return os.path.relpath(p, ROOT) if p.is_absolute() and p.is_relative_to(ROOT.parent) else str(p)


def default_peers() -> Path:
    """``../shared/peers`` beside the repository; in a git worktree, beside the main
    checkout when it is not beside the worktree."""
    here = ROOT.parent / "shared" / "peers"
    if here.is_dir():
        return here
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        common = subprocess.run(
            ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if common:
            main = Path(common).parent.parent / "shared" / "peers"
            if main.is_dir():
                return main
    return here


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks compare",
        description="Runstream's harness and the peers' (Restate, DBOS, Temporal) interleaved, "
        "round by round, with the machine's load recorded before each leg; writes "
        "benchmarks/results/compare.json and compare.md (a table of figures and ratios to "
        "the best peer).",
    )
    p.add_argument(
        "--peers",
        type=Path,
        default=default_peers(),
        help="folder with the peers' harnesses, restate/, dbos/ and temporal/ (read-only is "
        "fine: each is copied to a writable work dir first; default ../shared/peers beside "
        "the repository, for a git worktree beside its main checkout: %(default)s)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp"),
        help="where the writable copies live, as peer-<name>/ (default /tmp: /tmp/peer-restate, "
        "/tmp/peer-dbos, /tmp/peer-temporal); an install already there is reused",
    )
    p.add_argument("--rounds", type=int, default=2, help="rounds of interleaved legs (default 2)")
    p.add_argument(
        "--only",
        "--systems",
        dest="only",
        default=",".join(SYSTEMS),
        help="systems to run, comma-separated, from runstream,restate,dbos,temporal (the "
        "order of the legs stays runstream, restate, dbos, temporal)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="repetitions per leg: Runstream --repeat, Restate --reps (and --max-attempts, so a "
        "noisy repetition is not run again); DBOS and Temporal have no such flag: one per leg "
        "(default 3)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="Runstream only: runs per repeat of every workload (and floor iterations); the "
        "peers' harnesses have fixed sizes (the BENCHMARKS.md ones)",
    )
    p.add_argument(
        "--warmup-seconds",
        type=float,
        default=None,
        help="Runstream only: the broker warm-up before the leg's first workload (harness "
        "default 60)",
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="Runstream only: its --timeout (W4: 180 s)"
    )
    p.add_argument(
        "--runstream-args",
        default="",
        help="more arguments for `python -m benchmarks ...`, as --runstream-args='...'",
    )
    p.add_argument(
        "--runstream-root",
        type=Path,
        default=None,
        help="run Runstream's leg from this checkout (its benchmarks/ and, via PYTHONPATH, its "
        "src/; e.g. a `git clone` of a fixed commit that has this compare) with this "
        "project's virtualenv, instead of this working tree, whose src/ may be in the middle "
        "of an edit",
    )
    p.add_argument(
        "--restate-args",
        default="--w4-long-down 0 --w4-early 0",
        help="arguments for Restate's bench.py, in place of the default %(default)r (only "
        "the W4 of BENCHMARKS.md, not its two extra W4 variants); give it as "
        "--restate-args='...'",
    )
    p.add_argument(
        "--peer-quiet-s",
        type=float,
        default=1,
        help="DBOS's QUIET_WAIT_S and ROUND_QUIET_S (its bounded waits for a quiet machine; "
        "compare does the interleaving; default 1). Restate's bench.py waits up to 60 s for "
        "a quiet machine before each repetition on its own; that has no flag",
    )
    p.add_argument(
        "--skip-install",
        action="store_true",
        help="reuse the peers' installs in the work dirs (Restate: SKIP_INSTALL=1 from the first "
        "leg; DBOS's run.sh only installs what is missing anyway); fail a peer at once when "
        "its install is not there",
    )
    p.add_argument(
        "--steal-window", type=float, default=2.0, help="seconds of /proc/stat per snapshot (2)"
    )
    p.add_argument(
        "--leg-timeout",
        type=float,
        default=3600,
        help="end a leg (its whole process tree) after this many seconds (3600)",
    )
    p.add_argument(
        "--port-wait",
        type=float,
        default=60,
        help="wait this long for a peer's ports held by processes compare did not start, then "
        "skip the leg (60)",
    )
    p.add_argument(
        "--table-only",
        action="store_true",
        help="run nothing: rebuild compare.json's figures and compare.md from the legs in "
        "benchmarks/results/compare.json",
    )
    return p


# ----------------------------------------------------------------- processes


def become_subreaper() -> bool:
    """Orphaned descendants (daemons a leg starts, children of a killed process) are
    re-parented to this process instead of init, so they can all be found and ended."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False


class Reaper(threading.Thread):
    """Reaps zombie descendants re-parented to this process, except the leg's own process
    (its Popen waits for it)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="reaper")
        self.keep: set[int] = set()
        self.lock = threading.Lock()  # held while a leg's process is started
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            self.reap()

    def reap(self) -> None:
        with self.lock, contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                if child.pid in self.keep:
                    continue
                with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                    if child.status() == psutil.STATUS_ZOMBIE:
                        os.waitpid(child.pid, os.WNOHANG)

    def stop(self) -> None:
        self._halt.set()


def descendants() -> list[psutil.Process]:
    """Every live process below this one (all were started by compare's legs)."""
    out = []
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
    return out


def describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:120] or proc.name()}"
    except psutil.Error:
        return str(proc.pid)


def end_descendants(reaper: Reaper, grace: float = 10.0) -> list[str]:
    """SIGTERM every descendant (by pid), SIGKILL what is left after ``grace`` s."""
    procs = descendants()
    if not procs:
        return []
    ended = [describe(p) for p in procs]
    log(f"ending {len(procs)} leftover process(es): {'; '.join(ended)}")
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    reaper.reap()
    return ended


def port_holders(ports: tuple[int, ...]) -> dict[int, list[int]]:
    """Port -> pids listening on it (TCP, any address)."""
    held: dict[int, list[int]] = {}
    if not ports:
        return held
    with contextlib.suppress(psutil.Error):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports:
                held.setdefault(c.laddr.port, []).append(c.pid or 0)
    return held


def run_leg(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    log_path: Path,
    timeout: float,
    reaper: Reaper,
    label: str,
) -> dict[str, Any]:
    """Run one leg's command (stdout and stderr to ``log_path``), bounded in time."""
    os.sync()  # every system starts with the last leg's dirty pages written back
    began, t0 = now_iso(), time.monotonic()
    log(f"{label}: {' '.join(shlex.quote(c) for c in cmd)} (in {cwd}; log {log_path})")
    timed_out = False
    with log_path.open("wb") as out:
        with reaper.lock:
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            reaper.keep.add(proc.pid)
        try:
            said = time.monotonic()
            while True:
                try:
                    rc = proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - t0 > timeout:
                    log(f"{label}: over --leg-timeout ({timeout:g} s): ending it")
                    timed_out = True
                    end_descendants(reaper)
                    rc = proc.wait(timeout=30)
                    break
                if time.monotonic() - said > 60:
                    said = time.monotonic()
                    log(
                        f"{label}: running for {time.monotonic() - t0:.0f} s; last line: "
                        f"{last_line(log_path)}"
                    )
        except BaseException:
            end_descendants(reaper)
            with contextlib.suppress(Exception):
                proc.wait(timeout=30)
            raise
        finally:
            reaper.keep.discard(proc.pid)
    took = round(time.monotonic() - t0, 1)
    log(f"{label}: exit code {rc} after {took} s")
    return {
        "command": " ".join(shlex.quote(c) for c in [shown(cmd[0]), *cmd[1:]]),
        "cwd": shown(cwd),
        "started": began,
        "duration_s": took,
        "exit_code": rc,
        "timed_out": timed_out,
        "log": shown(log_path),
    }


def last_line(path: Path, lines: int = 1) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ----------------------------------------------------------------- the machine


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Hardware")):
                return line.split(":", 1)[1].strip()
    return ""


def machine() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "memory_total_mb": round(psutil.virtual_memory().total / 2**20),
        "kernel": os.uname().release,
    }


def _proc_stat_cpu() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def snapshot(window: float) -> dict[str, Any]:
    """CPU model, load average and, over ``window`` s of /proc/stat, CPU steal and busy
    shares of the whole machine, plus the processes that used most CPU meanwhile."""
    procs = []
    for p in psutil.process_iter(["pid", "name"]):
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
            procs.append(p)
    a = _proc_stat_cpu()
    time.sleep(window)
    b = _proc_stat_cpu()
    d = [y - x for x, y in zip(a, b, strict=False)]
    # user nice system idle iowait irq softirq steal (guest time is inside user/nice)
    total = sum(d[:8]) or 1
    idle = d[3] + d[4]
    steal = d[7] if len(d) > 7 else 0
    top = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            pct = p.cpu_percent(None)
            if pct >= 5:
                top.append((pct, f"{p.pid} {' '.join(p.cmdline())[:100] or p.info['name']}"))
    top.sort(reverse=True)
    return {
        "at": now_iso(),
        "cpu_model": cpu_model(),
        "nproc": len(os.sched_getaffinity(0)),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "window_s": window,
        "steal_pct": round(100 * steal / total, 2),
        "busy_pct": round(100 * (total - idle - steal) / total, 1),
        "top_processes_cpu_pct_of_one_core": [f"{pct:.0f}% {what}" for pct, what in top[:6]],
    }


# ----------------------------------------------------------------- small helpers


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def dig(d: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(d, dict):
            d = d.get(k)
        elif isinstance(d, list) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return None
    return d


def num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return None if math.isnan(x) else float(x)


def median(xs: list[Any]) -> float | None:
    vs = [v for v in (num(x) for x in xs) if v is not None]
    return statistics.median(vs) if vs else None


def total(xs: list[Any]) -> float | None:
    vs = [v for v in (num(x) for x in xs) if v is not None]
    return sum(vs) if vs else None


def add(*xs: Any) -> float | None:
    vs = [num(x) for x in xs]
    return None if any(v is None for v in vs) else sum(v for v in vs if v is not None)


def archive(files: list[Path], dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for f in files:
        if f.is_file():
            shutil.copy2(f, dest / f.name)
            out.append(str((dest / f.name).relative_to(ROOT)))
    return out


def copy_peer(src: Path, dst: Path) -> None:
    """Copy the peer's harness over its work dir (keeping an install there), writable."""
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes()
        if not target.exists() or target.read_bytes() != data:
            if target.exists():
                target.chmod(target.stat().st_mode | 0o200)
            target.write_bytes(data)
        target.chmod(path.stat().st_mode | 0o200)


def peer_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment without this project's virtualenv (the peers use their own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    env.update(extra)
    return env


# ----------------------------------------------------------------- the legs

# A leg's figures: {figure key: {variant: value}}; "main" is a system's only variant.


@dataclass
class Ctx:
    args: argparse.Namespace
    reaper: Reaper
    installed: dict[str, bool]  # a peer whose install worked once: SKIP_INSTALL from then on


def leg_runstream(ctx: Ctx, rnd: int, dest: Path) -> dict[str, Any]:
    a = ctx.args
    py = ROOT / ".venv" / "bin" / "python"
    root = a.runstream_root or ROOT
    cmd = [str(py if py.exists() else Path(sys.executable)), "-m", "benchmarks"]
    cmd += [*RUNSTREAM_WORKLOADS, "--repeat", str(a.repeat)]
    if a.runs is not None:
        cmd += ["--runs", str(a.runs)]
    if a.warmup_seconds is not None:
        cmd += ["--warmup-seconds", f"{a.warmup_seconds:g}"]
    if a.timeout is not None:
        cmd += ["--timeout", f"{a.timeout:g}"]
    cmd += shlex.split(a.runstream_args)
    env = dict(os.environ)
    if a.runstream_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(root / "src"), env.get("PYTHONPATH", "")) if p
        )
    since = time.time()
    leg = run_leg(cmd, root, env, dest / "leg.log", a.leg_timeout, ctx.reaper, leg_label(rnd))
    files, data = [], {}
    for w in RUNSTREAM_WORKLOADS:
        path = root / "benchmarks" / "results" / f"{w}.json"
        if path.exists() and path.stat().st_mtime >= since:
            files.append(path)
            data[w] = read_json(path)
        else:
            leg.setdefault("missing", []).append(f"{w}: no {path.name} written by this leg")
    leg["files"] = archive(files, dest)
    leg["figures"] = runstream_figures(data)
    w1 = data.get("W1") or next(iter(data.values()), None) or {}
    leg["versions"] = {
        "runstream_git_commit": dig(w1, "versions", "runstream_git_commit"),
        "runstream_src_changes": dig(w1, "versions", "runstream_src_changes"),
        "kafka_broker": dig(w1, "versions", "kafka_broker"),
        "confluent_kafka": dig(w1, "versions", "confluent_kafka"),
        "python": dig(w1, "versions", "python"),
    }
    if a.runstream_root is not None:
        leg["versions"]["runstream_root"] = str(root)
    leg["sizes"] = {w: dig(d, "params") for w, d in data.items()}
    return leg


def runstream_figures(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    w1, w2, w3, w3b, w4, fl = (data.get(k) or {} for k in (*RUNSTREAM_WORKLOADS[1:], "floor"))
    reps4 = dig(w4, "repeats") or []
    engine, broker = dig(w2, "peak_rss_mb", "engine"), dig(w2, "peak_rss_mb", "broker")
    f = {
        "W1_p50": dig(w1, "summary", "latency_ms", "p50", "median"),
        "W1_p99": dig(w1, "summary", "latency_ms", "p99", "median"),
        "W2_runs_per_s": dig(w2, "summary", "runs_per_s", "median"),
        "W3_p50": dig(w3, "summary", "round_trip_ms", "p50", "median"),
        "W3_p99": dig(w3, "summary", "round_trip_ms", "p99", "median"),
        "W3b_p50": dig(w3b, "summary", "round_trip_ms", "p50", "median"),
        "W3b_p99": dig(w3b, "summary", "round_trip_ms", "p99", "median"),
        "W4_lost": total([r.get("runs_lost") for r in reps4]),
        "W4_dup": total([r.get("duplicated_step_executions") for r in reps4]),
        "W4_runs": total([r.get("runs") for r in reps4]),
        "W4_restart_s": dig(w4, "summary", "restart_to_all_completed_s", "median"),
        "W4_recovery_s": dig(w4, "summary", "recovery_cost_s", "median"),
        "CPU_engine": dig(w2, "summary", "cpu_s_per_1000_runs", "engine", "median"),
        "CPU_total": dig(w2, "summary", "cpu_s_per_1000_runs", "total", "median"),
        "RSS_engine": engine,
        "RSS_total": add(engine, broker),
        "floor_txn_p50": dig(fl, "summary", "txn_commit_ms", "p50", "median"),
        "floor_txn_p99": dig(fl, "summary", "txn_commit_ms", "p99", "median"),
        "floor_hop_p50": dig(fl, "summary", "hop_ms", "p50", "median"),
        "floor_txns_per_s": dig(fl, "summary", "batch_txns_per_s", "median"),
        "floor_round_trip_p50": dig(fl, "summary", "round_trip_ms", "p50", "median"),
    }
    out = {k: {"main": v} for k, v in f.items() if v is not None}
    if engine is not None:
        out["RSS_parts"] = {"engine incl. supervisor": engine, "Kafka broker": broker}
    return out


def per_1000(cpu_s: Any, runs: Any) -> float | None:
    """CPU seconds per 1,000 completed runs."""
    c, n = num(cpu_s), num(runs)
    return round(1000 * c / n, 3) if c is not None and n else None


def recovery(restart_s: Any, due_s: Any) -> float | None:
    """W4's recovery cost: restart -> all completed minus the sleep still due at the kill."""
    r, d = num(restart_s), num(due_s)
    return None if r is None or d is None else round(r - max(0.0, d), 3)


def _install_missing(name: str, work: Path) -> str | None:
    """Why the peer's install in ``work`` is not usable, or None."""
    if name == "restate":
        for need in (
            "node_modules/@restatedev/restate-server-linux-x64/bin/restate-server",
            ".venv/bin/python",
        ):
            if not (work / need).exists():
                return f"{work / need} does not exist"
    if name == "temporal":
        for need in ("bin/temporal", ".venv/bin/python"):
            if not (work / need).exists():
                return f"{work / need} does not exist"
    if name == "dbos":
        if not (work / ".venv/bin/python").exists():
            return f"{work / '.venv/bin/python'} does not exist"
        if subprocess.run(["dpkg", "-s", "postgresql"], capture_output=True).returncode != 0:
            return "the Debian package postgresql is not installed (`dpkg -s postgresql`)"
    return None


def leg_peer(ctx: Ctx, name: str, rnd: int, dest: Path) -> dict[str, Any]:
    a = ctx.args
    src, work = a.peers / name, a.work / f"peer-{name}"
    copy_peer(src, work)
    if name == "restate":
        shutil.rmtree(work / "runs", ignore_errors=True)
        (work / "results.json").unlink(missing_ok=True)
        skip = a.skip_install or ctx.installed.get(name, False)
        env = peer_env({"RUNS": "1", "SKIP_INSTALL": "1" if skip else "0"})
        reps = str(a.repeat)
        cmd = ["bash", "run.sh", "--reps", reps, "--max-attempts", reps]
        cmd += shlex.split(a.restate_args)
    elif name == "temporal":
        (work / "results.json").unlink(missing_ok=True)  # its run.sh clears out/ itself
        env = peer_env({"ROUNDS": "1"})
        cmd = ["bash", "run.sh"]
    else:
        (work / "results.json").unlink(missing_ok=True)
        for p in (work / "out").glob("*.json"):
            p.unlink()
        q = f"{a.peer_quiet_s:g}"
        env = peer_env({"ROUNDS": "1", "QUIET_WAIT_S": q, "ROUND_QUIET_S": q})
        cmd = ["bash", "run.sh"]
    leg = run_leg(cmd, work, env, dest / "leg.log", a.leg_timeout, ctx.reaper, leg_label(rnd, name))
    leg["env"] = {k: env[k] for k in ("RUNS", "SKIP_INSTALL", "ROUNDS", "QUIET_WAIT_S") if k in env}
    if name == "restate":
        files = [work / "runs" / "run1.json", work / "results.json", work / "pip-freeze.txt"]
        leg["files"] = archive(files, dest)
        run = read_json(work / "runs" / "run1.json")
        leg["figures"], leg["notes"] = restate_figures(run or {})
        leg["versions"] = dig(run, "versions")
    elif name == "temporal":
        files = [*sorted((work / "out").glob("*.json")), work / "results.json"]
        leg["files"] = archive(files, dest)
        out = {p.stem: read_json(p) for p in (work / "out").glob("*.json")}
        leg["figures"], leg["notes"] = temporal_figures(out)
        leg["versions"] = temporal_versions(out.get("meta") or {})
    else:
        files = [*sorted((work / "out").glob("*.json")), work / "results.json"]
        leg["files"] = archive(files, dest)
        out = {p.stem: read_json(p) for p in (work / "out").glob("*.json")}
        leg["figures"], leg["notes"] = dbos_figures(out)
        res = read_json(work / "results.json")
        leg["versions"] = {
            "dbos": dig(res, "versions", "packages", "dbos"),
            "postgres_server": dig(res, "versions", "postgres_server"),
            "postgres_deb_package": dig(res, "versions", "postgres_deb_package"),
            "python": dig(res, "versions", "python"),
        }
    if leg["figures"]:
        ctx.installed[name] = True
    mine = {p.pid for p in descendants()}
    if name == "dbos" and any(
        pid in mine for pids in port_holders((5432,)).values() for pid in pids
    ):
        # run.sh stops PostgreSQL at its end; when it did not get there, its own stop script
        log("the PostgreSQL the DBOS leg started still runs: bash pg_stop.sh")
        subprocess.run(["bash", "pg_stop.sh"], cwd=work, capture_output=True, timeout=120)
    return leg


def restate_figures(run: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A leg's figures from Restate's runs/run1.json: medians over *all* its repetitions
    (as for Runstream; its own summarize.py uses the ones it calls quiet only)."""

    def reps(key: str) -> list[dict[str, Any]]:
        return dig(run, key, "reps") or []

    w1, w2 = reps("W1_latency"), reps("W2_throughput")
    w3, w3b = reps("W3_signal"), reps("W3b_awakeable")
    w4 = [
        r
        for r in reps("W4_durability")
        if r.get("kill_when") == "durable_sleep" and not r.get("down_s_requested")
    ]

    def rt(rs: list[dict[str, Any]], k: str) -> float | None:
        return median([dig(r, "signal_to_completion_ms", k) for r in rs])

    def peak(proc: str) -> float | None:
        vs = [num(dig(r, "resources", proc, "vmhwm_mib")) for r in w2]
        return max((v for v in vs if v is not None), default=None)

    server, service = peak("restate_server"), peak("python_service")
    # CPU of restate-server (it holds its own log: no other database) and the service
    cpu = median(
        [
            per_1000(
                add(
                    dig(r, "resources", "restate_server", "cpu_s"),
                    dig(r, "resources", "python_service", "cpu_s"),
                ),
                r.get("runs"),
            )
            for r in w2
        ]
    )
    # No step times are recorded: the sleep still due at the kill (all runs asleep then) is
    # taken as the whole sleep, its upper bound, which gives Restate its lowest cost.
    cost = median(
        [recovery(r.get("restart_to_all_completed_s"), r.get("sleep_s", 2.0)) for r in w4]
    )
    f: dict[str, dict[str, Any]] = {
        "W1_p50": {"main": median([r.get("p50") for r in w1])},
        "W1_p99": {"main": median([r.get("p99") for r in w1])},
        "W2_runs_per_s": {"main": median([r.get("runs_per_s") for r in w2])},
        "W3_p50": {"promise (W3)": rt(w3, "p50"), "awakeable (W3b)": rt(w3b, "p50")},
        "W3_p99": {"promise (W3)": rt(w3, "p99"), "awakeable (W3b)": rt(w3b, "p99")},
        "W3b_p50": {"awakeable": rt(w3b, "p50")},
        "W3b_p99": {"awakeable": rt(w3b, "p99")},
        "W4_lost": {"main": total([r.get("runs_lost") for r in w4])},
        "W4_dup": {"main": total([r.get("duplicate_step_executions") for r in w4])},
        "W4_runs": {"main": total([r.get("runs") for r in w4])},
        "W4_restart_s": {"main": median([r.get("restart_to_all_completed_s") for r in w4])},
        "W4_recovery_s": {"main": cost},
        "CPU_engine": {"main": cpu},
        "CPU_total": {"main": cpu},
        "RSS_engine": {"main": add(server, service)},
        "RSS_total": {"main": add(server, service)},
    }
    f = {k: {v: x for v, x in d.items() if x is not None} for k, d in f.items()}
    f = {k: d for k, d in f.items() if d}
    if server is not None:
        f["RSS_parts"] = {"restate-server (VmHWM)": server, "Python service (VmHWM)": service}
    notes = {
        "noisy_reps_by_its_own_check": {
            k: sum(1 for r in reps(k) if r.get("noisy"))
            for k in ("W1_latency", "W2_throughput", "W3_signal", "W3b_awakeable")
        },
        "reps": {k: len(reps(k)) for k in ("W1_latency", "W2_throughput", "W3_signal")},
        "w2_errors": total([r.get("errors") for r in w2]),
        "w4_reps": len(w4),
    }
    return f, notes


def dbos_figures(out: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A leg's figures from DBOS's out/*.json (one round: w1_r1, w2_r1, w2q_p*_r1, w3_r1,
    w4_r1, and the W2 memory round w2_mem)."""
    w1, w2, w3, w4 = (out.get(f"{k}_r1") or {} for k in ("w1", "w2", "w3", "w4"))
    mon = dig(out, "w2_mem", "monitor") or {}

    def cpu(d: dict[str, Any] | None, part: str) -> float | None:
        """Per 1,000 runs completed in its window (cpuacct's, from before the untimed
        warm-up runs to the end: those runs count too)."""
        acc = dig(d, "cpu_accounting") or {}
        own, pg = acc.get("own_process_cpu_s"), acc.get("postgres_cpu_s")
        runs = add(dig(d, "runs"), dig(d, "warmup_runs"))
        return per_1000(own if part == "engine" else add(own, pg), runs)

    q05, q1 = out.get("w2q_p0.05_r1"), out.get("w2q_p1.0_r1")
    # the sleep still due at the kill, from its step log's times: the last 'before' step
    # + 2 s - the kill (kill -> restart is kill_to_all_done - restart_to_all_done)
    k2a, r2a, r_minus_deadline = (
        num(w4.get(k))
        for k in (
            "kill_to_all_done_s",
            "restart_to_all_done_s",
            "restart_minus_last_sleep_deadline_s",
        )
    )
    due = None
    if k2a is not None and r2a is not None and r_minus_deadline is not None:
        due = (k2a - r2a) - r_minus_deadline
    py, pg = num(mon.get("python_peak_rss_mib")), num(mon.get("postgres_peak_pss_sum_mib"))
    f: dict[str, dict[str, Any]] = {
        "W1_p50": {"main": w1.get("p50_ms")},
        "W1_p99": {"main": w1.get("p99_ms")},
        "W2_runs_per_s": {
            "thread pool": w2.get("runs_per_s"),
            "queue, poll 0.05 s": dig(out, "w2q_p0.05_r1", "runs_per_s"),
            "queue, poll 1 s": dig(out, "w2q_p1.0_r1", "runs_per_s"),
        },
        "W3_p50": {"main": w3.get("p50_ms")},
        "W3_p99": {"main": w3.get("p99_ms")},
        "W4_lost": {"main": w4.get("runs_lost")},
        "W4_dup": {"main": w4.get("duplicate_step_executions")},
        "W4_runs": {"main": w4.get("runs")},
        "W4_restart_s": {"main": w4.get("restart_to_all_done_s")},
        "W4_recovery_s": {"main": recovery(w4.get("restart_to_all_done_s"), due)},
        "CPU_engine": {
            "thread pool": cpu(w2, "engine"),
            "queue, poll 0.05 s": cpu(q05, "engine"),
            "queue, poll 1 s": cpu(q1, "engine"),
        },
        "CPU_total": {
            "thread pool": cpu(w2, "total"),
            "queue, poll 0.05 s": cpu(q05, "total"),
            "queue, poll 1 s": cpu(q1, "total"),
        },
        "RSS_engine": {"main": py},
        "RSS_total": {"main": add(py, pg)},
    }
    f = {k: {v: x for v, x in d.items() if num(x) is not None} for k, d in f.items()}
    f = {k: d for k, d in f.items() if d}
    if py is not None:
        f["RSS_parts"] = {
            "Python process: DBOS, steps, 64 client threads": py,
            "PostgreSQL (PSS summed over its processes)": pg,
            "PostgreSQL (RSS summed)": num(mon.get("postgres_peak_rss_sum_mib")),
        }
    notes = {
        "other_cpu_share_of_machine": {
            k: dig(v, "cpu_accounting", "other_cpu_share_of_machine") for k, v in out.items()
        },
        "w4_wrong_results": w4.get("wrong_results"),
    }
    return f, notes


def temporal_figures(out: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A leg's figures from Temporal's out/*.json (one round: W1-act-r1, W1-local-r1,
    W2-act-r1, W2-local-r1, W3-r1, W4-r1; see its bench.py). Activities and local
    activities are variants of W1 and W2."""
    w1a, w1l, w2a, w2l, w3, w4 = (
        out.get(k) or {}
        for k in ("W1-act-r1", "W1-local-r1", "W2-act-r1", "W2-local-r1", "W3-r1", "W4-r1")
    )

    def both(key: str) -> dict[str, Any]:
        return {"activities": w1a.get(key), "local activities": w1l.get(key)}

    def cpu(d: dict[str, Any]) -> float | None:
        # the dev server (its SQLite inside) and the worker, over the timed W2 window only
        acc = d.get("cpu_accounting") or {}
        return per_1000(add(acc.get("server_cpu_s"), acc.get("worker_cpu_s")), d.get("n"))

    def rss(d: dict[str, Any]) -> float | None:
        peak = d.get("peak_rss_sampled_mib") or {}
        return add(peak.get("server"), peak.get("worker"))

    # No step times are recorded: the sleep still due at the kill is taken as the whole
    # sleep, its upper bound (exact for a run whose 'before' step had not run), which gives
    # Temporal its lowest cost.
    cost = recovery(w4.get("restart_to_all_done_s"), 2.0)
    f: dict[str, dict[str, Any]] = {
        "W1_p50": both("p50_ms"),
        "W1_p99": both("p99_ms"),
        "W2_runs_per_s": {
            "activities": w2a.get("runs_per_s"),
            "local activities": w2l.get("runs_per_s"),
        },
        "W3_p50": {"main": w3.get("p50_ms")},
        "W3_p99": {"main": w3.get("p99_ms")},
        "W4_lost": {"main": w4.get("runs_lost")},
        "W4_dup": {"main": w4.get("duplicate_step_executions")},
        "W4_runs": {"main": w4.get("n")},
        "W4_restart_s": {"main": w4.get("restart_to_all_done_s")},
        "W4_recovery_s": {"main": cost},
        "CPU_engine": {"activities": cpu(w2a), "local activities": cpu(w2l)},
        "CPU_total": {"activities": cpu(w2a), "local activities": cpu(w2l)},
        "RSS_engine": {"activities": rss(w2a), "local activities": rss(w2l)},
        "RSS_total": {"activities": rss(w2a), "local activities": rss(w2l)},
    }
    f = {k: {v: x for v, x in d.items() if num(x) is not None} for k, d in f.items()}
    f = {k: d for k, d in f.items() if d}
    if rss(w2a) is not None:
        peak = w2a.get("peak_rss_sampled_mib") or {}
        f["RSS_parts"] = {
            "dev server incl. SQLite (sampled peak)": peak.get("server"),
            "worker (sampled peak)": peak.get("worker"),
        }
    notes = {
        "w2_wrong_results": add(w2a.get("wrong_results"), w2l.get("wrong_results") or 0),
        "w4_restart_to_server_ready_s": w4.get("restart_to_server_ready_s"),
        "w4_at_kill": {
            k: w4.get(k)
            for k in (
                "runs_asleep_at_kill",
                "runs_before_step_not_done_at_kill",
                "runs_past_sleep_at_kill",
            )
        },
    }
    return f, notes


def temporal_versions(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in ("temporal_cli", "temporalio", "python", "server_cmd")}


def refigure(leg: dict[str, Any]) -> None:
    """Read a leg's figures again from the files archived with it (``--table-only``)."""
    files = {Path(f).name: ROOT / f for f in leg.get("files", [])}
    if leg["system"] == "runstream":
        data = {
            w: read_json(files[f"{w}.json"]) for w in RUNSTREAM_WORKLOADS if f"{w}.json" in files
        }
        leg["figures"] = runstream_figures(data)
    elif leg["system"] == "restate" and "run1.json" in files:
        leg["figures"], leg["notes"] = restate_figures(read_json(files["run1.json"]) or {})
    elif leg["system"] in ("dbos", "temporal"):
        out = {Path(n).stem: read_json(f) for n, f in files.items() if n != "results.json"}
        figures = dbos_figures if leg["system"] == "dbos" else temporal_figures
        leg["figures"], leg["notes"] = figures(out)


def leg_label(rnd: int, name: str = "runstream") -> str:
    return f"round {rnd} {NAMES[name]}"


# ----------------------------------------------------------------- figures and the table


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    better: str  # "lower" | "higher"
    digits: int = 1
    count: str = ""  # W4 counts: summed over the rounds, shown as "n <count> N runs"
    ratio: bool = True  # the floor is Runstream's only (Kafka itself): no peer, no ratio
    goal: float | None = None  # issue 23's goal for the ratio to the best peer


FIGURES = (
    Figure("W1_p50", "W1 latency p50", "ms", "lower", goal=1.0),
    Figure("W1_p99", "W1 latency p99", "ms", "lower", goal=1.0),
    Figure("W2_runs_per_s", "W2 throughput", "runs/s", "higher", 0, goal=2.5),
    Figure("W3_p50", "W3 signal round trip p50", "ms", "lower", goal=1.0),
    Figure("W3_p99", "W3 signal round trip p99", "ms", "lower"),
    Figure("W3b_p50", "W3b promise (awakeable) resolved by a client, p50", "ms", "lower"),
    Figure("W3b_p99", "W3b promise (awakeable) resolved by a client, p99", "ms", "lower"),
    Figure("W4_lost", "W4 runs lost", "", "lower", 0, count="of"),
    Figure("W4_dup", "W4 re-run (duplicated) step executions", "", "lower", 0, count="in"),
    Figure("W4_restart_s", "W4 restart → all completed", "s", "lower", 2),
    Figure(
        "W4_recovery_s",
        "W4 recovery cost: restart → all completed minus sleep still due at the kill",
        "s",
        "lower",
        2,
        goal=0.5,
    ),
    Figure("CPU_engine", "CPU per 1,000 runs in W2: engine processes", "s", "lower", 2),
    Figure(
        "CPU_total", "CPU per 1,000 runs in W2: engine + its database", "s", "lower", 2, goal=0.5
    ),
    Figure("RSS_engine", "RSS during W2: engine processes", "MiB", "lower", 0),
    Figure("RSS_total", "RSS during W2: engine + its database", "MiB", "lower", 0),
    Figure("floor_txn_p50", "Kafka floor: txn commit p50", "ms", "lower", 2, ratio=False),
    Figure("floor_txn_p99", "Kafka floor: txn commit p99", "ms", "lower", 2, ratio=False),
    Figure("floor_hop_p50", "Kafka floor: produce→consume hop p50", "ms", "lower", 2, ratio=False),
    Figure("floor_txns_per_s", "Kafka floor: 64-record txns", "txns/s", "higher", 0, ratio=False),
    Figure(
        "floor_round_trip_p50",
        "Kafka floor: W3's round trip, no engine, p50",
        "ms",
        "lower",
        2,
        ratio=False,
    ),
)


def stats(pairs: list[tuple[int, float]]) -> dict[str, Any]:
    values = [v for _, v in pairs]
    med = statistics.median(values)
    return {
        "rounds": values,
        "round_numbers": [r for r, _ in pairs],
        "median": round(med, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
        "spread": round((max(values) - min(values)) / med, 3) if len(values) > 1 and med else None,
    }


def aggregate(legs: list[dict[str, Any]], systems: list[str]) -> list[dict[str, Any]]:
    """Per figure: every system's variants over the rounds, Runstream's median and spread,
    the best peer (over every peer's variants) and the ratio."""
    out = []
    for fig in FIGURES:
        per: dict[str, dict[str, Any]] = {}
        for s in systems:
            variants: dict[str, list[tuple[int, float]]] = {}
            runs: list[float] = []
            for leg in legs:
                if leg["system"] != s:
                    continue
                for v, x in (dig(leg, "figures", fig.key) or {}).items():
                    if num(x) is not None:
                        variants.setdefault(v, []).append((leg["round"], float(x)))
                if fig.count and num(dig(leg, "figures", "W4_runs", "main")) is not None:
                    runs.append(float(leg["figures"]["W4_runs"]["main"]))
            if variants:
                per[s] = {v: stats(xs) for v, xs in variants.items()}
                if fig.count:
                    for v, xs in variants.items():
                        per[s][v]["total"] = sum(x for _, x in xs)
                        per[s][v]["runs_total"] = sum(runs)
        entry: dict[str, Any] = {
            "key": fig.key,
            "label": fig.label,
            "unit": fig.unit,
            "better": fig.better,
            "ratio_favours_runstream_when": ("< 1" if fig.better == "lower" else "> 1")
            if fig.ratio and not fig.count
            else None,
            "systems": per,
            "runstream": dig(per, "runstream", "main"),
            "best_peer": None,
            "ratio": None,
        }
        pick = min if fig.better == "lower" else max
        which = "total" if fig.count else "median"
        cands = [
            (st[which], s, v) for s, vs in per.items() if s != "runstream" for v, st in vs.items()
        ]
        if fig.ratio and cands:
            best = pick(cands, key=lambda c: c[0])
            entry["best_peer"] = {"system": best[1], "variant": best[2], which: best[0]}
            ties = sorted({c[1] for c in cands if c[0] == best[0]} - {best[1]})
            if ties:
                entry["best_peer"]["tied_with"] = ties
            ours = entry["runstream"]
            if ours and best[0] and not fig.count:
                entry["ratio"] = round(ours["median"] / best[0], 3)
        ours = entry["runstream"]
        if ours and ours.get("spread") is not None and not fig.count:
            entry["runstream_spread_within_goal"] = ours["spread"] <= STABILITY_GOAL
        if not fig.count:
            entry["spread_over_goal"] = [
                f"{s} {v}"
                for s, vs in per.items()
                for v, st in vs.items()
                if st.get("spread") is not None and st["spread"] > STABILITY_GOAL
            ]
        if fig.goal is not None and entry["ratio"] is not None:
            entry["goal"] = fig.goal
            entry["goal_met"] = (
                entry["ratio"] <= fig.goal if fig.better == "lower" else entry["ratio"] >= fig.goal
            )
        out.append(entry)
    return out


def fmt(x: float | None, digits: int, unit: str = "") -> str:
    if x is None:
        return "n/a"
    s = f"{x:,.{digits}f}"
    return f"{s} {unit}".rstrip() if unit else s


def spread_text(st: dict[str, Any] | None) -> str:
    """A figure's spread across rounds, flagged when over the goal."""
    if not st or st.get("spread") is None:
        return "1 round" if st and st.get("n") == 1 else "n/a"
    text = f"{100 * st['spread']:.0f} %"
    return text + " ⚠ > 15 %" if st["spread"] > STABILITY_GOAL else text


def cell(
    st: dict[str, Any] | None, fig: Figure, with_range: bool = True, with_spread: bool = False
) -> str:
    if not st:
        return "n/a"
    if fig.count:
        return f"{fmt(st['total'], 0)} {fig.count} {fmt(st.get('runs_total'), 0)} runs"
    s = fmt(st["median"], fig.digits, fig.unit)
    if with_range and st["n"] > 1:
        s += f" ({fmt(st['min'], fig.digits)}-{fmt(st['max'], fig.digits)})"
    if with_spread and st["n"] > 1:
        s += f", spread {spread_text(st)}"
    return s


def peer_cell(variants: dict[str, Any] | None, fig: Figure) -> str:
    if not variants:
        return "—" if not fig.ratio else "n/a"
    if list(variants) == ["main"]:
        return cell(variants["main"], fig, with_spread=True)
    return "; ".join(
        f"{v}: {cell(st, fig, with_range=False, with_spread=True)}" for v, st in variants.items()
    )


def goal_text(entry: dict[str, Any], fig: Figure) -> str:
    if fig.goal is None:
        return "—"
    want = f"{'≤' if fig.better == 'lower' else '≥'} {fig.goal:g}x"
    if "goal_met" not in entry:
        return want
    return want + (" ✓" if entry["goal_met"] else " ✗")


def markdown(report: dict[str, Any]) -> str:
    systems = [s for s in SYSTEMS if s in report["settings"]["systems"]]
    peers = [s for s in systems if s != "runstream"]
    legs = report["legs"]
    m = report["machine"]
    L = []
    started = report.get("started", "")[:16].replace("T", " ")
    took = report.get("duration_s")
    L.append(f"Side by side, {started} UTC: `{report['command']}`")
    L.append("")
    order = ", ".join(NAMES[s] for s in systems)
    L.append(
        f"{report['settings']['rounds']} round(s) interleaved ({order}, ...), {len(legs)} legs"
        + (f", {took / 60:.0f} min in all" if took else "")
        + f'. Machine: nproc {m["nproc"]}, CPU "{m["cpu_model"]}", '
        f"{m['memory_total_mb']:,} MB memory."
    )
    snaps = [leg["before"] for leg in legs if leg.get("before")]
    if snaps:
        loads = [s["load_average"][0] for s in snaps]
        steal = [s["steal_pct"] for s in snaps]
        L.append(
            f"Before each leg: 1-min load average {min(loads):.2f}-{max(loads):.2f}, CPU steal "
            f"{min(steal):.1f}-{max(steal):.1f} % (over {snaps[0]['window_s']:g} s of /proc/stat)."
        )
    L.append("Versions: " + "; ".join(report["versions_line"][s] for s in systems) + ".")
    L.append("Per leg: " + "; ".join(report["sizes_line"][s] for s in systems) + ".")
    for s, st in report["systems"].items():
        if st.get("status") != "ok":
            first, *rest = str(st.get("reason")).splitlines() or [""]
            L.append("")
            L.append(f"**{NAMES[s]} {st.get('status')}**: {first}")
            if rest:
                L += ["", "```", *rest, "```"]
    L.append("")
    head = ["figure", "better", "Runstream: median (min-max)", "spread"]
    head += [NAMES[p] for p in peers] + ["best peer", "Runstream / best peer", "goal"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    figs = {f.key: f for f in FIGURES}
    for e in report["figures"]:
        fig = figs[e["key"]]
        ours = e["runstream"]
        spread = "—" if fig.count else spread_text(ours)
        best = e["best_peer"]
        if best:
            who = NAMES[best["system"]] + (
                "" if best["variant"] == "main" else f" {best['variant']}"
            )
            who += "".join(f", {NAMES[t]}" for t in best.get("tied_with", []))
        else:
            who = "—"
        if e["ratio"] is not None:
            ratio = f"{e['ratio']:.2f}x"
        elif fig.count and ours and best:
            ratio = f"{fmt(ours['total'], 0)} vs {fmt(best['total'], 0)}"
        else:
            ratio = "—"
        row = [fig.label, fig.better, cell(ours, fig), spread]
        row += [peer_cell(dig(e, "systems", p), fig) for p in peers]
        row += [who, ratio, goal_text(e, fig)]
        L.append("| " + " | ".join(row) + " |")
    L.append("")
    L.append(
        "Ratio: Runstream's median over the rounds / the best peer's median over the rounds "
        "(the best of every variant of every peer); for a figure where lower is better, below "
        "1 means Runstream is better, for one where higher is better, above 1; goal: issue "
        "23's goal for that ratio. Spread: (max - min) / median of a system's per-round "
        "figures, for every system (goal: at most 15 %; ⚠ marks one over it; the median is "
        "of the rounds, so `--rounds 5` gives the median of five). Each round's figure is the "
        "median of that leg's repetitions. W4 counts are totals over the rounds. RSS: "
        "Runstream's engine is `runstream worker` with its supervisor and engine child, its "
        "database the Kafka broker; Restate's engine is restate-server (it holds its own log "
        "and state, no separate database) plus the Python service running the steps (peaks "
        "of each, added); DBOS's engine is the Python process (DBOS, the steps and the 64 "
        "client threads), its database PostgreSQL (PSS summed over its processes); "
        "Temporal's is the dev server (SQLite inside it) plus the worker (sampled peaks, "
        "added). The Kafka floor is Kafka itself, no peer."
    )
    L.append("")
    L.append(
        "CPU per 1,000 runs in W2: user+system CPU seconds from /proc over the W2 window "
        "only, divided by the runs completed in it. Runstream: the harness reads every "
        "`runstream worker` process tree and the broker JVM (psutil cpu_times) from the first "
        "start to the last completion (with `--bootstrap`, a shared broker's CPU includes its "
        "other clients). Restate: its bench.py's Sampler, restate-server + the Python "
        "service over the timed W2 (no separate database). DBOS: its cpuacct.py, the Python "
        "process (DBOS, steps and the 64 client threads, which cannot be told apart) + every "
        "postgres process, from before its 128 untimed warm-up runs to the end (those runs "
        "are counted). Temporal: its bench.py's Ctx, the dev server (SQLite inside) + the "
        "worker over the timed W2. No client's own CPU is counted, except DBOS's in-process "
        "client threads."
    )
    L.append("")
    L.append(
        "W4 recovery cost: restart → all completed minus the sleep still due at the kill "
        "(the latest sleep deadline of a run asleep then, minus the kill time); the rest is "
        "the workload. Runstream: from the journal's TimerScheduled due times. DBOS: from "
        "its step log's times (last 'before' step + 2 s). Restate and Temporal record no "
        "step times: the sleep due is taken as the whole 2 s, its upper bound, which gives "
        "them their lowest possible cost."
    )
    if "temporal" in peers:
        L.append("")
        L.append(
            "Temporal runs as its dev server (`temporal server start-dev`, SQLite), not its "
            "production deployment (PostgreSQL, MySQL or Cassandra and several services); "
            "its figures are that server's, with its default settings (its transfer queue "
            "is polled at most 20 times a second per shard, which sets its W1 with "
            "activities)."
        )
    L.append("")
    L.append("| round | system | started (UTC) | took | load avg before | steal | busy | exit |")
    L.append("|---|---|---|---|---|---|---|---|")
    for leg in legs:
        b = leg.get("before") or {}
        load = " / ".join(f"{x:.2f}" for x in b.get("load_average", []))
        exit_code = "skipped" if "skipped" in leg else leg.get("exit_code")
        L.append(
            f"| {leg['round']} | {NAMES[leg['system']]} | {leg.get('started', '')[11:19]} | "
            f"{leg.get('duration_s', 0) / 60:.1f} min | {load} | {b.get('steal_pct', 'n/a')} % | "
            f"{b.get('busy_pct', 'n/a')} % | {exit_code} |"
        )
    return "\n".join(L) + "\n"


def versions_line(report: dict[str, Any]) -> dict[str, str]:
    def last(s: str) -> dict[str, Any]:
        for leg in reversed(report["legs"]):
            if leg["system"] == s and leg.get("versions"):
                return leg["versions"]
        return {}

    rs, re_, db, te = last("runstream"), last("restate"), last("dbos"), last("temporal")
    commit = (rs.get("runstream_git_commit") or "?")[:7]
    dirty = " + uncommitted src/ changes" if rs.get("runstream_src_changes") else ""
    if rs.get("runstream_root"):
        dirty += f" (checkout {rs['runstream_root']})"
    pg = " ".join((db.get("postgres_server") or "PostgreSQL ?").split()[:2])
    return {
        "runstream": f"Runstream {commit}{dirty}, Kafka {rs.get('kafka_broker', '?')}",
        "restate": f"{re_.get('restate-server', 'restate-server ?')} "
        f"(restate-sdk {re_.get('restate-sdk', '?')})",
        "dbos": f"DBOS {db.get('dbos', '?')} on {pg}",
        "temporal": f"Temporal dev server ({te.get('temporal_cli') or 'temporal CLI ?'}; SQLite) "
        f"+ temporalio {te.get('temporalio', '?')}",
    }


def sizes_line(args: argparse.Namespace) -> dict[str, str]:
    pre = f"cd {args.runstream_root} && PYTHONPATH=src " if args.runstream_root else ""
    restate_extra = "".join(f" {a}" for a in shlex.split(args.restate_args))
    extra = f" --runs {args.runs}" if args.runs is not None else ""
    if args.warmup_seconds is not None:
        extra += f" --warmup-seconds {args.warmup_seconds:g}"
    return {
        "runstream": f"Runstream `{pre}python -m benchmarks {' '.join(RUNSTREAM_WORKLOADS)} "
        f"--repeat {args.repeat}{extra}`",
        "restate": f"Restate `RUNS=1 bash run.sh --reps {args.repeat} --max-attempts "
        f"{args.repeat}{restate_extra}`",
        "dbos": "DBOS `ROUNDS=1 bash run.sh` (one repetition of each workload)",
        "temporal": "Temporal `ROUNDS=1 bash run.sh` (one repetition of each workload; W1 and "
        "W2 with activities and with local activities)",
    }


def finish(report: dict[str, Any], args: argparse.Namespace) -> str:
    systems = report["settings"]["systems"]
    report["figures"] = aggregate(report["legs"], systems)
    report["versions_line"] = versions_line(report)
    report["sizes_line"] = report.get("sizes_line") or sizes_line(args)
    md = markdown(report)
    report["markdown"] = md
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compare.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (RESULTS / "compare.md").write_text(md)
    return md


# ----------------------------------------------------------------- main


def preflight(name: str, args: argparse.Namespace) -> str | None:
    """Why the peer cannot run here, or None."""
    src = args.peers / name
    if not (src / "run.sh").is_file():
        return f"no {src / 'run.sh'}"
    if name == "restate" and shutil.which("ss") is None:
        return "its run.sh needs `ss` (iproute2), which is not on PATH"
    if name == "dbos":
        if os.geteuid() != 0:
            return "its run.sh must run as root (apt-get, `su postgres`, pg_ctlcluster)"
        if shutil.which("su") is None:
            return "its run.sh needs `su`"
    if args.skip_install:
        return _install_missing(name, args.work / f"peer-{name}")
    if name == "restate" and shutil.which("npm") is None:
        return "its install needs npm (`npm install --ignore-scripts`), which is not on PATH"
    built = (args.work / "peer-temporal" / "bin" / "temporal").exists()
    if name == "temporal" and not built and shutil.which("go") is None:
        return "its run.sh builds the temporal CLI with `go install`, and go is not on PATH"
    return None


def wait_ports(name: str, args: argparse.Namespace, reaper: Reaper) -> str | None:
    """End our own leftovers on the peer's ports; wait for others; None when free."""
    deadline = time.monotonic() + args.port_wait
    while True:
        held = port_holders(PORTS[name])
        if not held:
            return None
        mine = {p.pid for p in descendants()}
        if any(pid in mine for pids in held.values() for pid in pids):
            end_descendants(reaper)
            continue
        if time.monotonic() > deadline:
            who = []
            for port, pids in held.items():
                for pid in pids:
                    try:
                        who.append(f"port {port}: {describe(psutil.Process(pid))}")
                    except psutil.Error:
                        who.append(f"port {port}: pid {pid or '?'}")
            return "ports held by processes compare did not start: " + "; ".join(who)
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.peers, args.work = args.peers.resolve(), args.work.resolve()
    if args.runstream_root is not None:
        args.runstream_root = args.runstream_root.resolve()
        if not (args.runstream_root / "benchmarks" / "__main__.py").is_file():
            print(f"--runstream-root: no benchmarks/__main__.py in {args.runstream_root}")
            return 2
    systems = [s for s in SYSTEMS if s in {x.strip().lower() for x in args.only.split(",")}]
    unknown = {x.strip().lower() for x in args.only.split(",")} - set(SYSTEMS) - {""}
    if unknown or not systems:
        print(f"--only: unknown system(s) {sorted(unknown)}; from {','.join(SYSTEMS)}")
        return 2
    if args.table_only:
        report = read_json(RESULTS / "compare.json")
        if not report:
            print(f"no {RESULTS / 'compare.json'} to rebuild the table from")
            return 1
        for leg in report["legs"]:
            refigure(leg)
        st = report["settings"]
        report["sizes_line"] = sizes_line(
            argparse.Namespace(
                repeat=st["repeat"],
                runs=st.get("runs"),
                warmup_seconds=st.get("warmup_seconds"),
                restate_args=st.get("restate_args", ""),
                runstream_root=st.get("runstream_root"),
            )
        )
        print(finish(report, args), end="")
        return 0

    if not become_subreaper():
        log("could not become a child subreaper: daemons a leg leaves behind may be missed")
    reaper = Reaper()
    reaper.start()
    signal.signal(signal.SIGTERM, _raise_exit)
    if os.path.isdir(ARCHIVE):
        shutil.rmtree(ARCHIVE)
    ARCHIVE.mkdir(parents=True)
    t0 = time.monotonic()
    report: dict[str, Any] = {
        "what": "Runstream beside its peers: python -m benchmarks compare (BENCHMARKS.md, "
        "'Side by side')",
        "command": "python -m benchmarks compare " + " ".join(argv or sys.argv[2:]),
        "started": now_iso(),
        "machine": machine(),
        "settings": {
            "systems": systems,
            "rounds": args.rounds,
            "repeat": args.repeat,
            "runs": args.runs,
            "warmup_seconds": args.warmup_seconds,
            "peers": shown(args.peers),
            "work": {s: str(args.work / f"peer-{s}") for s in systems if s != "runstream"},
            "restate_args": args.restate_args,
            "runstream_args": args.runstream_args,
            "runstream_root": str(args.runstream_root) if args.runstream_root else None,
            "peer_quiet_s": args.peer_quiet_s,
            "skip_install": args.skip_install,
            "steal_window_s": args.steal_window,
        },
        "systems": {s: {"status": "ok"} for s in systems},
        "legend": {
            "leg": "one round of one system's workloads; legs run interleaved, round by round",
            "figures[].systems.<system>.<variant>": "that variant's figure per round (each the "
            "median of the leg's repetitions), their median, min, max, and spread = "
            "(max - min) / median; W4 counts also their total over the rounds",
            "figures[].best_peer": "the best median (W4 counts: total) of every variant of "
            "every peer",
            "figures[].ratio": "Runstream's median over the rounds / best_peer's median",
            "stability_goal": STABILITY_GOAL,
        },
        "legs": [],
        "sizes_line": sizes_line(args),
    }
    for s in systems:
        if s != "runstream" and (why := preflight(s, args)):
            log(f"skipping {NAMES[s]}: {why}")
            report["systems"][s] = {"status": "skipped", "reason": why}
    ctx = Ctx(args, reaper, {})
    failures: dict[str, int] = {}
    try:
        for rnd in range(1, args.rounds + 1):
            for s in systems:
                if report["systems"][s]["status"] != "ok":
                    continue
                leg: dict[str, Any] = {"round": rnd, "system": s}
                report["legs"].append(leg)
                leftovers = end_descendants(reaper)
                if leftovers:
                    leg["ended_before"] = leftovers
                if why := wait_ports(s, args, reaper):
                    log(f"{leg_label(rnd, s)}: skipped: {why}")
                    leg["skipped"] = why
                    continue
                leg["before"] = snapshot(args.steal_window)
                b = leg["before"]
                log(
                    f"{leg_label(rnd, s)}: load {b['load_average']}, steal {b['steal_pct']} %, "
                    f"busy {b['busy_pct']} %"
                )
                dest = ARCHIVE / f"round{rnd}-{s}"
                dest.mkdir(parents=True, exist_ok=True)
                if s == "runstream":
                    leg.update(leg_runstream(ctx, rnd, dest))
                else:
                    leg.update(leg_peer(ctx, s, rnd, dest))
                leg["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
                got = [k for k in leg.get("figures", {}) if k != "RSS_parts"]
                log(f"{leg_label(rnd, s)}: {len(got)} figures read")
                if not got:
                    failures[s] = failures.get(s, 0) + 1
                    leg["error"] = (
                        f"`{leg['command']}` (in {leg['cwd']}) exited {leg['exit_code']} and "
                        f"wrote no figures; last lines of {leg['log']}:\n"
                        + last_line(dest / "leg.log", 15)
                    )
                    log(leg["error"])
                    if s != "runstream" and (rnd == 1 or failures[s] >= 2):
                        report["systems"][s] = {"status": "skipped", "reason": leg["error"]}
                        log(f"{NAMES[s]}: no more legs: {leg['error'].splitlines()[0]}")
                else:
                    failures[s] = 0
                finish(report, args)  # partial results after every leg
    except (KeyboardInterrupt, SystemExit):
        log("interrupted: ending the leg's processes")
        report["interrupted"] = True
    finally:
        end_descendants(reaper)
        report["finished"] = now_iso()
        report["duration_s"] = round(time.monotonic() - t0, 1)
        md = finish(report, args)
        reaper.stop()
    print(md, end="")
    json_path, md_path = ((RESULTS / n).relative_to(ROOT) for n in ("compare.json", "compare.md"))
    print(f"-> {json_path}, {md_path}")
    return 1 if report.get("interrupted") else 0


def _raise_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)
