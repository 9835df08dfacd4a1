"""Every chapter, walked in a real browser as a learner's first hour would: JupyterLab (started as
`make lab` starts it, after `jupyter trust chapters/*.ipynb`, with the course's settings: widget
state saved with the notebook, and the pre-save hook of widgets/save_hook.py) in headless Chromium
opens a working copy of the chapter (test-artifacts/walk/, so the committed file is never
written), and the test checks, per chapter (one test each, for every notebook in chapters/):

  1. the kernel JupyterLab started is the course's, "minillm (.venv)" (the notebook's toolbar);
  2. before anything runs: no output shows a widget's raw Python repr (`SlotTimeline(children=…`)
     or "Error displaying widget", and every saved animated widget shows a picture (the widget's
     svg, or its still picture);
  3. saving right away (as JupyterLab's autosave would) writes the chapter back unchanged, byte
     for byte: the saved widgets are kept although the kernel holds none of them yet;
  4. Run All runs every code cell (each gets an execution count in this session) and no cell
     shows an error;
  5. after running: still no raw repr, every animated widget (a Play button beside an
     `svg[data-step]`, e.g. svg.slot-timeline, svg.kv-memory) moves when Play is pressed, and one
     quiz question answers back when its options are clicked;
  6. saved, then reopened twice — with its kernel still running, then after the kernel was shut
     down — every widget output renders as a live widget (never "model not found"), animated ones
     with their svg, and the saved file gives every widget output its model;
  7. the committed .ipynb is byte-identical afterwards.

Screenshots (<chapter>-before-run.png, -animation.png, -reopened.png, <chapter>.png at the end,
-failure.png) and a summary (<chapter>.json) go to test-artifacts/, with JupyterLab's log
(jupyterlab.log). MINILLM_BROWSER_RUN_TIMEOUT: seconds Run All may take per chapter (default 600).
Skipped, saying so, where Chromium or Playwright is missing — unless MINILLM_REQUIRE_BROWSER=1
(CI, .ci/run), where that is a failure. Chromium: $MINILLM_CHROMIUM, else `chromium` on PATH.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
WALK = ARTIFACTS / "walk"  # the working copies the browser opens and saves
PROBE_JS = Path(__file__).with_name("lab_probe.js")
CHAPTERS = sorted((REPO / "chapters").glob("*.ipynb"))
COURSE_KERNEL = "minillm (.venv)"  # the display name `make lab` installs the course's kernel under
TOKEN = "minillm-browser-test"

KERNEL_TIMEOUT_S = 180  # a kernel starting on a loaded 2-core machine
PICTURE_TIMEOUT_S = 60  # saved widgets render once the kernel session is ready
RUN_TIMEOUT_S = int(os.environ.get("MINILLM_BROWSER_RUN_TIMEOUT", "600"))  # Run All, one chapter
PLAY_TIMEOUT_S = 15

# A widget's Python repr: what JupyterLab shows when it can render neither the widget nor a still.
RAW_REPR = re.compile(r"\b\w+\(children=|\b\w*Widget\(|\bIPY_MODEL_[0-9a-f]+")
# What ipywidgets shows where a saved widget's model is missing from the notebook's widget state.
WIDGET_ERROR = re.compile(r"Error displaying widget[^\n]{0,80}")
# What an error output (rendered as application/vnd.jupyter.stderr, like a stderr stream) looks like.
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*Cell In\[\d+\], line \d+"
                       r"|^\s*File \S+, line \d+|^\w*(Error|Exception|Interrupt|Exit)\b(:|$)", re.M)
ERROR_LINE = re.compile(r"^\w*(Error|Exception|Interrupt|Exit)\b.*$", re.M)

CHROMIUM = os.environ.get("MINILLM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM and not os.access(CHROMIUM, os.X_OK):
    CHROMIUM = None  # $MINILLM_CHROMIUM names no executable
try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
    PLAYWRIGHT_MISSING = None
except ImportError as exc:  # pragma: no cover - depends on the environment
    PlaywrightError = Exception
    sync_playwright = None
    PLAYWRIGHT_MISSING = f"{type(exc).__name__}: {exc}"

REQUIRED = os.environ.get("MINILLM_REQUIRE_BROWSER") == "1"  # set by .ci/run: CI may not skip this test
if REQUIRED and CHROMIUM is None:
    raise RuntimeError("MINILLM_REQUIRE_BROWSER=1 but Chromium was not found (apt-get install chromium, "
                       "or set MINILLM_CHROMIUM to its path)")
if REQUIRED and PLAYWRIGHT_MISSING:
    raise RuntimeError(f"MINILLM_REQUIRE_BROWSER=1 but playwright cannot be imported ({PLAYWRIGHT_MISSING}); "
                       "install the course's dev extras: pip install -e '.[course,dev]'")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium not found: the browser test was skipped "
                       "(apt-get install chromium, or set MINILLM_CHROMIUM)"),
    pytest.mark.skipif(PLAYWRIGHT_MISSING is not None,
                       reason=f"playwright cannot be imported, the browser test was skipped ({PLAYWRIGHT_MISSING})"),
]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The test's own JupyterLab user settings: no autosave (the test saves when it means to) and no news
# toasts over the toolbar. Everything else is what `make lab` installs (scripts/jupyterlab_overrides.json,
# scripts/jupyter_server_config.json) or JupyterLab's default.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jupyter(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jupyter", *args], cwd=REPO, capture_output=True, text=True,
                          **kwargs)


def _trust(paths: list[Path]) -> None:
    done = _jupyter("trust", *[str(p.relative_to(REPO)) for p in paths], timeout=120)
    if done.returncode != 0:
        pytest.fail(f"`jupyter trust` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Lab:
    url: str
    log: Path
    proc: subprocess.Popen

    def api(self, method: str, path: str):
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {TOKEN}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def sessions_for(self, rel: str) -> list[dict]:
        return [s for s in self.api("GET", "/api/sessions") if s.get("path") == rel]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab as `make lab` starts it: the chapters trusted, rooted at the repository, --allow-root
    as root, a fixed token; with its own (temporary) user settings and workspaces."""
    ARTIFACTS.mkdir(exist_ok=True)
    _trust(CHAPTERS)
    home = tmp_path_factory.mktemp("lab")
    settings = home / "user-settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    port = _free_port()
    log = ARTIFACTS / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={REPO}",
           "--LabApp.default_url=/lab/tree/chapters/00_setup.ipynb",
           f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
           "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: the test runs JupyterLab's own commands
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # as the Makefile does: containers and cloud machines often run as root
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    server = Lab(f"http://127.0.0.1:{port}", log, proc)
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited ({proc.returncode}) before serving; its log:\n{_tail(log)}")
        try:
            server.api("GET", "/api/status")
            break
        except OSError:
            if time.time() > deadline:
                proc.kill()
                pytest.fail(f"JupyterLab did not answer within 120 s; its log:\n{_tail(log)}")
            time.sleep(0.5)
    yield server
    for s in server.api("GET", "/api/sessions"):
        server.api("DELETE", f"/api/sessions/{s['id']}")
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


# ---------------------------------------------------------------------------------------------------
# What the committed notebook says it contains


@dataclass
class Saved:
    """The committed notebook: its cells, which code cells hold an animated widget, and a quiz."""
    sources: list[str]
    kinds: list[str]
    animated: list[int] = field(default_factory=list)  # cell indices of saved outputs that hold a Play
    widgets: list[int] = field(default_factory=list)  # cell indices of any saved widget output
    quiz: bool = False
    kernelspec: str = "?"


def _read_saved(path: Path) -> Saved:
    nb = json.loads(path.read_text())
    state = nb.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = state.get("state", {})

    def has_play(model_id: str, seen: set) -> bool:
        if model_id in seen or model_id not in models:
            return False
        seen.add(model_id)
        m = models[model_id]
        if m.get("model_name") == "PlayModel":
            return True
        refs = re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(m.get("state", {})))
        return any(has_play(r, seen) for r in refs)

    text = lambda v: "".join(v) if isinstance(v, list) else (v or "")  # noqa: E731
    saved = Saved(sources=[text(c.get("source")) for c in nb["cells"]], kinds=[c["cell_type"] for c in nb["cells"]],
                  kernelspec=nb.get("metadata", {}).get("kernelspec", {}).get("display_name", "(none)"))
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            view = data.get("application/vnd.jupyter.widget-view+json")
            if view:
                saved.widgets.append(i)
                plain = text(data.get("text/plain"))
                if has_play(view.get("model_id", ""), set()) or "Play(" in plain:
                    saved.animated.append(i)
            if "quiz-option" in text(data.get("text/html")):
                saved.quiz = True
    return saved


# ---------------------------------------------------------------------------------------------------
# One chapter in the browser


class Walk:
    """One chapter open in the browser, and the problems found so far (reported together)."""

    def __init__(self, page, chapter: Path, saved: Saved):
        self.page, self.chapter, self.saved = page, chapter, saved
        self.name = chapter.stem
        self.problems: list[str] = []
        self.notes: list[str] = []

    def problem(self, what: str) -> None:
        self.problems.append(what)

    def cells(self) -> list[dict]:
        return self.page.evaluate("() => window.__minillm.cells(20000)")

    def toolbar(self) -> dict:
        return self.page.evaluate("() => window.__minillm.toolbar()")

    def cell_name(self, index: int, cells: list[dict] | None = None) -> str:
        """'cell 12 (In [5]: `check("ch01.top_p", …)`)': its position, its prompt and first line."""
        src = ""
        if len(self.saved.sources) == len(cells or self.saved.sources) and index < len(self.saved.sources):
            src = next((ln for ln in self.saved.sources[index].splitlines() if ln.strip()), "")
        if cells and index < len(cells):
            src = src or cells[index]["firstLine"]
            prompt = cells[index]["prompt"].rstrip(":")
            where = f"cell {index + 1} (In {prompt}: " if prompt else f"cell {index + 1} ("
        else:
            where = f"cell {index + 1} ("
        src = src.strip()
        return f"{where}`{src[:70] + ('…' if len(src) > 70 else '')}`)"

    def shot(self, suffix: str = "") -> None:
        with contextlib.suppress(PlaywrightError):
            self.page.screenshot(path=str(ARTIFACTS / f"{self.name}{suffix}.png"))

    def fail(self, what: str) -> None:
        self.shot("-failure")
        self.problem(what)
        raise _Stop()

    def wait(self, condition, timeout_s: float, every_s: float = 0.5):
        deadline = time.time() + timeout_s
        while True:
            value = condition()
            if value or time.time() > deadline:
                return value
            time.sleep(every_s)


class _Stop(Exception):
    """A problem after which the walk cannot go on (already recorded)."""


def _open(walk: Walk, lab: Lab, rel: str) -> None:
    page = walk.page
    # A workspace of its own per chapter: nothing another chapter left open comes back with it.
    page.goto(f"{lab.url}/lab/workspaces/test-{walk.name}/tree/{urllib.parse.quote(rel)}?token={TOKEN}",
              timeout=120_000)
    try:
        page.wait_for_selector("#jp-main-dock-panel .jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=120_000)
    except PlaywrightError:
        walk.fail(f"JupyterLab did not show the notebook within 120 s (dialogs: "
                  f"{page.evaluate('() => window.__minillm.dialogs()')})")


def _check_kernel(walk: Walk, lab: Lab, rel: str) -> None:
    """The kernel JupyterLab started for the chapter is the course's, and it is ready."""
    page = walk.page
    dialogs_seen: list[str] = []

    def ready():
        for d in page.evaluate("() => window.__minillm.dialogs()"):
            dialogs_seen.append(d)  # e.g. "Select Kernel": the notebook's kernel is not installed
            page.locator(".jp-Dialog .jp-mod-accept").first.click()
        tb = walk.toolbar()
        # "No Kernel" with an idle indicator comes first, while the session is being created.
        if tb.get("status") != "idle" or tb.get("kernelName") in (None, "", "No Kernel", "Kernel"):
            return None
        if tb["cells"] != (tb.get("modelCells") or len(walk.saved.kinds)):
            return None  # JupyterLab attaches the cells to the page a few at a time ("Cell 1/23": 23 in all)
        return tb if lab.sessions_for(rel) else None

    tb = walk.wait(ready, KERNEL_TIMEOUT_S)
    if dialogs_seen:
        walk.problem(f"opening it, JupyterLab asked the learner to choose: {dialogs_seen[0]!r} "
                     f"(the notebook's kernelspec is {walk.saved.kernelspec!r})")
    if not tb:
        walk.fail(f"the kernel was not ready within {KERNEL_TIMEOUT_S} s (toolbar: {walk.toolbar()})")
    sessions = lab.sessions_for(rel)
    started = sessions[0]["kernel"]["name"] if sessions else "(no session)"
    if tb["kernelName"] != COURSE_KERNEL:
        walk.problem(f"kernel: JupyterLab started {tb['kernelName']!r} (kernelspec {started!r}), not the course's "
                     f"{COURSE_KERNEL!r} — the notebook's metadata names {walk.saved.kernelspec!r}")


def _check_outputs_show_no_repr(walk: Walk, cells: list[dict], when: str) -> None:
    for c in cells:
        for o in c["outputs"]:
            m = WIDGET_ERROR.search(o["text"])
            if m:
                walk.problem(f"{when}: {walk.cell_name(c['index'], cells)} shows {m.group(0)!r} instead of its widget")
            if o["widget"] or o["still"]:
                continue
            m = RAW_REPR.search(o["text"])
            if m:
                start = max(0, m.start() - 20)
                walk.problem(f"{when}: {walk.cell_name(c['index'], cells)} shows a widget's raw Python repr "
                             f"instead of a picture: {o['text'][start:start + 100]!r}")


def _describe(outputs: list[dict]) -> str:
    return "; ".join(f"{o['mime'] or 'a widget view'}: {o['text'][:80]!r}" for o in outputs) or "no output at all"


def _check_saved_pictures(walk: Walk, when: str = "before running") -> None:
    """Before running: every saved widget renders (waiting for it: saved widgets render once the kernel
    session is ready), every saved animated one shows its svg (widget or still), no output a raw repr."""
    want = sorted(set(walk.saved.animated))

    def pictures():
        cells = walk.cells()
        if len(cells) != len(walk.saved.kinds):
            return None
        ok = all(any(o["visibleStep"] is not None for o in cells[i]["outputs"]) for i in want)
        ok = ok and all(any(o["widget"] or o["still"] for o in cells[i]["outputs"]) for i in walk.saved.widgets)
        return cells if ok else None

    cells = walk.wait(pictures, PICTURE_TIMEOUT_S) if walk.saved.widgets else None
    cells = cells or walk.cells()
    if len(cells) != len(walk.saved.kinds):
        walk.notes.append(f"JupyterLab shows {len(cells)} cells, the file has {len(walk.saved.kinds)} "
                          "(the chapter changed on disk while the test ran?)")
    for i in want:
        outs = cells[i]["outputs"] if i < len(cells) else []
        if not any(o["visibleStep"] is not None for o in outs):
            shown = _describe(outs)
            walk.problem(f"{when}: the saved animated widget of {walk.cell_name(i, cells)} shows no picture "
                         f"(no visible svg[data-step] after {PICTURE_TIMEOUT_S} s) — it shows {shown}")
        else:
            how = "the widget" if any(o["widget"] for o in outs) else "the still picture"
            walk.notes.append(f"{when}, cell {i + 1}'s saved animation rendered as {how}")
    for i in sorted(set(walk.saved.widgets) - set(want)):
        outs = cells[i]["outputs"] if i < len(cells) else []
        if not any(o["widget"] or o["still"] for o in outs):
            shown = _describe(outs)
            walk.problem(f"{when}: the saved widget of {walk.cell_name(i, cells)} did not render — "
                         f"it shows {shown}")
    _check_outputs_show_no_repr(walk, cells, when)


def _save(walk: Walk, path: Path) -> None:
    """File ▸ Save, as the learner's Ctrl+S or JupyterLab's autosave would; wait until it is on disk."""
    before = path.stat().st_mtime_ns
    walk.page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    saved = walk.wait(lambda: path.stat().st_mtime_ns != before and not walk.page.evaluate(
        "() => !!document.querySelector('.lm-TabBar-tab.lm-mod-current.jp-mod-dirty')"), 60)
    if not saved:
        dialogs = walk.page.evaluate("() => window.__minillm.dialogs()")
        walk.fail(f"saving did not reach the disk within 60 s (dialogs: {dialogs})")


def _check_saving_at_once_changes_nothing(walk: Walk, copy: Path) -> None:
    """Saved before anything ran — the kernel holds none of the saved widgets yet — the chapter must
    come back byte for byte (the pre-save hook keeps the saved widgets' models)."""
    _save(walk, copy)
    if copy.read_bytes() != walk.chapter.read_bytes():
        lost = _widget_outputs_without_models(copy)
        walk.problem("saving right after opening changed the notebook on disk"
                     + (f": {len(lost)} widget output(s) lost their saved model, e.g. cell {lost[0] + 1}" if lost
                        else " (its widgets are all still there: something else in the file changed)"))


def _widget_outputs_without_models(path: Path) -> list[int]:
    """Cells of the notebook file whose widget output refers to a model its saved state lacks."""
    nb = json.loads(path.read_text())
    state = nb.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = state.get("state", {})
    return [i for i, cell in enumerate(nb["cells"]) for out in cell.get("outputs", [])
            if (view := out.get("data", {}).get("application/vnd.jupyter.widget-view+json"))
            and view.get("model_id") not in models]


def _check_reopened(walk: Walk, lab: Lab, rel: str, how: str) -> None:
    """Reopen the saved copy (a fresh page: a learner coming back to it) and check its widgets: each
    saved widget output renders as a live widget (never "model not found", never only the still),
    each animated one with its svg, no raw repr."""
    _open(walk, lab, rel)
    _check_kernel(walk, lab, rel)
    walk.saved = _read_saved(WALK / Path(rel).name)
    _check_saved_pictures(walk, when=f"reopened {how}")
    cells = walk.cells()
    for i in walk.saved.widgets:
        outs = cells[i]["outputs"] if i < len(cells) else []
        if not any(o["widget"] for o in outs):
            walk.problem(f"reopened {how}: {walk.cell_name(i, cells)} shows no live widget — "
                         f"it shows {_describe(outs)}")
    walk.notes.append(f"reopened {how}: {len(walk.saved.widgets)} widget outputs checked")


def _run_all(walk: Walk) -> list[dict]:
    """Run ▸ Run All Cells, then wait until every code cell has run in this session (or one failed)."""
    page = walk.page
    page.evaluate("() => window.__minillm.watchRuns()")
    page.locator("#jp-menu-panel .lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"], .lm-Menu-item[data-command="notebook:run-all-cells"]',
                 has_text="Run All Cells").first.click()
    started = time.time()
    stable = 0
    while True:
        page.evaluate("() => window.__minillm.markRunning()")
        tb, cells = walk.toolbar(), walk.cells()
        code = [c for c in cells if c["kind"] == "code"]
        running = [c for c in code if "*" in c["prompt"]]
        errors = [c for c in code if _error_text(c)]
        all_ran = all(c["ran"] and re.fullmatch(r"\[\d+\]:?", c["prompt"]) for c in code)
        if tb.get("status") in ("dead", "autorestarting", "restarting"):
            now = running[0]["index"] if running else None
            walk.fail(f"the kernel died (status {tb['status']!r})"
                      + (f" while running {walk.cell_name(now, cells)}" if now is not None else ""))
        done = tb.get("status") == "idle" and not running and (all_ran or errors)
        stable = stable + 1 if done else 0
        if stable >= 3:  # idle, nothing queued, three polls in a row
            break
        if time.time() - started > RUN_TIMEOUT_S:
            now = running[0]["index"] if running else None
            walk.fail(f"Run All did not finish within {RUN_TIMEOUT_S} s (kernel {tb.get('status')!r}"
                      + (f", still running {walk.cell_name(now, cells)}" if now is not None else "")
                      + f"; {sum(c['ran'] for c in code)}/{len(code)} code cells started)")
        time.sleep(1)
    walk.notes.append(f"Run All took {time.time() - started:.0f} s")
    return cells


def _error_text(cell: dict) -> str | None:
    for o in cell["outputs"]:
        if ("vnd.jupyter.stderr" in o["mime"] or "vnd.jupyter.error" in o["mime"]) and TRACEBACK.search(o["text"]):
            return o["text"]
    return None


def _check_ran_cleanly(walk: Walk, cells: list[dict]) -> None:
    code = [c for c in cells if c["kind"] == "code"]
    for c in code:
        err = _error_text(c)
        if err:
            last = [ln for ln in err.splitlines() if ERROR_LINE.match(ln)] or err.strip().splitlines()[-1:]
            walk.problem(f"after Run All: {walk.cell_name(c['index'], cells)} raised {last[-1][:300]!r}")
    not_run = [c for c in code if not (c["ran"] and re.fullmatch(r"\[\d+\]:?", c["prompt"]))]
    if not_run:
        walk.problem(f"after Run All: {len(not_run)} code cell(s) did not run, the first: "
                     f"{walk.cell_name(not_run[0]['index'], cells)} (prompt {not_run[0]['prompt']!r})")
    _check_outputs_show_no_repr(walk, cells, "after Run All")


def _visible_step(output) -> str | None:
    """The data-step of the svg an output area shows now (a Stack shows one frame, hides the rest)."""
    return output.evaluate("o => { const s = Array.from(o.querySelectorAll('svg[data-step]'))"
                           ".find(s => s.checkVisibility()); return s ? s.getAttribute('data-step') : null; }")


def _moved(output, before: str) -> str | None:
    now = _visible_step(output)
    return now if now is not None and now != before else None


def _check_animations(walk: Walk) -> None:
    """Every visible Play button: pressing it moves the picture beside it (its svg's data-step)."""
    page = walk.page
    plays = page.locator("#jp-main-dock-panel .jp-NotebookPanel .jp-OutputArea-output .widget-play")
    count = plays.count()
    cells = walk.cells()
    expected = sorted({i for i in walk.saved.animated})
    seen = set()
    for k in range(count):
        play = plays.nth(k)
        play.scroll_into_view_if_needed(timeout=30_000)
        if not play.is_visible():
            continue
        index = play.evaluate("e => window.__minillm.cellIndexOf(e)")
        seen.add(index)
        output = play.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' jp-OutputArea-output ')][1]")
        before = _visible_step(output)
        if before is None:
            walk.problem(f"after Run All: the animated widget of {walk.cell_name(index, cells)} has a Play button "
                         "but no visible svg[data-step] beside it")
            continue
        play.locator("button").first.click()
        after = walk.wait(lambda out=output, was=before: _moved(out, was), PLAY_TIMEOUT_S, 0.2)
        if len(seen) == 1:
            walk.shot("-animation")
        if not after:
            walk.problem(f"after Run All: pressing Play in {walk.cell_name(index, cells)} did not move its picture "
                         f"(data-step stayed {before!r} for {PLAY_TIMEOUT_S} s)")
        else:
            walk.notes.append(f"cell {index + 1}: Play moved the picture from step {before} to {after}")
        stop = play.locator("button").nth(1)  # ipywidgets 8: [play/pause] [stop] [repeat]
        if stop.count():
            stop.click()  # so that it does not keep the page busy
    missing = [i for i in expected if i not in seen]
    for i in missing:  # the committed chapter had an animation here: after running there is none
        walk.problem(f"after Run All: {walk.cell_name(i, cells)} had an animated widget in the committed notebook "
                     "but shows no Play button now")
    if count == 0 and not expected:
        walk.notes.append("no animated widget in this chapter")


def _check_quiz(walk: Walk) -> None:
    """One quiz question: a wrong option says so, the right one says "✓ Right."."""
    page = walk.page
    options = page.locator("#jp-main-dock-panel .jp-NotebookPanel .quiz-option")
    if options.count() == 0:
        if walk.saved.quiz:
            walk.problem("after Run All: the committed chapter has a quiz, but none shows now")
        else:
            walk.notes.append("no quiz in this chapter")
        return
    question = page.locator("#jp-main-dock-panel .jp-NotebookPanel .quiz-question").first
    scope = question if question.count() else page.locator("#jp-main-dock-panel .jp-NotebookPanel .quiz").first
    index = options.first.evaluate("e => window.__minillm.cellIndexOf(e)")
    where = walk.cell_name(index, walk.cells())
    for correct, verdict in (("false", "Not this one"), ("true", "Right.")):
        option = scope.locator(f".quiz-option[data-correct='{correct}']").first
        if option.count() == 0:
            walk.problem(f"the quiz in {where}: its first question has no option with data-correct='{correct}'")
            continue
        option.locator("summary").scroll_into_view_if_needed(timeout=30_000)
        option.locator("summary").click()
        answer = option.locator("p")
        try:
            answer.wait_for(state="visible", timeout=10_000)
        except PlaywrightError:
            walk.problem(f"the quiz in {where}: clicking option {option.locator('summary').inner_text()!r} "
                         "revealed nothing")
            continue
        if verdict not in answer.inner_text():
            walk.problem(f"the quiz in {where}: option {option.locator('summary').inner_text()!r} answered "
                         f"{answer.inner_text()!r}, expected {verdict!r}")
    walk.notes.append("quiz answered back")


def _close(walk: Walk, lab: Lab, rel: str, shut_down: bool = True) -> None:
    """Close the notebook's tab, choosing "Discard" if JupyterLab asks to save; with `shut_down`, shut
    its kernel down too (else the kernel keeps running, as when a learner closes a tab)."""
    page = walk.page
    tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab", has=page.locator(".lm-TabBar-tabLabel",
                                                                              has_text=walk.chapter.name))
    try:
        if tab.count():
            tab.first.locator(".lm-TabBar-tabCloseIcon").click(timeout=10_000)
            discard = page.locator(".jp-Dialog button", has_text=re.compile(r"^(Discard|Don't Save)$"))
            try:
                discard.first.wait_for(timeout=10_000)
                discard.first.click()
            except PlaywrightError:
                pass  # not dirty: nothing to discard
            page.wait_for_selector("#jp-main-dock-panel .jp-NotebookPanel", state="detached", timeout=15_000)
    except PlaywrightError as exc:
        walk.notes.append(f"closing the tab: {str(exc).splitlines()[0]}")
    if not shut_down:
        return
    try:
        for s in lab.sessions_for(rel):
            lab.api("DELETE", f"/api/sessions/{s['id']}")  # its kernel too: the next chapter gets the CPU
    except OSError as exc:
        walk.notes.append(f"shutting its kernel down: {exc}")


def _check_save_and_reopen(walk: Walk, lab: Lab, rel: str, copy: Path) -> None:
    """Saved after Run All, the file gives every widget output its model; reopened with the kernel
    still running, then after it was shut down, every widget renders."""
    _save(walk, copy)
    lost = _widget_outputs_without_models(copy)
    if lost:
        walk.problem(f"saved after Run All: {len(lost)} widget output(s) refer to a model the file does not "
                     f"store, e.g. cell {lost[0] + 1} — reopened, it would show 'model not found'")
    _close(walk, lab, rel, shut_down=False)
    _check_reopened(walk, lab, rel, "with its kernel running")
    _close(walk, lab, rel, shut_down=True)
    _check_reopened(walk, lab, rel, "after its kernel was shut down")
    walk.shot("-reopened")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapter_in_jupyterlab(lab, browser, chapter: Path):
    for pattern in (f"{chapter.stem}.*", f"{chapter.stem}-*.png"):  # what an earlier run left for this chapter
        for old in ARTIFACTS.glob(pattern):
            old.unlink()
    WALK.mkdir(parents=True, exist_ok=True)
    copy = WALK / chapter.name  # the browser opens, runs and saves this copy, never the committed chapter
    shutil.copyfile(chapter, copy)
    rel = copy.relative_to(REPO).as_posix()
    _trust([chapter, copy])  # as `make lab` does (again now: the chapter may have changed since the server started)
    digest = _sha256(chapter)
    walk = Walk(None, chapter, _read_saved(chapter))
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    context.add_init_script(path=str(PROBE_JS))
    walk.page = page = context.new_page()
    page.set_default_timeout(30_000)
    t0 = time.time()
    try:
        _open(walk, lab, rel)
        _check_kernel(walk, lab, rel)
        _check_saved_pictures(walk)
        _check_saving_at_once_changes_nothing(walk, copy)
        walk.shot("-before-run")
        cells = _run_all(walk)
        _check_ran_cleanly(walk, cells)
        _check_animations(walk)
        _check_quiz(walk)
        walk.shot()
        if walk.saved.widgets:
            _check_save_and_reopen(walk, lab, rel, copy)
    except _Stop:
        pass
    except PlaywrightError as exc:
        walk.shot("-failure")
        walk.problem(f"the browser: {str(exc).splitlines()[0]}")
    finally:
        _close(walk, lab, rel)
        context.close()
    if _sha256(chapter) != digest:
        walk.problem(f"{chapter.relative_to(REPO)} changed on disk during the test — the browser worked on a copy: "
                     "did someone edit it while the test ran?")
    seconds = time.time() - t0
    print(f"\n{walk.name}: {seconds:.0f} s; " + "; ".join(walk.notes)
          + "".join(f"\n  PROBLEM {p}" for p in walk.problems))
    (ARTIFACTS / f"{walk.name}.json").write_text(json.dumps(
        {"chapter": chapter.relative_to(REPO).as_posix(), "seconds": round(seconds), "problems": walk.problems,
         "notes": walk.notes}, indent=1))
    if walk.problems:
        pytest.fail(f"chapter {walk.name} in JupyterLab ({len(walk.problems)} problem(s); screenshots in "
                    f"test-artifacts/{walk.name}*.png):\n" + "\n".join(f"  - {p}" for p in walk.problems),
                    pytrace=False)


def test_chapters_were_found():
    assert CHAPTERS, f"no notebooks in {REPO / 'chapters'}: the browser test has nothing to walk"
