"""Screenshots of the dashboard's main pages, for the README.

    python -m runstream.ui.screenshots http://127.0.0.1:8233 RUN_ID [--out docs/screenshots]

takes the runs list, RUN_ID's page (timeline, history), the versions and the dead-letter
pages with Debian's Chromium (``/usr/bin/chromium``) driven by Playwright (the ``test`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from playwright.sync_api import Browser

CHROMIUM = "/usr/bin/chromium"


def take(base_url: str, run_id: str, out: Path, chromium: str = CHROMIUM) -> list[Path]:
    """Save ``runs.png``, ``run.png``, ``versions.png`` and ``dlq.png`` in ``out``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            return shoot(browser, base_url, run_id, out)
        finally:
            browser.close()


def shoot(browser: Browser, base_url: str, run_id: str, out: Path) -> list[Path]:
    """`take` with a browser already running."""
    out.mkdir(parents=True, exist_ok=True)
    pages = {
        "runs.png": "/runs",
        "run.png": f"/runs/{quote(run_id, safe='')}",
        "versions.png": "/versions",
        "dlq.png": "/dlq",
    }
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        for name, path in pages.items():
            page.goto(base_url.rstrip("/") + path)
            page.screenshot(path=out / name, full_page=True)
    finally:
        page.close()
    return [out / name for name in pages]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the dashboard, e.g. http://127.0.0.1:8233")
    parser.add_argument("run_id", help="the run whose page to take")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    args = parser.parse_args()
    for path in take(args.url, args.run_id, args.out):
        print(path)


if __name__ == "__main__":
    main()
