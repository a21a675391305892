"""A real local Apache Kafka (KRaft) from Maven Central jars: no Docker, no tarball.

Used by `runstream kafka up|down|status`, the pytest fixtures and CI.

Where things live:

    <jars>/m2/                         Maven's local repository
    <jars>/kafka-4.1.1/libs/           the broker classpath, plus the marker `.complete`
    <cache>/local/state.json           the broker(s) `up` started: pids, bootstrap, dirs
    <cache>/local/kafka/node<i>/       their config, data and broker.log (wiped by `down`)

<cache> is `runstream.settings.cache_dir()` (RUNSTREAM_CACHE_DIR). <jars> is the same dir unless
RUNSTREAM_JAR_CACHE_DIR is set: tests point RUNSTREAM_CACHE_DIR at a temp dir for the state
but keep the jars, so they never download them twice.

Both the single node and the 3-node cluster use a static KRaft quorum
(`controller.quorum.voters`); every node is broker and controller at once.

With ``security="sasl_ssl"`` the client listener speaks SASL_SSL (SCRAM-SHA-512 over TLS,
the certificate signed by a throwaway CA made with `keytool` at start, in <work>/tls/) and
ACLs are on (StandardAuthorizer). The SCRAM users are written at format time; `admin` is a
super user. The brokers and controllers talk PLAINTEXT on loopback-only listeners, as
User:ANONYMOUS, which is a super user too: fine for a development broker, not for a
shared host.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from runstream.errors import ConfigError, KafkaSetupError
from runstream.settings import broker_alive, cache_dir, local_bootstrap, local_broker_file
from runstream.supervisor import die_with_parent
from runstream.topics.admin import client_config, transient

KAFKA_VERSION = "4.1.1"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
MARKER = ".complete"
SECURITY = ("plaintext", "sasl_ssl")
ADMIN = "admin"
SCRAM = "SCRAM-SHA-512"

JVM_OPTS = [
    "-Xms512m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
]

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.req.name = kafka.request.logger
logger.req.level = WARN
"""

Progress = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


# ---------------------------------------------------------------- jars


def jar_cache_dir() -> Path:
    """Root of the Maven repo and the copied libs (RUNSTREAM_JAR_CACHE_DIR, else cache_dir())."""
    env = os.environ.get("RUNSTREAM_JAR_CACHE_DIR")
    return Path(env) if env else cache_dir()


def libs_dir() -> Path:
    return jar_cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        hint = "Java 17+" if tool == "java" else "Maven 3.6.3+"
        raise ConfigError(f"`{tool}` not found on PATH: the local Kafka needs {hint}")
    return path


def _libs_complete(libs: Path) -> bool:
    marker = libs / MARKER
    if not marker.is_file():
        return False
    names = marker.read_text().split()
    return bool(names) and all((libs / n).is_file() for n in names)


def ensure_jars(progress: Progress = print) -> Path:
    """Return the broker's libs dir, resolving it with Maven only when it is not complete."""
    libs = libs_dir()
    if _libs_complete(libs):
        progress(f"jars: cached in {libs}")
        return libs
    mvn = _require("mvn")
    _require("java")
    libs.parent.mkdir(parents=True, exist_ok=True)
    # One resolver at a time: parallel sessions share the cache.
    with open(libs.parent / "resolve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _libs_complete(libs):  # another process may have finished meanwhile
            progress(f"resolving Kafka {KAFKA_VERSION} jars with Maven (first time only)...")
            _resolve(mvn, libs)
    return libs


def _resolve(mvn: str, libs: Path) -> None:
    if libs.exists():
        shutil.rmtree(libs)  # a half-copied dir from an interrupted run
    with resources.as_file(resources.files("runstream.dev") / "kafka_pom.xml") as pom:
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            f"-Dmaven.repo.local={jar_cache_dir() / 'm2'}",
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={libs}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise KafkaSetupError(
            f"Maven could not resolve the Kafka jars (exit {done.returncode}):\n"
            + _tail(done.stdout + done.stderr)
        )
    jars = sorted(p.name for p in libs.glob("*.jar"))
    if f"kafka_2.13-{KAFKA_VERSION}.jar" not in jars:
        raise KafkaSetupError(f"Maven finished but {libs} has no kafka_2.13 jar")
    # Written last: its presence means the copy finished.
    (libs / MARKER).write_text("\n".join(jars) + "\n")


# ---------------------------------------------------------------- one broker process


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _log_tail(path: Path, lines: int = 30) -> str:
    """The first ERROR lines (the cause; shutdown noise follows it) and the last lines."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    errors = [ln for ln in text.splitlines() if " ERROR " in ln or " FATAL " in ln][:5]
    head = "first errors:\n" + "\n".join(errors) + "\n...\n" if errors else ""
    return head + _tail(text, lines)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now."""
    return _free_ports(1)[0]


def _free_ports(count: int) -> list[int]:
    # Hold all sockets until every port is picked, so no port is handed out twice.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _check_port_free(port: int) -> None:
    with socket.socket() as s:
        # like the JVM's listener: only a live listener, not TIME_WAIT, makes it taken
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise ConfigError(f"port {port} on 127.0.0.1 is already in use") from e


def _cluster_id() -> str:
    # Kafka's Uuid text form: URL-safe base64, no padding; a leading '-' breaks CLI parsing.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _die_with_parent() -> None:
    # preexec_fn: SIGTERM the JVM when the process that started it dies, so a crashed
    # pytest leaves no broker behind.
    die_with_parent(signal.SIGTERM)


# Every Popen we made, by pid: keeps them referenced (no ResourceWarning) and lets
# _alive() reap our own exited children instead of seeing zombies as alive.
_children: dict[int, subprocess.Popen[bytes]] = {}


def _alive(pid: int) -> bool:
    proc = _children.get(pid)
    if proc is not None:  # our own child: reap it rather than see a zombie as alive
        return proc.poll() is None
    return broker_alive(pid)


def _signal_group(pid: int, sig: int) -> None:
    # start_new_session=True made each JVM the leader of its own process group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _terminate(pids: list[int], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM (graceful shutdown hook), wait up to `timeout`, then SIGKILL."""
    for pid in pids:
        if _alive(pid):
            _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        _children.pop(pid, None)


class LocalKafka:
    """One (nodes=1) or three (nodes=3) combined broker+controller JVMs on 127.0.0.1.

    `port` fixes node 0's client port (others are free ports). `overrides` adds or replaces
    server.properties keys on every node; `jvm_opts` go to the brokers' JVMs after the
    defaults (a later ``-Xmx`` or GC flag wins), e.g. a JMX port or a GC log to measure
    with. Nodes are indexed 0..nodes-1 (node.id = index + 1).
    `security="sasl_ssl"`: see the module docstring; `users` (name -> password) are SCRAM
    users besides `admin`, whose password is made up; `client_config(user)` is what a
    client needs.
    """

    def __init__(
        self,
        work_dir: Path,
        nodes: int = 1,
        libs: Path | None = None,
        port: int | None = None,
        overrides: dict[str, str] | None = None,
        die_with_parent: bool = False,
        progress: Progress = _quiet,
        security: str = "plaintext",
        users: dict[str, str] | None = None,
        jvm_opts: list[str] | None = None,
    ) -> None:
        if nodes not in (1, 3):
            raise ConfigError(f"nodes must be 1 or 3, not {nodes}")
        if security not in SECURITY:
            raise ConfigError(f"security must be one of {', '.join(SECURITY)}, not {security}")
        self.work_dir = Path(work_dir)
        self.nodes = nodes
        self.libs = Path(libs) if libs else libs_dir()
        self.port = port
        self.overrides = overrides or {}
        self.jvm_opts = jvm_opts or []
        self.die_with_parent = die_with_parent
        self.progress = progress
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self.client_ports: list[int] = []
        self.controller_ports: list[int] = []
        self.internal_ports: list[int] = []  # sasl_ssl only: the brokers' own listener
        self.security = security
        self.users = {ADMIN: secrets.token_urlsafe(12), **(users or {})} if self.secured else {}
        self.bootstrap = ""
        self.startup_seconds = 0.0
        self._java_path = "java"
        self._store_password = ""

    # -- paths and config

    def node_dir(self, i: int) -> Path:
        return self.work_dir / f"node{i}"

    def log_path(self, i: int) -> Path:
        return self.node_dir(i) / "broker.log"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    @property
    def secured(self) -> bool:
        return self.security == "sasl_ssl"

    @property
    def tls_dir(self) -> Path:
        return self.work_dir / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA's certificate (PEM): librdkafka's ``ssl.ca.location``."""
        return self.tls_dir / "ca.pem"

    def client_config(self, user: str = ADMIN) -> dict[str, str]:
        """The librdkafka settings a client of ``user`` needs beside the bootstrap
        (none for a plaintext broker)."""
        if not self.secured:
            return {}
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": SCRAM,
            "sasl.username": user,
            "sasl.password": self.users[user],
            "ssl.ca.location": str(self.ca_file),
        }

    def _properties(self, i: int) -> dict[str, str]:
        three = self.nodes == 3
        rf, isr = ("3", "2") if three else ("1", "1")
        voters = ",".join(f"{n + 1}@127.0.0.1:{p}" for n, p in enumerate(self.controller_ports))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(i + 1),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.client_ports[i]},"
            f"CONTROLLER://127.0.0.1:{self.controller_ports[i]}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.client_ports[i]}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.node_dir(i) / "data"),
            "num.partitions": "1",
            # the engine creates its co-partitioned topics itself
            "auto.create.topics.enable": "false",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            # internal topics: RF 3 would never become ready on one broker; 50 partitions are slow
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            # default 3000 ms delay before the first classic-group rebalance
            "group.initial.rebalance.delay.ms": "0",
            # default 6000: tests, benchmarks and the demo may detect a dead instance sooner
            "group.min.session.timeout.ms": "1000",
            # default 10 s; faster failover tests
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            # fence a SIGKILLed node after 4 s, not 9 s; a restarted node cannot register
            # again before its old session is fenced
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "1000",
            "num.network.threads": "2",
            "num.io.threads": "2",
            # default 128 MiB, allocated on the heap
            "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
        }
        if self.secured:
            props.update(self._secured_properties(i))
        props.update(self.overrides)
        return props

    def _secured_properties(self, i: int) -> dict[str, str]:
        client, internal = self.client_ports[i], self.internal_ports[i]
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{client},INTERNAL://127.0.0.1:{internal},"
            f"CONTROLLER://127.0.0.1:{self.controller_ports[i]}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{client},"
            f"INTERNAL://127.0.0.1:{internal}",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,"
            "SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": SCRAM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.tls_dir / "broker.p12"),
            "ssl.keystore.password": self._store_password,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # the brokers and controllers reach each other as ANONYMOUS (PLAINTEXT, loopback)
            "super.users": f"User:ANONYMOUS;User:{ADMIN}",
        }

    def _make_tls(self) -> None:
        """A throwaway CA, and the brokers' PKCS12 keystore with a certificate it signed
        for 127.0.0.1 and localhost (every node shares it: they all listen on loopback)."""
        tls = self.tls_dir
        tls.mkdir(parents=True, exist_ok=True)
        ca, broker, pw = tls / "ca.p12", tls / "broker.p12", self._store_password
        san = "SAN=ip:127.0.0.1,dns:localhost"
        keytool = str(Path(self._java_path).with_name("keytool"))

        def run(*args: str, store: Path) -> None:
            cmd = [keytool, "-J-XX:TieredStopAtLevel=1", *args]  # a short JVM: no C2
            cmd += ["-keystore", str(store), "-storepass", pw, "-noprompt"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise KafkaSetupError(
                    f"keytool {args[0]} failed:\n{_tail(done.stdout + done.stderr)}"
                )

        pair = ["-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30"]
        run(*pair, "-alias", "ca", "-dname", "CN=runstream local CA", "-ext", "bc:c", store=ca)
        run("-exportcert", "-rfc", "-alias", "ca", "-file", str(self.ca_file), store=ca)
        run(*pair, "-alias", "broker", "-dname", "CN=localhost", "-ext", san, store=broker)
        csr, cert = tls / "broker.csr", tls / "broker.pem"
        run("-certreq", "-alias", "broker", "-file", str(csr), store=broker)
        sign = ["-gencert", "-alias", "ca", "-rfc", "-ext", san, "-validity", "30"]
        run(*sign, "-infile", str(csr), "-outfile", str(cert), store=ca)
        run("-importcert", "-alias", "ca", "-file", str(self.ca_file), store=broker)
        run("-importcert", "-alias", "broker", "-file", str(cert), store=broker)

    def _write_config(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "log4j2.properties").write_text(LOG4J2)
        for i in range(self.nodes):
            self.node_dir(i).mkdir(parents=True, exist_ok=True)
            # one key per line: .properties files have no trailing comments
            text = "".join(f"{k}={v}\n" for k, v in self._properties(i).items())
            (self.node_dir(i) / "server.properties").write_text(text)

    def _java(self, i: int, main: list[str], extra: list[str] | None = None) -> list[str]:
        return [
            self._java_path,
            *JVM_OPTS,
            *(extra or []),
            f"-Dkafka.logs.dir={self.node_dir(i)}",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            str(self.libs / "*"),
            *main,
        ]

    # -- lifecycle

    def start(self) -> str:
        """Format, start and warm up the node(s); return the bootstrap servers string."""
        self._java_path = _require("java")
        if not _libs_complete(self.libs):
            raise ConfigError(f"Kafka jars missing in {self.libs}; call ensure_jars() first")
        began = time.monotonic()
        if self.port is not None:
            _check_port_free(self.port)
        ports = _free_ports((3 if self.secured else 2) * self.nodes)
        self.client_ports = ports[: self.nodes]
        self.controller_ports = ports[self.nodes : 2 * self.nodes]
        self.internal_ports = ports[2 * self.nodes :]
        if self.port is not None:
            if self.port in ports:  # cannot happen while bound, but stay safe
                raise ConfigError(f"port {self.port} clashes with a picked port")
            self.client_ports[0] = self.port
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.client_ports)
        if self.secured:
            self._store_password = secrets.token_urlsafe(12)
            self.progress("making a throwaway CA and the brokers' certificate...")
            self._make_tls()
        self._write_config()
        self.progress("formatting storage...")
        self._format()
        self.progress(f"starting {self.nodes} broker(s) at {self.bootstrap}...")
        try:
            for i in range(self.nodes):
                self._spawn(i)
            self._wait_ready(time.monotonic() + START_TIMEOUT)
            self.progress("warming up transactions and the group coordinator...")
            _warm_up(self.bootstrap, self.client_config())
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self.bootstrap

    def _format(self) -> None:
        cid = _cluster_id()
        scram = [
            a
            for name, password in self.users.items()
            for a in ("--add-scram", f"{SCRAM}=[name={name},password={password}]")
        ]
        # All nodes in parallel: each run is a JVM start that is mostly class loading.
        runs = [
            subprocess.Popen(
                self._java(
                    i,
                    [
                        "kafka.tools.StorageTool",
                        "format",
                        "--cluster-id",
                        cid,
                        "--config",
                        str(self.node_dir(i) / "server.properties"),
                        *scram,
                    ],
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for i in range(self.nodes)
        ]
        for i, run in enumerate(runs):
            out, _ = run.communicate(timeout=120)
            if run.returncode != 0:
                raise KafkaSetupError(
                    f"formatting node {i} failed (exit {run.returncode}):\n"
                    + _tail(out.decode(errors="replace"))
                )

    def _spawn(self, i: int) -> None:
        main = ["kafka.Kafka", str(self.node_dir(i) / "server.properties")]
        cmd = self._java(i, main, self.jvm_opts)  # the broker's only (not the format tool's)
        with open(self.log_path(i), "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.node_dir(i),
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        _children[proc.pid] = proc
        self.procs[i] = proc

    def _check_running(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is not None:
                raise KafkaSetupError(
                    f"Kafka node {i} exited with code {proc.returncode} during start-up; "
                    f"from {self.log_path(i)}:\n{_log_tail(self.log_path(i))}"
                )

    def _wait_ready(self, deadline: float, node: int | None = None) -> None:
        """Until a metadata request answers (through `node` only, if given) and lists all
        nodes as brokers."""
        from confluent_kafka.admin import AdminClient

        ports = self.client_ports if node is None else [self.client_ports[node]]
        # Wait for the TCP listener first: spares librdkafka's connection-refused log lines.
        while not _port_open(ports) and time.monotonic() < deadline:
            self._check_running()
            time.sleep(0.2)
        bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)
        admin = AdminClient(client_config(bootstrap, self.client_config()))
        while time.monotonic() < deadline:
            self._check_running()
            try:
                if len(admin.list_topics(timeout=1).brokers) >= self.nodes:
                    return
            except Exception:  # not ready yet: KafkaException or timeout
                pass
            time.sleep(0.2)
        raise KafkaSetupError(
            f"Kafka at {self.bootstrap} not ready after {START_TIMEOUT:.0f} s; "
            f"from {self.log_path(0)}:\n{_log_tail(self.log_path(0))}"
        )

    def stop(self) -> None:
        """SIGTERM every node's process group, wait up to 20 s, then SIGKILL. Idempotent."""
        _terminate(self.pids)
        for proc in self.procs:
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1)

    def kill_node(self, i: int) -> None:
        """SIGKILL node i (a crash: no controlled shutdown)."""
        proc = self.procs[i]
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        _children.pop(proc.pid, None)

    def pause_node(self, i: int) -> None:
        """SIGSTOP node i: a broker that stops answering without closing its connections
        (a long GC pause, a frozen VM); `resume_node` wakes it."""
        proc = self.procs[i]
        if proc is not None:
            _signal_group(proc.pid, signal.SIGSTOP)

    def resume_node(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None:
            _signal_group(proc.pid, signal.SIGCONT)

    def restart_node(self, i: int) -> None:
        """Start node i again with the same config and data dir (no reformat); wait until the
        cluster lists all nodes again."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            raise ConfigError(f"node {i} is still running")
        self._spawn(i)
        try:
            # Ask the restarted node itself: the others may still list its old registration.
            self._wait_ready(time.monotonic() + START_TIMEOUT, node=i)
        except BaseException:
            self.kill_node(i)
            raise


def _port_open(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return False
    return True


def _warm_up(bootstrap: str, extra: dict[str, str]) -> None:
    """One transaction and one group offset commit: creates __transaction_state and
    __consumer_offsets now, so the first test does not wait for them."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = "_runstream_warmup"
    conf = client_config(bootstrap, extra)
    admin = AdminClient(conf)  # keep referenced: a collected client cancels its futures
    admin.create_topics([NewTopic(topic, 1)])[topic].result(timeout=30)
    # log_level 3: hide the expected "coordinator load in progress: retrying" notices
    producer = Producer(
        {**conf, "transactional.id": f"runstream-warmup-{uuid.uuid4().hex}", "log_level": 3}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"warm-up")
    producer.commit_transaction(30)
    consumer = Consumer({**conf, "group.id": "runstream-warmup", "enable.auto.commit": False})
    try:
        commit_when_loaded(consumer, [TopicPartition(topic, 0, 1)], timeout=60)
    finally:
        consumer.close()


def commit_when_loaded(
    consumer: Any, offsets: list[Any], timeout: float, pause: float = 0.2
) -> None:
    """Commit ``offsets`` synchronously, again while the group coordinator is loading (or
    another `transient` refusal), for up to ``timeout`` seconds; any other refusal, or the
    last one, is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            return
        except KafkaException as exc:
            if not transient(exc.args[0]) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)


# ---------------------------------------------------------------- the `runstream kafka` broker


def local_dir() -> Path:
    return local_broker_file().parent


def state_path() -> Path:
    return local_broker_file()


def _read_state() -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_path().read_text())
    except (OSError, ValueError):
        return None
    return state


def current_bootstrap() -> str | None:
    """The bootstrap of the broker `up` started, if it still runs; else None."""
    return local_bootstrap()


def status() -> dict[str, Any]:
    """{"running": bool, ...}; when a state file exists also its fields and `alive` per pid."""
    state = _read_state()
    if state is None:
        return {"running": False}
    alive = [_alive(pid) for pid in state["pids"]]
    return {**state, "alive": alive, "running": any(alive)}


def up(
    nodes: int = 1,
    port: int | None = None,
    progress: Progress = print,
    security: str = "plaintext",
) -> dict[str, Any]:
    """Start a broker (or 3-node cluster) that outlives this process; record it in state.json.

    Returns the state: bootstrap, pids, nodes, work_dir, log files, started, startup_seconds,
    security and, for sasl_ssl, the CA file, the users and the admin's `kafka_config`.
    """
    running = current_bootstrap()
    if running:
        raise ConfigError(f"a local Kafka already runs at {running}; `runstream kafka down` first")
    libs = ensure_jars(progress)
    work = local_dir() / "kafka"
    if work.exists():
        shutil.rmtree(work)  # leftovers of a broker that died without `down`
    kafka = LocalKafka(
        work, nodes=nodes, libs=libs, port=port, progress=progress, security=security
    )
    kafka.start()
    state = {
        "bootstrap": kafka.bootstrap,
        "pids": kafka.pids,
        "nodes": nodes,
        "work_dir": str(work),
        "logs": [str(kafka.log_path(i)) for i in range(nodes)],
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "startup_seconds": round(kafka.startup_seconds, 2),
        "security": security,
    }
    if kafka.secured:
        state.update(
            ca_file=str(kafka.ca_file), users=kafka.users, kafka_config=kafka.client_config()
        )
    local_dir().mkdir(parents=True, exist_ok=True)
    tmp = state_path().with_suffix(".tmp")
    tmp.touch(mode=0o600)  # it may hold passwords
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(state_path())
    return state


def down() -> list[int]:
    """Stop exactly the pids `up` recorded, wait for them, remove the state and work dir.
    Returns the pids that were still running."""
    state = _read_state()
    if state is None:
        return []
    pids = [pid for pid in state["pids"] if _alive(pid)]
    _terminate(pids)
    left = [pid for pid in pids if _alive(pid)]
    if left:
        raise KafkaSetupError(f"Kafka pids {left} survived SIGKILL")
    state_path().unlink(missing_ok=True)
    shutil.rmtree(state["work_dir"], ignore_errors=True)
    return pids
