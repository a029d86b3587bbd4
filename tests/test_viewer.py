"""`tinkrl view`: its JSON API over a real run and eval, and the page in a real headless Chromium
(Playwright driving the system browser): curves, the rollout browser and its filters, eval results,
and a live run updating without a reload."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers.requirements import STRICT, unless

from tinkrl.aio_thread import serve_app_in_thread
from tinkrl.tracking import read_jsonl
from tinkrl.viewer.server import make_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = unless(None if CHROMIUM else "chromium is not installed (the viewer's browser tests; `make install`)")


def get(url: str) -> dict | list:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_the_api_serves_runs_episodes_and_evals(tiny_run) -> None:
    with serve_app_in_thread(make_app([tiny_run["run"].parent, tiny_run["eval"]])) as url:
        sources = get(f"{url}/api/sources")
        assert [(s["kind"], s["name"]) for s in sources] == [("run", "arith"), ("eval", "hello")]
        assert sources[0]["model"] == "tinkrl/tiny-llama" and sources[0]["environments"] == ["arithmetic"]
        metrics = get(f"{url}/api/metrics?source=0")
        assert metrics["rows"] == read_jsonl(tiny_run["run"] / "metrics.jsonl") and len(metrics["rows"]) == 3
        assert get(f"{url}/api/steps?source=0") == {"steps": [0, 1, 2]}
        episodes = get(f"{url}/api/episodes?source=0&step=1")["episodes"]
        assert len(episodes) == 8 and {e["step"] for e in episodes} == {1}
        assert all(e["messages"][-1]["role"] == "assistant" for e in episodes)
        ev = get(f"{url}/api/eval?source=1")
        assert ev["results"]["model"] == "tinkrl/tiny-llama" and [t["task"] for t in ev["trials"]] == ["hello-file"] * 2
        for bad, code in (("api/metrics?source=9", 404), ("api/episodes?source=0&step=x", 400)):
            with pytest.raises(urllib.error.HTTPError) as e:
                get(f"{url}/{bad}")
            assert e.value.code == code
        page = urllib.request.urlopen(f"{url}/", timeout=30).read().decode()
        assert 'src="static/vendor/uPlot.iife.min.js"' in page and "http" not in page.split("<body>")[1]


def test_view_refuses_a_missing_directory(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tinkrl.cli", "view", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "no such directory" in done.stderr


def _copy_steps(src: Path, dst: Path, steps: int) -> None:
    """A run dir holding the first `steps` steps of `src`: as it looked while training."""
    dst.mkdir(parents=True)
    for name in ("run.json", "config.yaml"):
        shutil.copy(src / name, dst / name)
    rows = read_jsonl(src / "metrics.jsonl")[:steps]
    (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (dst / "episodes").mkdir()
    for s in range(steps):
        shutil.copy(src / "episodes" / f"step_{s:06d}.jsonl", dst / "episodes")


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM and not STRICT:
        pytest.skip("chromium is not installed (the viewer's browser tests; `make install` installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM or "/usr/bin/chromium", args=["--no-sandbox"])
        yield b
        b.close()


@needs_chromium
def test_the_page_in_a_real_browser(tiny_run, browser, tmp_path) -> None:
    live = tmp_path / "runs" / "live"
    _copy_steps(tiny_run["run"], live, 2)
    with serve_app_in_thread(make_app([tiny_run["run"].parent, live.parent, tiny_run["eval"]])) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        # curves: both runs overlaid on the default charts, drawn on canvases
        page.goto(f"{url}/#curves")
        page.wait_for_selector("body[data-ready='1']")
        chart = page.locator(".chart[data-metric='env/arithmetic/reward/total']")
        chart.locator("canvas").wait_for()
        assert chart.locator(".u-legend .u-series").count() == 3  # step + the two runs
        assert page.locator(".chart[data-metric='optim/entropy'] canvas").count() == 1
        assert page.locator(".chart[data-metric='time split (s): sample / train']").count() == 1
        page.fill("#metric-filter", "kl_sample")
        page.locator("#metric-list input[data-metric='optim/kl_sample_train_v1']").wait_for()
        assert page.locator("#metric-list input").count() == 2  # v1 and v2
        page.screenshot(path=str(tmp_path / "curves.png"), full_page=True)

        # episodes: the live run is the newest, its latest step is shown
        page.goto(f"{url}/#episodes")
        page.select_option("#ep-run", label="arith")
        page.wait_for_function("document.querySelector('#ep-step').value === '2'")
        page.wait_for_selector("#ep-list .episode-row")
        assert page.locator("#ep-list .episode-row").count() == 8
        assert page.locator("#ep-list .group").count() == 2
        page.locator("#ep-list .episode-row").nth(5).click()
        head = page.locator("#episode-head").inner_text()
        assert "step 2" in head and "group 1" in head and "advantage" in head
        assert page.locator("#transcript .msg.role-prompt").count() == 1
        assert page.locator("#transcript .msg.role-assistant").count() == 1
        assert "reference" in page.locator("#grade").inner_text()
        # search marks the text; a filter nobody passes empties the list
        episodes = get(f"{url}/api/episodes?source=0&step=2")["episodes"]
        word = episodes[0]["task"]
        page.fill("#ep-search", word)
        assert page.locator("#ep-list .episode-row").count() == sum(word in json.dumps(e) for e in episodes)
        page.fill("#ep-search", "")
        page.select_option("#ep-reward", "pos")
        assert page.locator("#ep-list .episode-row").count() == sum((e["reward"] or 0) > 0 for e in episodes)
        page.select_option("#ep-reward", "")
        page.check("#ep-truncated")
        assert page.locator("#ep-list .episode-row").count() == sum(e["truncated"] for e in episodes)
        page.uncheck("#ep-truncated")
        page.screenshot(path=str(tmp_path / "transcript.png"), full_page=True)

        # live: the run still training writes step 2; the page shows it without a reload
        page.evaluate("window.__same_page = true")
        page.select_option("#ep-run", label="live")
        page.wait_for_function("document.querySelector('#ep-step').value === '1'")
        src = tiny_run["run"]
        shutil.copy(src / "episodes" / "step_000002.jsonl", live / "episodes")
        with (live / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(read_jsonl(src / "metrics.jsonl")[2]) + "\n")
        page.wait_for_function("document.querySelector('#ep-step').value === '2'", timeout=15000)
        assert page.evaluate("window.__same_page") is True

        # evals: the per-task table, a task's trial transcripts
        page.goto(f"{url}/#evals")
        page.wait_for_selector("#ev-table tr.task-row")
        assert page.locator("#ev-table tr.task-row").inner_text().startswith("hello-file")
        assert page.locator("#ev-table tr.overall").count() == 1
        page.locator("#ev-table tr.task-row").click()
        page.wait_for_selector("#ev-transcript .msg.role-assistant")
        assert page.locator("#ev-trials .episode-row").count() == 2
        assert [m["role"] for m in get(f"{url}/api/eval?source=2")["trials"][0]["messages"]][:2] == ["system", "user"]
        assert errors == []
    for shot in ("curves.png", "transcript.png"):
        assert (tmp_path / shot).stat().st_size > 20_000  # a rendered page, not a blank one
