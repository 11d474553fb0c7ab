"""A real browser (Playwright driving Debian's chromium, which `.ci/run` installs) opens the
app, runs the demo from its button, and waits for the Output tab to list the exported GGUF.
Screenshots of every tab land in tests/artifacts/ (git-ignored) for CI to keep, and in the folder
GUI_SHOTS names when it is set (`GUI_SHOTS=/tmp/shots pytest tests/gui/test_browser*.py`: `shot`)."""
from __future__ import annotations

from contextlib import contextmanager

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainer_core.base.hardware import cpu_load
from trainer_core.project import Project
from ui.app import serve

from .conftest import free_port

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
SHOTS_ENV = "GUI_SHOTS"           # a folder that gets a copy of every screenshot, for a person to look at
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("the browser test needs Debian's chromium: apt-get install -y chromium (.ci/run does this)")
    return found


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


def shot(page, name: str) -> Path:
    """A full-page screenshot `name`.png in tests/artifacts/ and, when GUI_SHOTS names a folder, there too."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get(SHOTS_ENV):
        folder = Path(os.environ[SHOTS_ENV])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, folder / path.name)
    return path


# the x axis's labels Vega shows (it hides overlapping ones with opacity 0), as [left, right] in page pixels
X_LABELS_JS = """el => Array.from(el.querySelectorAll('g[aria-label^="X-axis"] .role-axis-label text'))
  .filter(t => getComputedStyle(t).opacity !== '0' && t.getAttribute('opacity') !== '0' && t.textContent.trim())
  .map(t => { const r = t.getBoundingClientRect(); return [r.left, r.right, t.textContent]; })
  .sort((a, b) => a[0] - b[0])"""


LABEL_GAP_PX = 4      # less reads as one number: "195200", the end label Vega drew flush against its neighbour (2 px)


def labels_apart(page) -> list:
    """The chart's x labels; asserts that each ends at least LABEL_GAP_PX before the next begins."""
    labels = page.locator("#train-chart").evaluate(X_LABELS_JS)
    assert len(labels) >= 3, labels
    for (_, right, text), (left, _, following) in zip(labels, labels[1:]):
        assert right + LABEL_GAP_PX <= left, f"the step labels {text!r} and {following!r} run together: {labels}"
    return labels


@contextmanager
def app_page(ctx, browser, tab: str = "Setup"):
    """The app served on a free loopback port and a page on it, its `tab` shown; the app closes after."""
    ARTIFACTS.mkdir(exist_ok=True)
    app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.get_by_role("tab", name=tab).wait_for()
        yield page
    finally:
        app.close()


def test_the_demo_runs_from_its_button_and_the_output_tab_lists_the_gguf(ctx, browser, monkeypatch, tmp_path):
    from playwright.sync_api import expect
    with app_page(ctx, browser) as page:
        # no project yet: nothing to start on Train, and no Planned steps (an empty Number is drawn as a red 0)
        page.get_by_role("tab", name="Train").click()
        expect(page.locator("#train-status")).to_contain_text("No project open", timeout=60_000)
        expect(page.locator("#train-start")).to_be_disabled()
        expect(page.locator("#planned-steps")).to_be_hidden()
        page.get_by_role("tab", name="Setup").click()
        page.locator("#demo-btn").click()
        # the build speaks while it goes on (issue 56 item 3), then the demo starts
        expect(page.locator("#banner")).to_contain_text("Building the demo (", timeout=60_000)
        expect(page.locator("#banner")).to_contain_text("Demo started", timeout=120_000)
        shot(page, "setup")

        page.get_by_role("tab", name="Train").click()
        expect(page.locator("#train-metrics")).to_contain_text("loss", timeout=60_000)
        expect(page.locator('#stage-strip [data-stage="train"]')).to_have_attribute(
            "data-status", "done", timeout=400_000)
        shot(page, "train-after-training")

        gguf = Project.open(ctx.demo_root / "t5_adapter").gguf_path().name
        page.get_by_role("tab", name="Output").click()
        expect(page.locator("#output-files")).to_contain_text(gguf, timeout=300_000)
        expect(page.locator("#ggk-command textarea")).to_have_value(
            re.compile(r"--llm-adapter .*" + re.escape(gguf)), timeout=60_000)
        shot(page, "output")

        # back on Train once the run is over: the chart holds its three series (Vega's SVG line
        # marks) and their legend
        page.get_by_role("tab", name="Train").click()
        expect(page.locator("#train-status")).to_contain_text("done", timeout=120_000)
        expect(page.locator("#banner")).to_contain_text("The run finished", timeout=60_000)   # not "Demo started"
        # a project is open: its count in Planned steps, and Start usable
        steps = Project.open(ctx.demo_root / "t5_adapter").settings.train.steps
        expect(page.locator("#planned-steps").get_by_role("textbox")).to_have_value(str(steps))
        expect(page.locator("#train-start")).to_be_enabled()
        expect(page.locator('#train-chart [aria-roledescription="line mark"]')).to_have_count(3, timeout=30_000)
        expect(page.locator("#train-chart").get_by_text("val_cos")).to_be_visible(timeout=30_000)
        labels_apart(page)                          # 200 steps: "195" and "200" once ran together at the end
        shot(page, "train")

        page.get_by_role("tab", name="Logs").click()
        expect(page.locator("#log-text textarea")).to_have_value(re.compile(r"\[train\]"),
                                                               timeout=60_000)
        shot(page, "logs")

        page.get_by_role("tab", name="Hardware").click()
        page.locator("#hw-refresh").click()
        expect(page.locator("#hw-table")).to_contain_text("transformers", timeout=120_000)
        shot(page, "hardware")

        # one snapshot is a visible point on the quality plot (a line through one point draws nothing)
        page.get_by_role("tab", name="Output").click()
        page.locator("#output-snapshot").click()
        expect(page.locator("#snapshots")).to_contain_text("-step", timeout=300_000)
        # "Snapshot export started" gives way to the outcome once the job is done
        expect(page.locator("#banner")).to_contain_text("Snapshot exported: ", timeout=60_000)
        expect(page.locator("#quality-plot img")).to_be_visible(timeout=60_000)
        shot(page, "output-snapshot")

        # Stop while the evaluation runs: the run ends "stopped", not "failed". The demo's evaluation
        # takes a fraction of a second, so the stage is held inside its work (tests/gui/eval_hold) until
        # the stop has been requested
        project = Project.open(ctx.demo_root / "t5_adapter")
        stale = project.eval_json.stat().st_mtime - 60                 # eval.json older than the GGUF: eval reruns
        os.utime(project.eval_json, (stale, stale))
        fifo = tmp_path / "eval-hold"
        os.mkfifo(fifo)
        monkeypatch.setenv("GGUF_TEST_EVAL_HOLD", str(fifo))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            [str(EVAL_HOLD)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        page.get_by_role("tab", name="Train").click()
        page.locator("#train-start").click()
        with held_at(fifo, timeout=120):                               # the stage waits at its GGUF read
            expect(page.locator('#stage-strip [data-stage="eval"]')).to_have_attribute("data-status", "running",
                                                                                       timeout=120_000)
            page.locator("#train-stop").click()
            expect(page.locator("#banner")).to_contain_text("Stop requested", timeout=60_000)
        expect(page.locator("#train-status")).to_contain_text("stopped", timeout=120_000)
        # the "Stop requested" banner gives way to the outcome once the run has stopped
        expect(page.locator("#banner")).to_contain_text("The run stopped", timeout=60_000)
        assert project.read_state()["status"] == "stopped"
        assert project.read_state()["stages"]["eval"]["status"] == "stopped"


EVAL_HOLD = Path(__file__).resolve().parent / "eval_hold"


@contextlib.contextmanager
def held_at(fifo: Path, timeout: float):
    """Waits until a process opens `fifo` for reading (the held stage), keeps it waiting for the body,
    then releases it by closing the write end. A stage that never arrives fails the test after
    `timeout` s (the waiting open is then satisfied by a reader of our own)."""
    opened: dict[str, int] = {}
    waiter = threading.Thread(target=lambda: opened.setdefault("fd", os.open(fifo, os.O_WRONLY)), daemon=True)
    waiter.start()
    waiter.join(timeout)
    if "fd" not in opened:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))           # unblocks the waiting thread
        waiter.join()
        os.close(opened["fd"])
        pytest.fail(f"the evaluate stage did not reach its GGUF read within {timeout:.0f} s")
    try:
        yield
    finally:
        os.close(opened["fd"])


AT_BOTTOM = "t => t.scrollTop + t.clientHeight >= t.scrollHeight - 8"


def _tqdm_run(desc: str, total: int) -> str:
    """What a tqdm bar writes into a log file: one line of \\r-separated updates."""
    from tqdm import tqdm
    out = io.StringIO()
    for _ in tqdm(range(total), desc=desc, file=out, mininterval=0):
        pass
    return out.getvalue()


def test_logs_follow_the_newest_line_and_hardware_is_filled_on_opening(ctx, browser):
    from playwright.sync_api import expect
    project = Project.create(ctx.projects_root / "follow", "t5xxl_pixart")       # the page opens it (last project)
    log = project.pipeline_log
    log.parent.mkdir(parents=True, exist_ok=True)

    def append(first: int, last: int, extra: str = "") -> None:
        with open(log, "a", encoding="utf-8") as f:
            f.write("".join(f"[train] line {i:03d}\n" for i in range(first, last)) + extra)
    # a log longer than the box (28 lines), with raw tqdm bars in it
    append(0, 60, _tqdm_run("Loading weights", 20) + "Writing model shards: 45%|####5     | 9/20 [00:01<00:02, 5.2it/s]\n"
           "Writing model shards: 100%|##########| 20/20 [00:02<00:00, 5.2it/s]\n")
    busy = None
    ARTIFACTS.mkdir(exist_ok=True)
    app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.get_by_role("tab", name="Logs").click()
        box = page.locator("#log-text textarea")
        expect(box).to_have_value(re.compile(r"line 059\n.*Writing model shards: 100%", re.S), timeout=60_000)
        # the bars show their last state only
        text = box.input_value()
        assert text.count("Loading weights") == 1 and "Loading weights: 100%" in text
        assert text.count("Writing model shards") == 1 and "45%" not in text and "\r" not in text
        assert box.evaluate("t => t.scrollHeight > t.clientHeight + 100")       # longer than the box
        page.wait_for_function(f"({AT_BOTTOM})(document.querySelector('#log-text textarea'))", timeout=10_000)

        # the log grows: the newest line stays in view
        append(60, 120)
        expect(box).to_have_value(re.compile(r"line 119\n$"), timeout=30_000)
        page.wait_for_function(f"({AT_BOTTOM})(document.querySelector('#log-text textarea'))", timeout=10_000)
        shot(page, "logs-follow")

        # the user scrolls up: new lines no longer move the view
        box.hover()
        page.mouse.wheel(0, -100_000)
        page.wait_for_function("document.querySelector('#log-text textarea').scrollTop === 0", timeout=10_000)
        append(120, 130)
        expect(box).to_have_value(re.compile(r"line 129\n$"), timeout=30_000)
        top = box.evaluate("t => new Promise(r => requestAnimationFrame(() => requestAnimationFrame("
                           "() => r(t.scrollTop))))")
        assert top == 0
        # back at the bottom, it follows again
        page.mouse.wheel(0, 100_000)
        page.wait_for_function(f"({AT_BOTTOM})(document.querySelector('#log-text textarea'))", timeout=10_000)
        append(130, 160)
        expect(box).to_have_value(re.compile(r"line 159\n$"), timeout=30_000)
        page.wait_for_function(f"({AT_BOTTOM})(document.querySelector('#log-text textarea'))", timeout=10_000)

        # Hardware: filled on opening, no Refresh; the CPU load is the shared reading, not 0.0. A load it must
        # see, while it reads: a fifth of a core (a whole one was the other worker's, ~25 s of it), which ends by
        # itself too, should this test be killed before its cleanup
        busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 600\nwhile time.time() < end:"
                                 "\n    t = time.time() + 0.02\n    while time.time() < t: pass\n    time.sleep(0.08)"])
        page.get_by_role("tab", name="Hardware").click()
        table = page.locator("#hw-table table.gt-hardware")
        expect(table).to_contain_text("CPU load", timeout=60_000)
        expect(table).to_contain_text("transformers")
        # the attribute and the text of one rendering (the table refreshes itself: two reads could straddle one)
        pct, text = table.evaluate("t => [t.getAttribute('data-cpu-pct'), t.innerText]")
        shown = float(pct)
        assert 0.0 < shown <= 100.0
        assert re.search(rf"CPU load\s*{re.escape(str(shown))}%", text)
        assert cpu_load() > 0.0                  # the same function, from this thread, agrees the machine is busy
        busy.kill()
        busy.wait()
        shot(page, "hardware-on-open")

        # lines that arrived while Logs was hidden: opening it again shows the newest one
        append(160, 200)
        page.get_by_role("tab", name="Logs").click()
        expect(box).to_have_value(re.compile(r"line 199\n$"), timeout=30_000)
        page.wait_for_function(f"({AT_BOTTOM})(document.querySelector('#log-text textarea'))", timeout=10_000)

        # opening Hardware again shows it again (the last of the first opening's updates has the torch row)
        expect(table).not_to_contain_text("asking torch", timeout=120_000)
        shown_at = table.get_attribute("data-shown-at")
        page.get_by_role("tab", name="Hardware").click()
        expect(table).not_to_have_attribute("data-shown-at", shown_at, timeout=30_000)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        app.close()
