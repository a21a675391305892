"""Options every command shares, declared once, the settings they build and the App they load."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import click
from click.core import ParameterSource

from runstream.errors import TopicError
from runstream.settings import Settings, kafka_key_env

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


def _namespace_or_positional(fn: F) -> F:
    """The old spelling, ``COMMAND NAMESPACE``, still works, with a warning on stderr."""

    @functools.wraps(fn)
    def command(*args: Any, legacy_namespace: str | None, namespace: str | None, **kw: Any) -> Any:
        if legacy_namespace is not None:
            source = click.get_current_context().get_parameter_source("namespace")
            if source is ParameterSource.COMMANDLINE and namespace != legacy_namespace:
                raise click.UsageError(f"two namespaces: -n {namespace} and {legacy_namespace}")
            click.echo(
                f"warning: the namespace as an argument is deprecated: use -n {legacy_namespace}",
                err=True,
            )
            namespace = legacy_namespace
        if namespace is None:
            raise click.MissingParameter(param_type="option", param_hint="'-n' / '--namespace'")
        return fn(*args, namespace=namespace, **kw)

    return command  # type: ignore[return-value]


def namespace_compat(fn: F) -> F:
    """``-n/--namespace`` for a command that took the namespace as its first argument
    (`audit`, `topics create|describe`): the argument is still read, deprecated."""
    fn = _namespace_or_positional(fn)
    fn = click.option(
        "-n",
        "--namespace",
        envvar="RUNSTREAM_NAMESPACE",
        default=None,
        help="The App's namespace (default: $RUNSTREAM_NAMESPACE).",
    )(fn)
    return click.argument("legacy_namespace", required=False, metavar="[NAMESPACE]")(fn)


#: ``--where``'s help, for every command that selects runs by it.
WHERE = "Which runs: comma-separated status=S, workflow=W, version=V, tag.K=V."

# -- one spelling everywhere: --json, --tag, --wait, times ---------------------------------

json_output = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Machine output: one JSON document on stdout (JSON lines for a stream).",
)


def emit(as_json: bool, doc: Any, text: str | None = None) -> None:
    """The command's answer: ``doc`` as JSON with --json, else ``text`` (if any)."""
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    elif text is not None:
        click.echo(text)


def parse_tags(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``("team=pay", "env=prod")`` -> a dict; a pair without ``=`` or key is a usage error."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--tag")
        out[key.strip()] = value
    return out


def tags(help: str) -> Callable[[F], F]:
    """``--tag KEY=VALUE`` (repeatable), given to the command as ``tags``, a dict."""
    return click.option(
        "--tag",
        "tags",
        multiple=True,
        metavar="KEY=VALUE",
        callback=lambda _c, _p, v: parse_tags(v),
        help=help,
    )


class Duration(click.ParamType[float]):
    """Seconds, or a duration with a unit: 30, 1.5, 30s, 5m, 2h, 1d."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        from runstream.engine.workflow import seconds

        try:
            return float(seconds(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def wait_option(default: float | None, what: str) -> Callable[[F], F]:
    """``--wait DURATION``: how long the command waits for ``what``; a run's own time
    limit is ``--timeout`` (as in `Client.start`), never this."""
    return click.option(
        "--wait",
        "wait",
        type=DURATION,
        default=default,
        show_default=default is not None,
        help=f"How long to wait for {what} (seconds, or 30s, 5m).",
    )


def time_ms(text: str | None, option: str, now_ms: int | None = None) -> int | None:
    """``--since``/``--until``: a duration back from now (30m, 2h, 1d) or an ISO 8601 time,
    UTC unless it names its zone (2025-01-31T12:00Z) -> epoch ms."""
    from runstream.engine.workflow import seconds

    if text is None:
        return None
    try:
        now = time.time() * 1000 if now_ms is None else now_ms
        return int(now - seconds(text) * 1000)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration (30m, 2h, 1d) nor an ISO time (2025-01-31T12:00Z)",
            param_hint=option,
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def iso(ms: int | None, precise: bool = False) -> str | None:
    """Epoch ms as the CLI prints every time: UTC, ISO 8601, with Z (``precise``: with
    milliseconds)."""
    if ms is None:
        return None
    when = datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)
    return when.isoformat(timespec="milliseconds" if precise else "seconds") + "Z"


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
    "heartbeat_interval_ms",
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


def _log_format(_ctx: click.Context, _param: click.Parameter, value: str | bool) -> None:
    if value in ("json", True):  # the group set logging up before this option's callback runs
        from runstream.jsonlog import use_json_logs

        use_json_logs()


def log_format(fn: F) -> F:
    """``--log-format text|json`` and ``--json`` (the same as ``--log-format json``): the
    ``--json`` of a long-running command is its log, as JSON lines."""
    fn = click.option(
        "--json",
        is_flag=True,
        expose_value=False,
        callback=_log_format,
        help="Log JSON lines (the same as --log-format json).",
    )(fn)
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        envvar="RUNSTREAM_LOG_FORMAT",
        expose_value=False,
        callback=_log_format,
        help="json: one JSON object per log line, with run_id where it applies "
        "(default: $RUNSTREAM_LOG_FORMAT).",
    )(fn)


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
    from runstream.topics.admin import client_config, wait_for_cluster
    from runstream.topics.kafka import read_to_end

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
    if supervise:  # before any engine import: the supervisor process needs none of it
        _become_supervisor(settings)  # returns in the first engine process only
    from runstream.app import App
    from runstream.errors import KafkaFatal
    from runstream.supervisor import EXIT_CANNOT_LOAD
    from runstream.topics.watchdog import EXIT_FATAL

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


def _become_supervisor(settings: Settings) -> None:
    """Fork the first engine process, past this start-up and these options, then become
    its supervisor (`runstream.supervisor`, the same process: still its parent), which
    starts any later one with ``--no-supervise``. Returns in the engine process."""
    from runstream.supervisor import die_with_parent

    later = [sys.executable, "-m", "runstream", *sys.argv[1:], "--no-supervise"]
    grace = str(settings.stop_timeout + 5)
    parent = os.getpid()
    first = os.fork()
    if first:
        supervisor = [sys.executable, "-m", "runstream.supervisor", grace]
        os.execv(sys.executable, [*supervisor, "--adopt", str(first), "--", *later])
    os.setpgid(0, 0)  # its own process group, as the supervisor gives each engine
    die_with_parent()
    if os.getppid() != parent:  # the supervisor died before that took hold
        os._exit(1)
