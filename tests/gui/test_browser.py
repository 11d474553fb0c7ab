"""A real browser (Playwright driving Debian's chromium, which `.ci/run` installs) opens the
app, runs the demo from its button, and waits for the Output tab to list the exported GGUF.
Screenshots of every tab land in tests/artifacts/ (git-ignored) for CI to keep."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from trainer_core.project import Project
from ui.app import serve

from .conftest import free_port

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
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


def test_the_demo_runs_from_its_button_and_the_output_tab_lists_the_gguf(ctx, browser):
    from playwright.sync_api import expect
    ARTIFACTS.mkdir(exist_ok=True)
    app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.get_by_role("tab", name="Setup").wait_for()
        page.locator("#demo-btn").click()
        expect(page.locator("#banner")).to_contain_text("Demo started", timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / "setup.png"), full_page=True)

        page.get_by_role("tab", name="Train").click()
        expect(page.locator("#train-metrics")).to_contain_text("loss", timeout=60_000)
        expect(page.locator('#stage-strip [data-stage="train"]')).to_have_attribute(
            "data-status", "done", timeout=400_000)
        page.screenshot(path=str(ARTIFACTS / "train-running.png"), full_page=True)

        gguf = Project.open(ctx.demo_root / "t5_adapter").gguf_path().name
        page.get_by_role("tab", name="Output").click()
        expect(page.locator("#output-files")).to_contain_text(gguf, timeout=300_000)
        expect(page.locator("#ggk-command textarea")).to_have_value(
            re.compile(r"--llm-adapter .*" + re.escape(gguf)), timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "output.png"), full_page=True)

        # back on Train once the run is over: the chart holds its three series (Vega's SVG line
        # marks) and their legend
        page.get_by_role("tab", name="Train").click()
        expect(page.locator("#train-status")).to_contain_text("done", timeout=120_000)
        expect(page.locator('#train-chart [aria-roledescription="line mark"]')).to_have_count(3, timeout=30_000)
        expect(page.locator("#train-chart").get_by_text("val_cos")).to_be_visible(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "train.png"), full_page=True)

        page.get_by_role("tab", name="Logs").click()
        expect(page.locator("#log-text textarea")).to_have_value(re.compile(r"\[train\]"),
                                                               timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "logs.png"), full_page=True)

        page.get_by_role("tab", name="Hardware").click()
        page.locator("#hw-refresh").click()
        expect(page.locator("#hw-table")).to_contain_text("transformers", timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / "hardware.png"), full_page=True)
    finally:
        app.close()
