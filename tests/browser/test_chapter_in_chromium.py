"""A real browser: JupyterLab in headless Chromium runs a chapter, and its animated widget renders
and moves when Play is pressed. Skipped, saying so, where Chromium is not installed.

    chapter 03: the slot timeline (svg.slot-timeline)   chapter 04: the fragmentation visualizer (svg.kv-memory)"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = os.environ.get("MINILLM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHAPTERS = [("chapters/03_continuous_batching.ipynb", "svg.slot-timeline"),
            ("chapters/04_paged_kv.ipynb", "svg.kv-memory")]

REQUIRED = os.environ.get("MINILLM_REQUIRE_BROWSER") == "1"  # set by .ci/run: CI may not skip this test
if CHROMIUM is None and REQUIRED:
    raise RuntimeError("MINILLM_REQUIRE_BROWSER=1 but Chromium was not found (apt-get install chromium, "
                       "or set MINILLM_CHROMIUM to its path)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not found: the browser test was skipped "
                                 "(apt-get install chromium, or set MINILLM_CHROMIUM)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab():
    port, token = _free_port(), "minillm-browser-test"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={REPO}", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("JupyterLab did not start within 90 s")
    yield url, token
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.parametrize("chapter,widget", CHAPTERS, ids=[Path(c).stem for c, _ in CHAPTERS])
def test_chapter_runs_and_its_animation_advances(lab, chapter, widget):
    from playwright.sync_api import sync_playwright

    url, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/lab/tree/{chapter}?token={token}")
        page.wait_for_selector(".jp-Notebook", timeout=120_000)
        page.wait_for_timeout(3000)  # let the kernel start
        page.click("text=Run")  # the menu
        page.click("text=Run All Cells")
        timeline = page.locator(f"{widget}:visible").first
        timeline.wait_for(timeout=300_000)
        timeline.scroll_into_view_if_needed()
        before = timeline.get_attribute("data-step")
        page.locator(".widget-play button").first.click()  # ▶ Play
        page.wait_for_timeout(2500)
        after = page.locator(f"{widget}:visible").first.get_attribute("data-step")
        page.screenshot(path=str(ARTIFACTS / f"{Path(chapter).stem}.png"), full_page=False)
        browser.close()
    assert before is not None and after is not None
    assert int(after) > int(before), f"{widget} did not advance after Play ({before} -> {after})"
