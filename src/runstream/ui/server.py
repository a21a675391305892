"""The dashboard's web app: Starlette routes over the runs read model (kept caught up
with ``<ns>.lifecycle`` by one thread) and one run's journal.

Pages are rendered on the server with Jinja2 (autoescaped); ``static/app.js`` adds the
live updates (server-sent events), the pause button and the token field. Every POST
needs the token: a random one embedded in the pages when bound to loopback (so another
site's page cannot post here), or the one given with ``--token`` that the user types.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from runstream.client import Client
from runstream.engine.workflow import seconds
from runstream.errors import DecodeError, RunNotFound, RunstreamError
from runstream.operations import CancelJob, took, where_of
from runstream.projections.runs import CatchUp, Layout, RunQuery, RunRow, RunsModel
from runstream.projections.store import key_range
from runstream.schemas.codec import Codec
from runstream.schemas.records import LifecycleEvent, Record, RunCancelled, RunCompleted, Status
from runstream.settings import Settings
from runstream.topics import lifecycle_wire
from runstream.topics.admin import client_config
from runstream.topics.catchup import PartitionReader
from runstream.topics.spec import Topics
from runstream.ui.bulk import ACTIONS, BulkJob, Plan, Runner, job_file, plan, unfinished
from runstream.ui.history import FAMILIES, Story, family, fields, story, when

log = logging.getLogger("runstream.ui")

PAGE = 50  # runs per page
COUNT_CAP = 1000  # a count that scans (tag, time, id prefix) stops here
FACTS_PAGE = 200  # a run's facts per page of its history
FINAL_KEPT = 8  # the histories of ended runs kept in memory
RECENT = 2000  # lifecycle events kept for the live streams
TOKEN_HEADER = "x-runstream-token"
_HERE = Path(__file__).parent


# -- the read model, caught up by one thread --------------------------------------------


class _Tap:
    """The lifecycle reader, as the model's source, keeping what passes for the live
    streams: (n, event) with n counting up from 1."""

    def __init__(self, reader: PartitionReader) -> None:
        self.reader, self.codec = reader, Codec.default()
        self.recent: deque[tuple[int, dict[str, Any]]] = deque(maxlen=RECENT)
        self.n = 0

    def layout(self) -> Layout | None:
        return self.reader.layout()

    def read(self, start: Mapping[int, int]) -> Iterator[tuple[list[Any], dict[int, int]]]:
        for records, positions in self.reader.read(start):
            yield records, positions  # the model applies them first
            for rec in records:
                try:
                    ev = lifecycle_wire.decode(self.codec, rec.value)
                except DecodeError:
                    continue
                if isinstance(ev, LifecycleEvent):
                    self.n += 1
                    self.recent.append(
                        (self.n, {"run_id": ev.run_id, "type": ev.type, "status": ev.status})
                    )


class Dashboard:
    """One namespace's dashboard state: the model, its catch-up thread, the client."""

    def __init__(
        self,
        namespace: str,
        settings: Settings,
        path: Path,
        journal: Callable[[str], list[Record]],
        cache_dir: Path | None = None,
        letters: Callable[[], list[dict[str, Any]]] | None = None,
        limits: Callable[[], list[dict[str, Any]]] | None = None,
        *,
        token: str | None = None,
        loopback: bool = True,
        interval: float = 0.5,
        bulk_timeout: float = 60.0,
    ) -> None:
        """``path``: the runs model's directory; ``journal``: a run's facts, in order
        (`RunNotFound` if it has none); ``cache_dir``: as given to ``runstream runs``;
        ``letters``: the dead letters, as ``runstream dlq show --json`` gives each;
        ``limits``: the limits, with the permits held and the requests waiting;
        ``bulk_timeout``: how long a bulk action waits for its runs to show it."""
        self.namespace, self.settings, self.path = namespace, settings, path
        self.journal, self.cache_dir = journal, cache_dir
        self.letters, self.limits = letters, limits
        # Loopback without --token: a random token in the pages guards against other sites.
        self.token = token or (secrets.token_urlsafe(24) if loopback else None)
        self.embed_token = token is None and loopback
        self.interval = interval
        config = client_config(self.settings.bootstrap(), self.settings.kafka)
        topic = Topics(namespace).lifecycle
        self.tap = _Tap(PartitionReader(config, topic, self.settings.connect_timeout))
        try:
            self.model = RunsModel(self.path)
        except Exception as exc:  # another process holds it (rocksdict says only "lock")
            if "lock" not in str(exc).lower():
                raise
            log.warning("another process is updating %s: showing it as last written", self.path)
            self.model = RunsModel(self.path, read_only=True)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.error: str | None = None
        self._client: Client | None = None
        self._thread: threading.Thread | None = None
        self.bulk_timeout = bulk_timeout
        self._bulk: dict[str, tuple[BulkJob, threading.Thread]] = {}  # by job id
        self._final: OrderedDict[str, list[Record]] = OrderedDict()  # see facts()

    # life
    def catch_up(self) -> CatchUp | None:
        """Read the lifecycle topic to its end into the model (None: read-only model)."""
        if self.model.read_only:
            return None
        with self.lock:
            try:
                done = self.model.catch_up(self.tap)
            except LookupError:
                raise RunstreamError(
                    f"no topic {Topics(self.namespace).lifecycle} at "
                    f"{self.settings.bootstrap()}: is {self.namespace!r} the namespace?"
                ) from None
        self.error = None
        return done

    def start(self) -> None:
        """Catch up once (errors raise), then keep catching up on a thread."""
        self.catch_up()
        self._thread = threading.Thread(target=self._follow, name="ui-catch-up", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.catch_up()
            except Exception as exc:  # shown on the pages; tried again
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("catching up the runs model: %s", self.error)

    def close(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(30)
        for job, thread in self._bulk.values():  # stopped between chunks: its file resumes it
            thread.join(30)
            if thread.is_alive():
                log.warning("bulk %s %s still under way", job.plan.action, job.id)
        with self.lock:
            self.model.close()
        self.tap.reader.close()
        if self._client is not None:
            self._client.close()

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.namespace, settings=self.settings)
        return self._client

    # reading
    def find(self, f: Filters) -> tuple[list[RunRow], str | None, str]:
        """A page of runs, the next page's position, and how many match (text)."""
        with self.lock:
            if f.prefix:
                return _by_prefix(self.model, f, PAGE)
            page = self.model.find(f.query(), PAGE, f.after)
            q = f.query()
            if q.tags or q.since_ms is not None or q.until_ms is not None:
                upto = self.model.find(q, COUNT_CAP)
                total = f"{len(upto.runs):,}" + ("+" if upto.after else "")
            else:
                total = f"{self.model.count(q):,}"
            return page.runs, page.after, total

    def get(self, run_id: str) -> RunRow | None:
        with self.lock:
            return self.model.get(run_id)

    def versions(self) -> list[Any]:
        with self.lock:
            return self.model.versions()

    def facts(self, run_id: str) -> list[Record]:
        """The run's journal facts; those of a run that completed or was cancelled are kept
        (they never change), so paging through a long history reads it once."""
        with self.lock:
            if (kept := self._final.get(run_id)) is not None:
                self._final.move_to_end(run_id)
                return kept
        facts = self.journal(run_id)
        if facts and isinstance(facts[-1], RunCompleted | RunCancelled):
            with self.lock:
                self._final[run_id] = facts
                while len(self._final) > FINAL_KEPT:
                    self._final.popitem(last=False)
        return facts

    def events_since(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        return [(i, ev) for i, ev in list(self.tap.recent) if i > n]

    def _argv(self, *args: str) -> list[str]:
        """A ``runstream`` command line on this namespace and broker."""
        where = ["-n", self.namespace, "--bootstrap", self.settings.bootstrap()]
        return [sys.executable, "-m", "runstream", *args, *where]

    def cli_json(self, *args: str, stdin: str = "") -> Any:
        """What ``runstream ARGS --json`` prints on this namespace: the CLI's own code for
        what it already does (its one-line error raised as `RunstreamError`)."""
        out = subprocess.run(
            self._argv(*args, "--json"), input=stdin, capture_output=True, text=True, timeout=120
        )
        if out.returncode != 0:
            lines = out.stderr.strip().splitlines()
            raise RunstreamError(lines[-1] if lines else f"runstream {args[0]} failed")
        return json.loads(out.stdout)

    def redrive(self, letter_id: str, document: str | None) -> dict[str, Any]:
        """``runstream dlq redrive`` of one letter, as it was or as ``document`` (JSON)."""
        if document is None:
            done = self.cli_json("dlq", "redrive", letter_id)
        else:
            done = self.cli_json("dlq", "redrive", letter_id, "--from-file", "-", stdin=document)
        return dict(done[0])

    def bulk_plan(self, action: str, where: dict[str, str]) -> tuple[Plan, CancelJob | None]:
        """What ``action`` would do to the runs matching ``where`` now, and the job of an
        earlier one stopped part way that it would go on with instead (None: none)."""
        with self.lock:
            p = plan(self.model, action, where)
        return p, unfinished(job_file(self.cache_dir, self.settings, self.namespace, p))

    def bulk_start(self, p: Plan) -> BulkJob:
        """Start ``p`` on a thread; the same action and filter already under way here is
        that job (a second confirm sends nothing twice)."""
        with self.lock:
            for job, thread in self._bulk.values():
                if thread.is_alive() and (job.plan.action, job.plan.where) == (p.action, p.where):
                    return job
            job = BulkJob(p)
            runner = Runner(
                self.namespace,
                self.settings,
                self.cache_dir,
                self.get,
                self.letters,
                self.stopping,
                self.bulk_timeout,
            )
            thread = threading.Thread(target=runner.run, args=(job,), name=f"ui-bulk-{job.id}")
            self._bulk[job.id] = (job, thread)
            thread.start()
            return job

    def bulk_job(self, job_id: str) -> BulkJob | None:
        found = self._bulk.get(job_id)
        return None if found is None else found[0]


# -- filters kept in the URL ------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    status: str = ""
    workflow: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()  # KEY=VALUE
    since: str = ""
    until: str = ""
    prefix: str = ""
    after: str | None = None

    @classmethod
    def of(cls, params: Mapping[str, str] | FormData, tags: Sequence[str]) -> Filters:
        def get(name: str) -> str:
            value = params.get(name)
            return value.strip() if isinstance(value, str) else ""

        return cls(
            get("status"),
            get("workflow"),
            get("version"),
            tuple(t.strip() for t in tags if t.strip()),
            get("since"),
            get("until"),
            get("prefix"),
            get("after") or None,
        )

    def query(self) -> RunQuery:
        tags = {}
        for pair in self.tags:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise ValueError(f"tag {pair!r} is not KEY=VALUE")
            tags[key] = value
        return RunQuery(
            status=self.status or None,
            workflow=self.workflow or None,
            version=self.version or None,
            tags=tags,
            since_ms=_time(self.since, "since"),
            until_ms=_time(self.until, "until"),
        )

    def params(self, **change: Any) -> str:
        """The query string of these filters (``change`` replaces some)."""
        values = {**self.__dict__, **change}
        pairs = [(k, v) for k, v in values.items() if k != "tags" and v]
        pairs += [("tag", t) for t in values["tags"]]
        return urlencode(pairs)

    def where(self) -> tuple[dict[str, str] | None, str]:
        """The filter as a bulk action's conditions (``where_of``), or None and why not."""
        if self.since or self.until or self.prefix:
            return (
                None,
                "bulk actions go by status, workflow, version and tags: clear the "
                "time and id prefix filters first",
            )
        q = self.query()
        if not (q.status or q.workflow or q.version or q.tags):
            return None, "choose at least one filter: a bulk action never takes every run"
        return where_of(q.status, q.workflow, q.version, q.tags), ""


def _time(value: str, name: str) -> int | None:
    """``1h`` (that long ago) or an ISO date -> epoch ms."""
    if not value:
        return None
    try:
        return int((time.time() - seconds(value)) * 1000)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(value).timestamp() * 1000)
    except ValueError:
        raise ValueError(f"{name}: {value!r} is neither a duration (30m, 1h) nor a date") from None


def _by_prefix(model: RunsModel, f: Filters, limit: int) -> tuple[list[RunRow], str | None, str]:
    """Runs whose id starts with ``f.prefix`` (by id, then the other filters), a page
    from ``f.after`` (an id); rows are keyed ``r<run>``, so this is one range."""
    q, lo = f.query(), b"r" + f.prefix.encode()
    hi = lo + b"\xff" * 8
    start = b"r" + f.after.encode() + b"\x00" if f.after else lo
    rows: list[RunRow] = []
    total, after = 0, None
    for key, raw in key_range(model.db, lo, hi, "items"):
        row = RunRow(**json.loads(raw))
        if not q.matches(row):
            continue
        total += 1
        if key >= start and len(rows) < limit:
            rows.append(row)
        elif key >= start and after is None:
            after = rows[-1].run_id
        if total >= COUNT_CAP:
            return rows, after, f"{total:,}+"
    return rows, after, f"{total:,}"


# -- pages ------------------------------------------------------------------------------


def _pretty(value: Any) -> str:
    """JSON text or a value, indented for a <pre>."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    return json.dumps(value, indent=2, ensure_ascii=False)


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("runstream.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.filters.update(
        when=when,
        took=took,
        pretty=_pretty,
        q=lambda s: quote(str(s), safe=""),
    )
    return env


#: The names a loopback dashboard answers to: another name is a page of some other site
#: whose name was pointed at 127.0.0.1 (DNS rebinding), which must not read the token.
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]


def create_app(dash: Dashboard, hosts: Sequence[str] | None = None) -> Starlette:
    """The dashboard's ASGI app over ``dash`` (started and closed by the caller),
    answering only requests for ``hosts`` when given (`LOOPBACK_HOSTS` and its own)."""
    env = _env()

    def page(name: str, status: int = 200, since: int = 0, **values: Any) -> HTMLResponse:
        """``since``: the live events read before the page's data (its stream goes on
        from there, so no change between the two is missed)."""
        html = env.get_template(name).render(
            ns=dash.namespace,
            dash=dash,
            statuses=[s.value for s in Status],
            since=since,
            **values,
        )
        return HTMLResponse(html, status, headers=_HEADERS)

    def runs(request: Request) -> Response:
        f = Filters.of(request.query_params, request.query_params.getlist("tag"))
        since = dash.tap.n
        try:
            rows, after, total = dash.find(f)
        except ValueError as exc:
            return page("runs.html", 400, f=f, rows=[], after=None, total="0", problem=str(exc))
        name = "runs_table.html" if request.query_params.get("fragment") else "runs.html"
        return page(
            name,
            since=since,
            f=f,
            rows=rows,
            after=after,
            total=total,
            problem=None,
            done=request.query_params.get("done"),
        )

    def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        kinds = [k for k in request.query_params.getlist("kind") if k in FAMILIES or k == "other"]
        since = dash.tap.n
        row = dash.get(run_id)
        try:
            facts = dash.facts(run_id)
        except RunNotFound:
            facts = []
        if row is None and not facts:
            return page("missing.html", 404, run_id=run_id)
        s = story(facts)
        now = int(time.time() * 1000)
        shown = [f for f in facts if not kinds or family(f) in kinds]
        first = _int(request.query_params.get("from"), 0, len(shown) - 1)
        first -= first % FACTS_PAGE

        def facts_url(start: int) -> str:
            return urlencode([*(("kind", k) for k in kinds), ("from", max(start, 0))])

        name = "run_body.html" if request.query_params.get("fragment") else "run.html"
        return page(
            name,
            since=since,
            run_id=run_id,
            row=row,
            story=s,
            facts=[(f, fields(f)) for f in shown[first : first + FACTS_PAGE]],
            shown_count=len(shown),
            first=first,
            page_size=FACTS_PAGE,
            facts_url=facts_url,
            kinds=kinds,
            families=[*FAMILIES, "other"],
            waterfall=_waterfall(s, now),
            done=request.query_params.get("done"),
            total_facts=len(facts),
        )

    async def act(request: Request) -> Response:
        form = await request.form()
        if (refused := _refused(dash, request, form)) is not None:
            return refused
        run_id, action = str(form.get("run_id", "")), str(form.get("action", ""))
        back = f"/runs/{quote(run_id, safe='')}"
        try:
            if action == "cancel":
                dash.client.cancel(
                    run_id, compensate=bool(form.get("compensate")), reason="runstream ui"
                )
                done = "cancel sent"
            elif action == "retry":
                dash.client.retry(run_id, reason="runstream ui")
                done = "retry sent"
            elif action == "signal":
                name = str(form.get("name", "")).strip()
                text = str(form.get("payload", "")).strip()
                if not name:
                    raise ValueError("a signal needs a name")
                dash.client.signal(run_id, name, json.loads(text) if text else None)
                done = f"signal {name!r} sent"
            else:
                return HTMLResponse("unknown action", 400, headers=_HEADERS)
        except (ValueError, RunstreamError) as exc:
            done = f"{action} not sent: {exc}"
        return RedirectResponse(f"{back}?{urlencode({'done': done})}", 303)

    async def bulk(request: Request) -> Response:
        """A bulk action by the list's filter: a dry run (what it would do), or with
        ``confirm=yes`` the job, started, and its page."""
        form = await request.form()
        if (refused := _refused(dash, request, form)) is not None:
            return refused
        f = Filters.of(form, form.getlist("tag"))  # type: ignore[arg-type]
        action = str(form.get("action", "cancel"))
        if action not in ACTIONS:
            return HTMLResponse("unknown action", 400, headers=_HEADERS)
        try:
            where, problem = f.where()
        except ValueError as exc:
            where, problem = None, str(exc)
        if where is None:
            return page("bulk.html", 400, f=f, action=action, plan=None, problem=problem)
        p, earlier = await asyncio.to_thread(dash.bulk_plan, action, where)
        if form.get("confirm") == "yes":
            job = dash.bulk_start(p)
            return RedirectResponse(f"/bulk/{job.id}", 303)
        act = ACTIONS[action]
        return page("bulk.html", f=f, action=action, act=act, plan=p, earlier=earlier, problem=None)

    def bulk_job(request: Request) -> Response:
        job = dash.bulk_job(request.path_params["job_id"])
        if job is None:
            return HTMLResponse(
                "no such bulk job (was the dashboard restarted?)", 404, headers=_HEADERS
            )
        w = job.plan.where
        tags = tuple(f"{k[4:]}={v}" for k, v in w.items() if k.startswith("tag."))
        back = Filters(w.get("status", ""), w.get("workflow", ""), w.get("version", ""), tags)
        return page(
            "bulk_job.html", job=job, act=ACTIONS[job.plan.action], job_params=back.params()
        )

    async def letters(request: Request) -> Response:
        if dash.letters is None:
            return page("dlq.html", letters=None, problem=None)
        try:
            found = await asyncio.to_thread(dash.letters)
        except RunstreamError as exc:
            return page("dlq.html", 500, letters=None, problem=str(exc))
        for letter in found:
            letter["document"] = None if letter.get("value") is None else _pretty(letter["value"])
        return page("dlq.html", letters=found, problem=None, done=request.query_params.get("done"))

    async def redrive(request: Request) -> Response:
        form = await request.form()
        if (refused := _refused(dash, request, form)) is not None:
            return refused
        letter_id = str(form.get("letter", ""))
        document = str(form.get("document", "")).strip()
        edited = document != str(form.get("original", "")).strip()
        try:
            d = await asyncio.to_thread(dash.redrive, letter_id, document if edited else None)
            done = (
                f"redrove dead letter {letter_id} to {d['topic']} (redrive {d['redrive']}"
                f"{', edited' if d['edited'] else ''})"
            )
        except (RunstreamError, subprocess.TimeoutExpired) as exc:
            done = f"dead letter {letter_id} not redriven: {exc}"
        return RedirectResponse(f"/dlq?{urlencode({'done': done})}", 303)

    async def schedules(request: Request) -> Response:
        try:
            rows = await asyncio.to_thread(dash.cli_json, "schedules", "list")
        except (RunstreamError, subprocess.TimeoutExpired) as exc:
            return page("schedules.html", 500, rows=[], problem=str(exc))
        return page("schedules.html", rows=rows, problem=None)

    async def tasks(request: Request) -> Response:
        try:
            rows = await asyncio.to_thread(dash.cli_json, "tasks", "status")
        except (RunstreamError, subprocess.TimeoutExpired) as exc:
            return page("tasks.html", 500, rows=[], problem=str(exc))
        return page("tasks.html", rows=rows, problem=None)

    async def limits(request: Request) -> Response:
        if dash.limits is None:
            return page("limits.html", rows=[], problem="this dashboard reads no limits")
        try:
            rows = await asyncio.to_thread(dash.limits)
        except RunstreamError as exc:
            return page("limits.html", 500, rows=[], problem=str(exc))
        return page("limits.html", rows=rows, problem=None)

    def versions(request: Request) -> Response:
        return page("versions.html", versions=dash.versions())

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            given = request.headers.get("last-event-id") or request.query_params.get("since")
            try:
                last = min(int(given or ""), dash.tap.n)  # a restarted dashboard counts anew
            except ValueError:
                last = dash.tap.n
            quiet = 0.0
            yield "retry: 2000\n\n"
            while not dash.stopping.is_set() and not await request.is_disconnected():
                fresh = dash.events_since(last)
                for n, ev in fresh:
                    yield f"id: {n}\ndata: {json.dumps(ev)}\n\n"
                    last = n
                quiet = 0.0 if fresh else quiet + 0.5
                if quiet >= 15:  # a comment keeps proxies from closing a quiet stream
                    yield ": keep-alive\n\n"
                    quiet = 0.0
                await asyncio.sleep(0.5)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    return Starlette(
        routes=[
            Route("/", lambda r: RedirectResponse("/runs")),
            Route("/runs", runs),
            Route("/runs/{run_id:path}", run),
            Route("/action", act, methods=["POST"]),
            Route("/bulk", bulk, methods=["POST"]),
            Route("/bulk/{job_id}", bulk_job),
            Route("/versions", versions),
            Route("/schedules", schedules),
            Route("/tasks", tasks),
            Route("/limits", limits),
            Route("/dlq", letters),
            Route("/dlq/redrive", redrive, methods=["POST"]),
            Route("/events", events),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))] if hosts else [],
    )


def _int(text: str | None, low: int, high: int) -> int:
    """``text`` as an int between ``low`` and ``high`` (``low`` if it is none)."""
    try:
        return max(low, min(int(text or low), high))
    except ValueError:
        return low


def _waterfall(s: Story, now: int) -> Markup:
    """The timeline's rows: one bar per span, placed on the run's whole time (built here,
    not in the template: a run of 5,000 steps renders ten times faster)."""
    end_of_run = s.ended_ms or now
    t0 = s.first_ms
    total = max(end_of_run, s.last_ms, *(sp.end_ms or 0 for sp in s.spans)) - t0 or 1
    rows = []
    for sp in s.spans:  # every text escaped: f-strings, since Markup.format is slow
        end = sp.end_ms if sp.end_ms is not None else end_of_run
        x, w = (sp.start_ms - t0) * 1000 / total, max((end - sp.start_ms) * 1000 / total, 4)
        label = str(escape(sp.label))
        if sp.link:
            label = f'<a href="/runs/{escape(quote(sp.link, safe=""))}">{label}</a>'
        detail = f' <span class="detail">{escape(sp.detail)}</span>' if sp.detail else ""
        more = "" if sp.end_ms is not None else "…"
        outcome = escape(sp.outcome)
        rows.append(
            f'<tr class="span span-{escape(sp.kind)} out-{outcome}"><td class="label">{label}'
            '</td><td class="bar"><svg viewBox="0 0 1000 10" preserveAspectRatio="none">'
            f'<rect x="{x:.1f}" height="10" width="{w:.1f}"></rect></svg></td>'
            f'<td class="dur">{took(end - sp.start_ms)}{more}</td>'
            f'<td class="outcome">{outcome}{detail}</td></tr>'
        )
    return Markup("\n".join(rows))  # each part is escaped above


_HEADERS = {
    # No inline script may run; bars are SVG attributes, not styles.
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _refused(dash: Dashboard, request: Request, form: FormData) -> Response | None:
    """A 403 unless the request carries the dashboard's token (header or form field)."""
    if dash.token is None:
        return HTMLResponse(
            "This dashboard is bound beyond 127.0.0.1 without --token: it only reads. "
            "Start it with --token to allow actions.",
            403,
            headers=_HEADERS,
        )
    given = request.headers.get(TOKEN_HEADER) or str(form.get("token", ""))
    if not secrets.compare_digest(given.encode(), dash.token.encode()):
        return HTMLResponse("wrong or missing token", 403, headers=_HEADERS)
    return None
