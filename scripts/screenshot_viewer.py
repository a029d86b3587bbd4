"""Screenshots of `tinkrl view` for the docs: the curves page and an episode's transcript.

    python scripts/screenshot_viewer.py RUN_DIR [RUN_DIR...] --out docs/

Serves the run directories on loopback, drives the system Chromium through Playwright, and writes
viewer_curves.png (every run overlaid) and viewer_transcript.png (the last run's latest step, its
first episode with reward > 0 when there is one).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

from tinkrl.aio_thread import serve_app_in_thread
from tinkrl.viewer.server import make_app


def main() -> None:
    """Write the two screenshots."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    with serve_app_in_thread(make_app(args.runs)) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{url}/#curves")
        page.wait_for_selector(".chart canvas")
        page.wait_for_timeout(500)
        page.screenshot(path=str(args.out / "viewer_curves.png"))
        page.goto(f"{url}/#episodes")
        page.select_option("#ep-run", label=args.runs[-1].name)
        page.wait_for_selector("#ep-list .episode-row")
        page.select_option("#ep-reward", "pos")
        if page.locator("#ep-list .episode-row").count() == 0:
            page.select_option("#ep-reward", "")
        page.locator("#ep-list .episode-row").first.click()
        page.wait_for_timeout(300)
        page.screenshot(path=str(args.out / "viewer_transcript.png"))
        browser.close()
    print(f"wrote {args.out / 'viewer_curves.png'} and {args.out / 'viewer_transcript.png'}")


if __name__ == "__main__":
    main()
