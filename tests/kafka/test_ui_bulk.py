"""The dashboard's bulk actions by filter in Debian's Chromium (Playwright), on a real
broker and engine: retry, resume, pause and unpause every run of the list's filter
after a dry run that counts them, then the job's page with how many it changed and,
for each run it did not, why (left alone for its status, or refused by the engine).

Skipped only where /usr/bin/chromium is missing (`scripts/setup` installs it).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect, sync_playwright

import runstream
from runstream import TerminalStepError
from runstream.cli.ui_cmd import dashboard
from runstream.operations import CancelJob
from runstream.settings import Settings
from runstream.topics.admin import ensure_topics
from runstream.ui import screenshots
from runstream.ui.bulk import Plan, job_file
from runstream.ui.server import LOOPBACK_HOSTS, create_app

from .flows import make_app
from .kit import PARTITIONS, ThreadWorker, wait_for
from .test_ui import Site, _free_port, _Server

CHROMIUM = screenshots.CHROMIUM
pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"no Chromium at {CHROMIUM} (scripts/setup installs Debian's chromium)",
    ),
]

#: What the workflows below find when they run: set before a retry or a resume, so that
#: the runs failed or parked before it go on after it.
FIXED = {"step": False, "code": False}
BULK_TIMEOUT = 15.0  # how long a job waits for its runs to show the action


@pytest.fixture(scope="module")
def site(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    ns, tmp = f"t{uuid.uuid4().hex[:10]}", tmp_path_factory.mktemp("ui-bulk")
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    app = make_app(ns, kafka_bootstrap)

    @app.step
    def fragile(n: int) -> int:
        if not FIXED["step"]:
            raise TerminalStepError("not fixed yet")
        return n

    @app.workflow
    async def fails_until_fixed(ctx: runstream.Context, n: int) -> int:
        return await ctx.step(fragile, n)

    @app.workflow
    async def parks_until_fixed(ctx: runstream.Context, n: int) -> int:
        while not FIXED["code"]:  # workflow code past its time budget: parked
            pass
        return n

    FIXED.update(step=False, code=False)
    worker = ThreadWorker(app, tmp / "state", activation_budget=0.5)
    client = runstream.Client(ns, kafka_bootstrap)
    dash = None
    server = None
    try:
        for n in (1, 2):
            client.start("fails_until_fixed", n, run_id=f"fail-{n}", tags={"batch": "r"})
            client.start("parks_until_fixed", n, run_id=f"park-{n}", tags={"batch": "p"})
        order = {"id": 7, "amount": -1}  # declined: it compensates, so can't be retried
        client.start("checkout", order, run_id="declined", tags={"batch": "r"})
        client.start("approval", None, run_id="waiting-r", tags={"batch": "r"})
        for n in (1, 2, 3):
            client.start("fails_until_fixed", n, run_id=f"fail-s-{n}", tags={"batch": "s"})
        for run_id in ("hold-1", "hold-2", "hold-3"):
            client.start("approval", None, run_id=run_id, tags={"batch": "q"})
        client.start("three_steps", 1, run_id="done-q", tags={"batch": "q"})
        for run_id in ("fail-1", "fail-2", "declined", "fail-s-1", "fail-s-2", "fail-s-3"):
            with pytest.raises(runstream.RunFailed):
                client.result(run_id, timeout=60)
        assert client.result("done-q", timeout=60) == 4
        for run_id in ("park-1", "park-2"):
            wait_for(lambda r=run_id: client.get_run(r).status == "parked", what=run_id)
        dash = dashboard(ns, kafka_bootstrap, tmp / "cache")
        dash.bulk_timeout = BULK_TIMEOUT
        dash.start()
        server = _Server(create_app(dash, LOOPBACK_HOSTS), _free_port())
        url = f"http://127.0.0.1:{server.server.config.port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            try:
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


def _dry_run(site: Site, batch: str, action: str) -> Page:
    page = site.page()
    page.goto(f"{site.url}/runs?tag=batch%3D{batch}")
    page.click("details.bulk summary")
    page.select_option("#bulk-action", action)
    page.click("#bulk-dry-run")
    return page


def _confirm(page: Page) -> None:
    if "/bulk/" not in page.url:
        page.click("#bulk-confirm")
        page.wait_for_url("**/bulk/*")
    expect(page.locator("#bulk-state")).to_have_text("done", timeout=BULK_TIMEOUT * 1000 + 30_000)


def _sample(page: Page) -> list[str]:
    return sorted(page.locator("#bulk-sample a").all_inner_texts())


def _left(page: Page) -> dict[str, str]:
    items = page.locator("#bulk-left li").all_inner_texts()
    return dict(i.split(": ", 1) for i in items)  # type: ignore[misc]


def test_bulk_retry_after_a_dry_run_retries_the_failed_runs_and_says_why_not_the_rest(
    site: Site,
) -> None:
    page = _dry_run(site, "r", "retry")
    expect(page.locator("#bulk-count")).to_have_text("3 runs would be retried.")
    assert _sample(page) == ["declined", "fail-1", "fail-2"]
    page.click("#bulk-left summary")
    assert _left(page) == {"waiting-r": "running: only failed or dead runs are retried"}
    assert site.status("fail-1") == site.status("fail-2") == "failed"  # a dry run sends nothing

    FIXED["step"] = True
    token = page.input_value("input[name=token]")
    page.click("#bulk-confirm")
    page.wait_for_url("**/bulk/*")
    # confirmed again while it runs (a double click, a resent form): the same job, which
    # runs at least BULK_TIMEOUT (it waits that long for "declined", refused)
    again = page.request.post(
        f"{site.url}/bulk",
        form={"token": token, "tag": "batch=r", "action": "retry", "confirm": "yes"},
    )
    assert again.ok and again.url == page.url
    _confirm(page)
    expect(page.locator("#bulk-progress")).to_have_text("3 of 3 sent")
    expect(page.locator("#bulk-done")).to_contain_text("2 of 3 runs retried")
    refused = page.locator("#bulk-refused li")
    expect(refused).to_have_count(1)
    expect(refused).to_contain_text("declined: refused (not-retryable)")
    expect(refused).to_contain_text("compensated")
    assert site.client.result("fail-1", timeout=60) == 1
    assert site.client.result("fail-2", timeout=60) == 2
    assert site.status("declined") == "failed"
    assert site.status("waiting-r") == "running"


def test_bulk_resume_after_a_dry_run_resumes_the_parked_runs(site: Site) -> None:
    page = _dry_run(site, "p", "resume")
    expect(page.locator("#bulk-count")).to_have_text("2 runs would be resumed.")
    assert _sample(page) == ["park-1", "park-2"]
    assert site.status("park-1") == "parked"

    FIXED["code"] = True
    _confirm(page)
    expect(page.locator("#bulk-done")).to_contain_text("2 of 2 runs resumed")
    expect(page.locator("#bulk-refused li")).to_have_count(0)
    assert site.client.result("park-1", timeout=60) == 1
    assert site.client.result("park-2", timeout=60) == 2


def test_bulk_pause_then_unpause_by_the_filter_after_dry_runs(site: Site) -> None:
    holds = ("hold-1", "hold-2", "hold-3")
    page = _dry_run(site, "q", "pause")
    expect(page.locator("#bulk-count")).to_have_text("3 runs would be paused.")
    assert _sample(page) == list(holds)
    page.click("#bulk-left summary")
    assert _left(page) == {"done-q": "completed: only open runs not paused yet are paused"}
    assert all(site.status(r) == "running" for r in holds)
    _confirm(page)
    expect(page.locator("#bulk-done")).to_have_text("3 of 3 runs paused (now: 3 paused).")
    assert all(site.status(r) == "paused" for r in holds)

    page = _dry_run(site, "q", "unpause")
    expect(page.locator("#bulk-count")).to_have_text("3 runs would be unpaused.")
    _confirm(page)
    expect(page.locator("#bulk-done")).to_have_text("3 of 3 runs unpaused (now: 3 running).")
    assert all(site.status(r) == "running" for r in holds)
    for run_id in holds:  # unpaused, they go on: a signal reaches each
        site.client.signal(run_id, "approve", run_id)
        assert site.client.result(run_id, timeout=60) == {"approved": True, "by": run_id}


def test_a_bulk_action_with_nothing_to_do_offers_no_confirm(site: Site) -> None:
    page = _dry_run(site, "q", "resume")  # no run of batch q is parked
    expect(page.locator("#bulk-count")).to_have_text("0 runs would be resumed.")
    expect(page.locator("#bulk-confirm")).to_have_count(0)


def test_a_bulk_retry_stopped_part_way_goes_on_from_its_job_file_sending_nothing_twice(
    site: Site,
) -> None:
    """A dashboard killed after the first chunk leaves the job file so: the same action
    confirmed again sends only the rest."""
    FIXED["step"] = True
    where, runs = {"tag.batch": "s"}, ["fail-s-1", "fail-s-2", "fail-s-3"]
    settings = Settings().with_bootstrap(site.bootstrap)
    path = job_file(site.tmp / "cache", settings, site.ns, Plan("retry", where, [], {}))
    assert path is not None
    job = CancelJob(where, runs, reason="an earlier dashboard")
    job.create(path)
    site.client.retry("fail-s-1", reason="an earlier dashboard")  # its first chunk
    job.advance(path, 1)
    assert site.client.result("fail-s-1", timeout=60) == 1

    page = _dry_run(site, "s", "retry")
    expect(page.locator("#bulk-earlier")).to_contain_text("(1 of 3 sent)")
    _confirm(page)
    expect(page.locator("#bulk-progress")).to_have_text(
        "3 of 3 sent (1 by an earlier job of this filter)"
    )
    assert site.client.result("fail-s-2", timeout=60) == 2
    assert site.client.result("fail-s-3", timeout=60) == 3
    for run_id in runs:  # each retried once
        facts = [f.type for f in site.client.history(run_id)]
        assert facts.count("RunRetried") == 1, (run_id, facts)
    assert not path.exists()  # finished: the same action later is a new job
