"""The ``runstream ui`` command: the web app of `runstream.ui.server` over the runs read
model and the journal reader of `runs_cmd` (the same model directory as `runstream runs`)."""

from __future__ import annotations

import ipaddress
import json
import socket
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from runstream.cli import options
from runstream.cli.dlq_cmd import letter_dict, read_letters
from runstream.cli.options import namespace
from runstream.cli.runs_cmd import cache, model_path
from runstream.engine.reducer import apply
from runstream.engine.state import LimitState
from runstream.errors import DecodeError
from runstream.operations import journal as read_journal
from runstream.schemas.codec import Codec
from runstream.schemas.records import FACTS, LIMIT_PREFIX
from runstream.settings import Settings
from runstream.topics.spec import Topics

if TYPE_CHECKING:
    from runstream.ui.server import Dashboard


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None)
            )
        except (OSError, ValueError):
            return False


@click.command("ui")
@namespace
@options.bootstrap
@click.option("--port", type=click.IntRange(0, 65535), default=8233, show_default=True)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Beyond loopback, actions need --token.",
)
@click.option(
    "--token",
    envvar="RUNSTREAM_UI_TOKEN",
    default=None,
    help="Secret that actions (cancel, retry, signal, bulk cancel) must carry, as "
    "the X-Runstream-Token header or the page's token field "
    "(default: $RUNSTREAM_UI_TOKEN). Bound beyond 127.0.0.1 without it, the "
    "dashboard only reads.",
)
@cache
@options.json_output
def ui(
    namespace: str,
    bootstrap: str | None,
    port: int,
    host: str,
    token: str | None,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Serve a web dashboard of NAMESPACE's runs: the list with filters, each run's
    history, timeline and waits, and actions (needs the `ui` extra). With --json, the
    line saying where it listens is a JSON document on stdout."""
    try:
        import uvicorn

        from runstream.ui.server import LOOPBACK_HOSTS, create_app
    except ImportError as exc:
        raise click.ClickException(
            f"runstream ui needs the ui extra: pip install 'runstream[ui]' ({exc})"
        ) from None
    loopback = is_loopback(host)
    dash = dashboard(namespace, bootstrap, cache_dir, token=token, loopback=loopback)
    try:
        click.echo(f"catching up with {namespace}.lifecycle ...", err=True)
        dash.start()
        if not loopback and token is None:
            click.echo("warning: bound beyond loopback without --token: actions are off", err=True)
        url = f"http://{host}:{port}/runs"
        if as_json:
            doc = {"namespace": namespace, "url": url, "actions": loopback or token is not None}
            click.echo(json.dumps(doc), nl=True)
        else:
            click.echo(f"Runstream dashboard of {namespace}: {url}", err=True)
        hosts = [*LOOPBACK_HOSTS, host] if loopback else None
        uvicorn.run(
            create_app(dash, hosts),
            host=host,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=2,
        )
    finally:
        dash.close()


def dashboard(
    namespace: str,
    bootstrap: str | None = None,
    cache_dir: Path | None = None,
    *,
    token: str | None = None,
    loopback: bool = True,
) -> Dashboard:
    """A dashboard of ``namespace`` (not started) on the runs model `runstream runs` keeps."""
    from runstream.ui.server import Dashboard

    settings = Settings().with_bootstrap(bootstrap)
    path = model_path(cache_dir, settings.bootstrap(), namespace)
    journal = partial(read_journal, ns=namespace, settings=settings, base=cache_dir)

    def letters() -> list[dict[str, Any]]:
        codec = Codec.default()
        return [letter_dict(e, codec) for e in read_letters(settings, namespace)]

    return Dashboard(
        namespace,
        settings,
        path,
        journal,
        cache_dir,
        letters,
        partial(limits, settings, namespace),
        token=token,
        loopback=loopback,
    )


def limits(settings: Settings, namespace: str) -> list[dict[str, Any]]:
    """Each limit of ``namespace`` as its journal facts leave it (read from the topic, as
    ``schedules list`` reads schedules): its settings, the permits held, the requests
    waiting in their order."""
    codec, prefix = Codec.default(), LIMIT_PREFIX.encode()
    states: dict[str, LimitState] = {}
    for batch in options.read_topic(settings, Topics(namespace).journal, None):
        for rec in batch:
            if not (rec.key or b"").startswith(prefix):
                continue
            try:
                fact = codec.decode(rec.value)
            except DecodeError:
                continue
            if isinstance(fact, FACTS):
                run_id: str = fact.run_id  # type: ignore[attr-defined]
                apply(states.setdefault(run_id, LimitState(run_id)), fact)  # type: ignore[arg-type]
    out = []
    for state in sorted(states.values(), key=lambda s: s.run_id):
        lim = state.limit
        out.append(
            {
                "limit": state.run_id[len(LIMIT_PREFIX) :],
                "concurrency": None if lim is None else lim.concurrency,
                "rate": None if lim is None else lim.rate,
                "max_queued": None if lim is None else lim.max_queued,
                "held": [{"holder": h, "seq": seq} for h, seq in state.held],
                "waiting": [{"holder": q.holder, "seq": q.seq} for q in state.queue],
            }
        )
    return out
