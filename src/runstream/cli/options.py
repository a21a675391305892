"""Options every command shares, declared once, the settings they build and the App they load."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import click

from runstream.errors import TopicError
from runstream.settings import Settings, kafka_key_env
from runstream.topics.admin import client_config, wait_for_cluster
from runstream.topics.kafka import read_to_end

F = TypeVar("F", bound=Callable[..., Any])

BOOTSTRAP_HELP = (
    "Kafka bootstrap servers (default: $RUNSTREAM_BOOTSTRAP_SERVERS, "
    "$KAFKA_BOOTSTRAP_SERVERS, the broker `runstream kafka up` started, "
    "127.0.0.1:9092)."
)

KAFKA_CONFIG_HELP = (
    "An extra librdkafka setting (repeatable), e.g. security.protocol=SASL_SSL; the same "
    "as $RUNSTREAM_KAFKA_SECURITY_PROTOCOL (see Settings)."
)


def _kafka_config(ctx: click.Context, _param: click.Parameter, items: tuple[str, ...]) -> None:
    """--kafka-config KEY=VALUE: exported as RUNSTREAM_KAFKA_<KEY> while the command runs, so
    every Settings() of it (clients, readers, engines) sees it; restored when it ends."""
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--kafka-config")
        name = kafka_key_env(key.strip())
        old = os.environ.get(name)
        ctx.call_on_close(lambda n=name, o=old: _restore(n, o))
        os.environ[name] = value.strip()


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def bootstrap(fn: F) -> F:
    """``--bootstrap`` (the ``bootstrap`` argument) and ``--kafka-config KEY=VALUE``."""
    fn = click.option(
        "--kafka-config",
        multiple=True,
        metavar="KEY=VALUE",
        expose_value=False,
        callback=_kafka_config,
        help=KAFKA_CONFIG_HELP,
    )(fn)
    return click.option("--bootstrap", default=None, help=BOOTSTRAP_HELP)(fn)


namespace = click.option(
    "-n",
    "--namespace",
    envvar="RUNSTREAM_NAMESPACE",
    required=True,
    help="The App's namespace (default: $RUNSTREAM_NAMESPACE).",
)

# Settings the `worker` command takes as options (every engine knob), and how to name them.
ENGINE_FIELDS = (
    "instance_id",
    "state_dir",
    "partitions",
    "create_topics",
    "batch_size",
    "step_concurrency",
    "transaction_timeout_ms",
    "session_timeout_ms",
    "standbys",
    "leave_on_stop",
    "stop_timeout",
    "handover_timeout",
    "chain_budget",
    "activation_budget",
    "max_record_bytes",
    "connect_timeout",
    "metrics_port",
    "metrics_host",
    "lifecycle_format",
    "schema_registry_url",
)
_RENAMED = {"instance_id": "instance", "step_concurrency": "concurrency"}


def _log_format(_ctx: click.Context, _param: click.Parameter, value: str) -> None:
    if value == "json":  # the group set logging up before this option's callback runs
        from runstream.jsonlog import use_json_logs

        use_json_logs()


log_format = click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    envvar="RUNSTREAM_LOG_FORMAT",
    expose_value=False,
    callback=_log_format,
    help="json: one JSON object per log line, with run_id where it applies "
    "(default: $RUNSTREAM_LOG_FORMAT).",
)


def engine_options(fn: F) -> F:
    """One ``--option`` per engine setting (unset ones come from the environment);
    ``--kafka-config`` comes with `bootstrap`."""
    for name in reversed(ENGINE_FIELDS):
        fn = _setting_option(name)(fn)
    return fn


def metrics(fn: F) -> F:
    """``--metrics-port`` and ``--metrics-host``, as `engine_options` declares them."""
    return _setting_option("metrics_port")(_setting_option("metrics_host")(fn))


def _setting_option(name: str) -> Callable[[F], F]:
    field = Settings.model_fields[name]
    flag = "--" + _RENAMED.get(name, name).replace("_", "-")
    kind = field.annotation
    if kind is bool:
        off = "--no-" + flag[2:]
        return click.option(f"{flag}/{off}", name, default=None, help=field.description)
    ptype: Any = {int: int, float: float, Path: click.Path(path_type=Path)}.get(kind)  # type: ignore[arg-type]
    if kind == int | None:
        ptype = int
    if get_origin(kind) is Literal:
        ptype = click.Choice(get_args(kind))
    return click.option(flag, name, type=ptype, default=None, help=field.description)


def engine_settings(values: dict[str, Any]) -> Settings:
    """Settings from the environment (--kafka-config included), overridden by the options
    given."""
    given = {k: v for k, v in values.items() if k in ENGINE_FIELDS and v is not None}
    return Settings(**given).with_bootstrap(values.get("bootstrap"))


def read_topic(settings: Settings, topic: str, partitions: list[int] | None) -> Iterator[list[Any]]:
    """Batches of ``topic``'s messages (all partitions, or ``partitions``) up to its end;
    a missing broker or topic is one clear error."""
    config = client_config(settings.bootstrap(), settings.kafka)
    wait_for_cluster(config, settings.connect_timeout)  # no broker: say so at once
    try:
        yield from read_to_end(config, topic, partitions=partitions)
    except LookupError:
        raise TopicError(
            f"{topic} does not exist at {settings.bootstrap()}; check -n (the namespace)"
        ) from None


def load_app(target: str) -> Any:
    """'package.module:app' -> the App object (the current directory is importable)."""
    module_name, _, attr = target.partition(":")
    if not module_name:
        raise click.BadParameter("use MODULE:APP, e.g. shop.workflows:app")
    sys.path.insert(0, str(Path.cwd()))
    module = importlib.import_module(module_name)
    return getattr(module, attr or "app")


def serve(
    who: str, target: str, settings: Settings, supervise: bool, run: Callable[[Any], None]
) -> None:
    """Run a long-lived process for the App at ``target``: supervised (this process
    becomes the supervisor of a child that runs it, started again whenever it dies), or
    ``run(app)`` here. An App that cannot be loaded exits `EXIT_CANNOT_LOAD` (restarting
    would not help); a Kafka client refused for good exits `EXIT_FATAL` (a new process
    starts clean)."""
    from runstream.app import App
    from runstream.errors import KafkaFatal
    from runstream.supervisor import EXIT_CANNOT_LOAD
    from runstream.topics.watchdog import EXIT_FATAL

    if supervise:
        child = [sys.executable, "-m", "runstream", *sys.argv[1:], "--no-supervise"]
        grace = str(settings.stop_timeout + 5)
        os.execv(
            sys.executable, [sys.executable, "-m", "runstream.supervisor", grace, "--", *child]
        )
    try:
        app = load_app(target)
        if not isinstance(app, App):
            raise TypeError(f"{type(app).__name__} {app!r:.60} is not a runstream.App")
    except Exception as exc:  # whatever the module raised: restarting would not help
        why = f"{type(exc).__name__}: {exc}"
        click.echo(f"runstream {who}: cannot load the App at {target!r}: {why}", err=True)
        sys.exit(EXIT_CANNOT_LOAD)
    try:
        run(app)
    except KafkaFatal as exc:
        click.echo(f"runstream {who}: {exc}", err=True)
        sys.exit(EXIT_FATAL)
