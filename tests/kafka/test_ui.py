"""`runstream ui` in a real browser: Debian's Chromium driven by Playwright, against a
dashboard served on a free port over a namespace whose runs a real engine runs.

Skipped only where /usr/bin/chromium is missing (`scripts/setup` installs it).
``RUNSTREAM_UI_SCREENSHOTS=DIR`` also saves the main pages there (docs/screenshots).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

import runstream
from runstream.cli.ui_cmd import dashboard
from runstream.topics.admin import ensure_topics
from runstream.ui import screenshots
from runstream.ui.server import LOOPBACK_HOSTS, Dashboard, create_app

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, wait_for

CHROMIUM = screenshots.CHROMIUM
pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"no Chromium at {CHROMIUM} (scripts/setup installs Debian's chromium)",
    ),
]


XSS = '<img src=x onerror="document.title=1">'


@dataclass
class Site:
    url: str
    ns: str
    client: runstream.Client
    browser: Browser
    tmp: Path
    bootstrap: str

    def page(self) -> Page:
        page = self.browser.new_page()
        page.set_default_timeout(30_000)
        return page

    def status(self, run_id: str) -> str:
        return self.client.get_run(run_id).status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """The dashboard's app under uvicorn, on a thread of the test process."""

    def __init__(self, app: Any, port: int) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, what="the dashboard to listen")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def site(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    ns, tmp = f"t{uuid.uuid4().hex[:10]}", tmp_path_factory.mktemp("ui")
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    app = make_app(ns, kafka_bootstrap)

    @app.workflow(concurrency_key=lambda _: "k", limit=1)
    async def solo(ctx: runstream.Context, n: int) -> None:  # holds its permit until "go"
        await ctx.wait_for_signal("go")

    worker = ThreadWorker(app, tmp / "state")
    client = runstream.Client(ns, kafka_bootstrap)
    dash: Dashboard | None = None
    server: _Server | None = None
    try:
        client.start("three_steps", 1, run_id="done-1", tags={"team": "a"})
        client.start("parent", 2, run_id="family")
        client.start("checkout", {"id": 7, "amount": -1}, run_id="declined")
        client.start("sleepy", 3600, run_id="sleeper")
        client.schedule("yearly", "three_steps", 1, cron="0 0 1 1 *")
        client.start("solo", 1, run_id="solo-1")
        client.start("three_steps", "not a number", run_id="bad-input")  # a dead letter
        for run_id in ("wait-cancel", "wait-signal", "wait-token", "bulk-1", "bulk-2", "bulk-3"):
            tags = {"batch": "b"} if run_id.startswith("bulk") else {}
            client.start("approval", None, run_id=run_id, tags=tags)
        assert client.result("done-1", timeout=60) == 4
        with pytest.raises(runstream.RunRejected):
            client.result("bad-input", timeout=60)
        assert len(client.result("family", timeout=60)) == 2
        with pytest.raises(runstream.RunFailed):
            client.result("declined", timeout=60)
        wait_for(lambda: client.get_run("sleeper").steps == 1, what="the sleeper to sleep")
        client.start("solo", 2, run_id="solo-2")  # after solo-1: it waits for the permit
        dash = dashboard(ns, kafka_bootstrap, tmp / "cache")
        dash.start()
        server = _Server(create_app(dash, LOOPBACK_HOSTS), _free_port())  # as `runstream ui`
        url = f"http://127.0.0.1:{server.server.config.port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            try:
                if shots := os.environ.get("RUNSTREAM_UI_SCREENSHOTS"):
                    screenshots.shoot(browser, url, "declined", Path(shots))
                yield Site(url, ns, client, browser, tmp, kafka_bootstrap)
            finally:
                browser.close()
    finally:
        if server is not None:
            server.stop()
        if dash is not None:
            dash.close()
        client.close()
        worker.stop()


def _rows(page: Page) -> list[str]:
    return sorted(page.locator("a.run-link").all_inner_texts())


def test_list_shows_runs_and_filters_kept_in_the_url(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs")
    expect(page.locator("a.run-link", has_text="done-1")).to_be_visible()
    assert {"done-1", "family", "declined", "sleeper", "wait-cancel"} <= set(_rows(page))

    page.select_option("select[name=status]", "completed")
    page.click("#apply")
    page.wait_for_url("**status=completed**")
    assert "done-1" in _rows(page) and "family" in _rows(page)
    assert "sleeper" not in _rows(page) and "declined" not in _rows(page)

    page.fill("input[name=tag]", "team=a")
    page.click("#apply")
    page.wait_for_url("**tag=team%3Da**")
    assert _rows(page) == ["done-1"]

    page.goto(f"{site.url}/runs?prefix=bulk-")  # the URL alone is the filter
    assert _rows(page) == ["bulk-1", "bulk-2", "bulk-3"]
    assert page.input_value("input[name=prefix]") == "bulk-"
    page.goto(f"{site.url}/runs?workflow=approval&status=failed")
    expect(page.locator("td.empty")).to_have_text("no runs match")


def test_run_page_shows_its_timeline_history_and_output(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs?workflow=three_steps")
    page.click("a.run-link:text-is('done-1')")
    page.wait_for_url("**/runs/done-1")
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#run-output")).to_have_text("4")
    steps = page.locator("#timeline tr.span-step")
    expect(steps).to_have_count(3)
    assert all("add_one" in t for t in steps.all_inner_texts())
    assert page.locator("#timeline tr.span-step.out-ok rect").count() == 3

    page.check("#kinds input[value=step]")
    page.click("#filter-facts")
    page.wait_for_url("**kind=step**")
    facts = page.locator("#history tr.fact td:nth-child(2)").all_inner_texts()
    assert facts and set(facts) == {"StepStarted", "StepCompleted"}


def test_a_failed_run_shows_its_error_and_traceback(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs/declined")
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("pre.error")).to_contain_text("negative amount")
    failed = page.locator("tr.fact-StepFailed")
    expect(failed).to_have_count(1)
    failed.locator("details.tb summary").click()
    expect(failed.locator("pre.traceback")).to_contain_text("Traceback")
    expect(page.locator("#timeline tr.span-step.out-failed")).to_have_count(1)


def test_parent_and_child_link_to_each_other(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs/family")
    expect(page.locator("#timeline tr.span-child")).to_have_count(2)
    children = page.locator("a.child-link")
    expect(children).to_have_count(2)
    child = children.first.inner_text()
    children.first.click()
    page.wait_for_url(f"**/runs/{quote(child, safe='')}")
    expect(page.locator("#parent-link")).to_have_text("family")


def test_run_page_says_what_the_run_waits_on(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs/sleeper")
    expect(page.locator("#waiting li.wait-timer")).to_contain_text("until")
    page.goto(f"{site.url}/runs/wait-signal")
    expect(page.locator("#waiting li.wait-signal")).to_contain_text("signal 'approve'")


def test_cancel_from_the_run_page_cancels_the_run(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs/wait-cancel")
    expect(page.locator("#run-status")).to_have_text("running")
    page.click("#cancel-run")
    expect(page.locator("#done")).to_have_text("cancel sent")
    wait_for(lambda: site.status("wait-cancel") == "cancelled", what="the cancel")
    # the page follows the lifecycle topic: no reload needed
    expect(page.locator("#run-status")).to_have_text("cancelled")


def test_signal_from_the_run_page_reaches_the_workflow(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs/wait-signal")
    page.fill("#signal-name", "approve")
    page.fill("#signal-payload", '{"by": "ann"}')
    page.click("#send-signal")
    expect(page.locator("#done")).to_have_text("signal 'approve' sent")
    assert site.client.result("wait-signal", timeout=60) == {"approved": True, "by": {"by": "ann"}}


def test_bulk_cancel_by_the_filter_after_a_dry_run(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs?tag=batch%3Db")
    assert _rows(page) == ["bulk-1", "bulk-2", "bulk-3"]
    page.click("details.bulk summary")
    page.click("#bulk-dry-run")
    expect(page.locator("#bulk-count")).to_contain_text("3 runs would be cancelled")
    assert all(site.status(r) == "running" for r in ("bulk-1", "bulk-2", "bulk-3"))
    page.click("#bulk-confirm")
    page.wait_for_url("**/bulk/*")  # the job's page: how far it got, then what it did
    expect(page.locator("#bulk-state")).to_have_text("done", timeout=90_000)
    expect(page.locator("#bulk-progress")).to_have_text("3 of 3 sent")
    expect(page.locator("#bulk-done")).to_have_text("3 of 3 runs cancelled (now: 3 cancelled).")
    for run_id in ("bulk-1", "bulk-2", "bulk-3"):
        assert site.status(run_id) == "cancelled"


def test_live_list_shows_new_runs_and_pauses(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs?prefix=live-")
    expect(page.locator("td.empty")).to_be_visible()
    site.client.start("three_steps", 1, run_id="live-1")
    expect(page.locator("a.run-link", has_text="live-1")).to_be_visible()
    page.click("#live-toggle")
    expect(page.locator("#live-state")).to_have_text("paused")
    site.client.start("three_steps", 1, run_id="live-2")
    expect(page.locator("#live-state")).to_contain_text("changes")
    assert _rows(page) == ["live-1"]  # paused: the table stays as it was
    page.click("#live-toggle")
    expect(page.locator("a.run-link", has_text="live-2")).to_be_visible()


def test_actions_without_the_token_are_refused(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/runs/sleeper")
    answer = page.request.post(f"{site.url}/action", form={"run_id": "sleeper", "action": "cancel"})
    assert answer.status == 403
    answer = page.request.post(
        f"{site.url}/action", form={"run_id": "sleeper", "action": "cancel", "token": "wrong"}
    )
    assert answer.status == 403
    assert site.status("sleeper") == "running"


def test_user_data_is_shown_as_text_never_as_markup(site: Site) -> None:
    site.client.start("three_steps", 2, run_id="odd", tags={"note": XSS})
    assert site.client.result("odd", timeout=60) == 5
    page = site.page()
    page.goto(f"{site.url}/runs?prefix=odd")
    expect(page.locator("span.tag")).to_have_text(f"note={XSS}")
    page.goto(f"{site.url}/runs/odd")
    expect(page.locator("span.tag")).to_have_text(f"note={XSS}")
    assert page.locator("img").count() == 0


def test_redrive_an_edited_dead_letter_starts_the_run(site: Site) -> None:
    page = site.page()
    page.goto(f"{site.url}/dlq")
    row = page.locator("tr.letter", has_text="invalid-input")
    expect(row).to_have_count(1)
    assert row.locator("a").inner_text() == "bad-input"
    record = page.locator("tr.letter-record").filter(has_text="not a number")
    record.locator("summary").click()
    document = json.loads(record.locator("textarea").input_value())
    assert document["type"] == "StartRun" and document["input"] == "not a number"
    record.locator("textarea").fill(json.dumps({**document, "input": 2}))
    record.locator("button.redrive-button").click()
    expect(page.locator("#done")).to_contain_text("(redrive 1, edited)")
    assert site.client.result("bad-input", timeout=60) == 5


def test_with_a_token_an_action_needs_it_typed_into_the_page(site: Site) -> None:
    # As bound beyond loopback: the pages carry no token, the user types it.
    dash = dashboard(site.ns, site.bootstrap, site.tmp / "cache-token", token="s3cret",
                     loopback=False)  # fmt: skip
    dash.start()
    server = _Server(create_app(dash), _free_port())
    try:
        page = site.page()
        page.goto(f"http://127.0.0.1:{server.server.config.port}/runs/wait-token")
        assert "s3cret" not in page.content()
        page.fill("#token-input", "wrong")
        page.click("#cancel-run")
        expect(page.locator("body")).to_contain_text("wrong or missing token")
        page.go_back()
        page.fill("#token-input", "s3cret")
        page.click("#cancel-run")
        expect(page.locator("#done")).to_have_text("cancel sent")
        wait_for(lambda: site.status("wait-token") == "cancelled", what="the cancel")
    finally:
        server.stop()
        dash.close()


def test_schedules_and_task_groups_pages(site: Site) -> None:
    page = site.page()
    row = page.locator("tr.schedule", has_text="yearly")
    # the page reads the journal when loaded: load it again until the engine recorded it
    wait_for(lambda: page.goto(f"{site.url}/schedules") and row.count(), what="the schedule")
    expect(row).to_contain_text("three_steps")
    expect(row).to_contain_text("active")
    page.goto(f"{site.url}/tasks")  # this App declares no task group
    expect(page.locator("td.empty")).to_contain_text("no task groups")


def test_limits_page_shows_the_permit_held_and_the_run_waiting(site: Site) -> None:
    page = site.page()
    row = page.locator("tr.limit", has_text="solo")
    # the page folds the journal when loaded: load it again until solo-2's request is in
    wait_for(lambda: page.goto(f"{site.url}/limits") and row.locator("td.waiting a").count(),
             what="solo-2 waiting")  # fmt: skip
    assert row.locator("td.held a").all_inner_texts() == ["solo-1"]
    assert row.locator("td.waiting a").all_inner_texts() == ["solo-2"]
    page.goto(f"{site.url}/runs/solo-2")
    expect(page.locator("#waiting li.wait-permit")).to_contain_text("permit solo")


def test_a_loopback_dashboard_answers_no_other_host_name(site: Site) -> None:
    """A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) gets no
    page, so never the token in it."""
    port = int(site.url.rsplit(":", 1)[1])
    for host, status in ((f"evil.example:{port}", 400), (f"localhost:{port}", 200)):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/runs", headers={"Host": host})
            assert conn.getresponse().status == status, host
        finally:
            conn.close()
