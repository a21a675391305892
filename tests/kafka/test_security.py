"""SASL_SSL with ACLs: a private broker (SCRAM-SHA-512 over TLS, StandardAuthorizer) that this
module starts on free loopback ports, never the shared one. The ACLs each role gets are read
from the security guide's table (docs/guides/security.md), so the guide says what works."""

from __future__ import annotations

import re
import shlex
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

import runstream
from runstream import App, Client, Settings, Worker
from runstream.cli import exits
from runstream.cli.main import cli
from runstream.dev import localkafka
from runstream.errors import KafkaNotAuthorized
from runstream.schemas.codec import Codec
from runstream.taskworker import TaskWorker
from runstream.topics.admin import client_config, ensure_topics, partition_count

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs Java 17+"),
]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "security.md"
#: The guide's roles, and the principal this module gives each.
USERS = {
    "engine": "engine",
    "task worker": "worker",
    "producer of commands": "client",
    "lifecycle reader": "reader",
}
RESOURCES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
    "cluster": ResourceType.BROKER,
}
PATTERNS = {"prefixed": ResourcePatternType.PREFIXED, "literal": ResourcePatternType.LITERAL}


def readme_acls(ns: str) -> list[AclBinding]:
    """The guide's ACL table for namespace ``ns``, one binding per role, resource and
    operation, for the principal of each role."""
    table = GUIDE.read_text().split("<!-- acls:")[1].split("<!-- /acls -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]  # no header
    assert rows, "the guide's ACL table is empty"
    out = []
    for row in rows:
        role, resource, pattern, operations = (c.strip() for c in row.strip("|").split("|"))
        kind, name = pattern.split(" ", 1)
        for op in operations.split(","):
            snake = re.sub(r"(?<!^)(?=[A-Z])", "_", op.strip()).upper()  # DescribeConfigs
            out.append(
                AclBinding(
                    RESOURCES[resource],
                    name.strip("`").replace("<ns>", ns),
                    PATTERNS[kind],
                    f"User:{USERS[role]}",
                    "*",
                    AclOperation[snake],
                    AclPermissionType.ALLOW,
                )
            )
    return out


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    users = {u: f"{u}-secret" for u in [*USERS.values(), "stranger"]}
    kafka = localkafka.LocalKafka(
        tmp_path_factory.mktemp("secured"),
        libs=localkafka.ensure_jars(progress=lambda _: None),
        security="sasl_ssl",
        users=users,
        die_with_parent=True,
    )
    kafka.start()
    yield kafka
    kafka.stop()


def settings(kafka: localkafka.LocalKafka, user: str, **kw: Any) -> Settings:
    return Settings(bootstrap_servers=kafka.bootstrap, kafka=kafka.client_config(user), **kw)


def grant(kafka: localkafka.LocalKafka, ns: str) -> None:
    admin = AdminClient(client_config(kafka.bootstrap, kafka.client_config()))
    for future in admin.create_acls(readme_acls(ns)).values():
        future.result(timeout=30)


def build_app(ns: str) -> App:
    app = App(ns)

    @app.step()
    def add(a: int, b: int) -> int:
        return a + b

    @app.step(group="work", timeout="60s")
    def double(n: int) -> int:
        return n * 2

    @app.workflow
    async def sum_then_double(ctx: runstream.Context, pair: list[int]) -> int:
        return await ctx.step(double, await ctx.step(add, *pair))

    return app


class Running:
    """`run()` of an engine or a task worker on a daemon thread."""

    def __init__(self, target: Worker | TaskWorker) -> None:
        self.target = target
        self.thread = threading.Thread(target=target.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.target.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "did not stop within 30 s"


def lifecycle_types(kafka: localkafka.LocalKafka, ns: str, run_id: str) -> list[str]:
    """The lifecycle event types of ``run_id``, read as the lifecycle reader in a group of
    its own, until the run's end."""
    consumer = Consumer(
        {
            **client_config(kafka.bootstrap, kafka.client_config("reader")),
            "group.id": f"{ns}.dashboard",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([f"{ns}.lifecycle"])
    codec, types = Codec.default(), []
    deadline = time.monotonic() + 60
    try:
        while "run.completed" not in types and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            event = codec.decode(msg.value())
            if event.run_id == run_id:
                types.append(event.type)
    finally:
        consumer.close()
    return types


def test_a_workflow_runs_end_to_end_over_sasl_ssl_with_the_readme_acls(secured, ns, tmp_path):
    grant(secured, ns)
    app = build_app(ns)
    engine = Running(
        Worker(
            app,
            settings(
                secured,
                "engine",
                instance_id="e1",
                state_dir=tmp_path,
                partitions=2,
                session_timeout_ms=6000,
                exit_on_hang=False,
            ),
        )
    )
    worker = None
    try:
        admin = client_config(secured.bootstrap, secured.client_config())
        deadline = time.monotonic() + 60  # the engine creates the namespace's topics
        while partition_count(admin, f"{ns}.tasks.work") is None:
            assert time.monotonic() < deadline, "the engine did not create the topics"
            time.sleep(0.2)
        worker = Running(TaskWorker(app, "work", settings=settings(secured, "worker")))
        with Client(ns, settings=settings(secured, "client")) as client:
            run_id = client.start("sum_then_double", [2, 3], run_id="r1")
            assert client.result(run_id, timeout=60) == 10
            assert client.get_run(run_id).status == "completed"
        assert lifecycle_types(secured, ns, run_id)[-1] == "run.completed"
    finally:
        if worker is not None:
            worker.stop()
        engine.stop()


def test_a_principal_without_the_namespace_acls_is_refused_with_a_clear_error(
    secured, ns, tmp_path
):
    admin = secured.client_config()
    ensure_topics(secured.bootstrap, ns, 2, 1, task_groups=["work"], kafka=admin)
    grant(secured, ns)  # the roles' principals get theirs; "stranger" none
    app = build_app(ns)
    stranger = settings(secured, "stranger", connect_timeout=5)

    with pytest.raises(KafkaNotAuthorized, match=rf"stranger.*{ns}\.commands"):
        Client(ns, settings=stranger)
    for target in (
        Worker(app, stranger.model_copy(update={"state_dir": tmp_path, "exit_on_hang": False})),
        TaskWorker(app, "work", settings=stranger),
    ):
        with pytest.raises(KafkaNotAuthorized, match="stranger"):
            target.run()  # ends at once: waiting would never make the ACLs come

    flags = [f"--kafka-config={k}={v}" for k, v in secured.client_config("stranger").items()]
    for command in (["get", "r1", "-n", ns], ["audit", "-n", ns]):  # a client; a topic reader
        result = CliRunner().invoke(cli, [*command, "--bootstrap", secured.bootstrap, *flags])
        assert result.exit_code == exits.NOT_AUTHORIZED, result.output
        assert result.stderr.startswith("KafkaNotAuthorized: ") and "stranger" in result.stderr


def test_kafka_up_sasl_ssl_prints_an_export_line_the_cli_connects_with(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNSTREAM_JAR_CACHE_DIR", str(localkafka.jar_cache_dir()))
    monkeypatch.setenv("RUNSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    try:
        up = runner.invoke(cli, ["kafka", "up", "--security", "sasl_ssl"])
        assert up.exit_code == 0, up.output
        [export] = [ln.strip() for ln in up.output.splitlines() if ln.strip().startswith("export ")]
        env = dict(item.split("=", 1) for item in shlex.split(export)[1:])
        assert env["RUNSTREAM_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        ns = f"t{tmp_path.name[-8:]}"
        made = runner.invoke(cli, ["topics", "create", "-n", ns, "--partitions", "2"], env=env)
        assert made.exit_code == 0, made.output
        assert f"{ns}.commands" in made.output
    finally:
        localkafka.down()
