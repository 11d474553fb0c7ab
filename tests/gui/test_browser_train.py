"""In a real browser (as tests/gui/test_browser.py), on a trained demo given many more steps: the Output tab with
the pack's judging guide, then the Train tab running, stopped and resumed (screenshots of each, `shot`). What a
person sees along the way: each stage card says "done" once, the chart's step labels never run into each other,
an action's banner gives way to its outcome, and the kept steps' buttons wait for a kept step."""
from __future__ import annotations

import re
import shutil

import demo_cache
from trainer_core.project import Project

from .test_browser import app_page, browser, labels_apart, shot  # noqa: F401 — the browser fixture

PACK = "t5xxl_pixart"
MANY_STEPS = 100_000            # the resumed training runs until it is stopped

def _start(page, expect) -> None:
    """Start / Resume on the Train tab, through the plan's warning if it has one."""
    page.locator("#train-start").click()
    banner = page.locator("#banner")
    expect(banner).to_contain_text(re.compile("Pipeline started|The plan warns"), timeout=60_000)
    if "The plan warns" in banner.inner_text():
        page.locator("#train-start-anyway").click()
        expect(banner).to_contain_text("Pipeline started", timeout=60_000)


def _wait_past(page, step: int) -> None:
    """Until the Train tab's step metric reads more than `step`."""
    page.wait_for_function("() => { const m = document.querySelector('#train-metrics [data-metric=\"step\"]');"
                           f" return m && parseInt(m.textContent) > {step}; }}", timeout=180_000)


def _step(page) -> int:
    return int(page.locator('#train-metrics [data-metric="step"]').inner_text().split("/")[0])


def test_train_running_stopped_resumed_and_the_output_guide(ctx, browser):  # noqa: F811
    from playwright.sync_api import expect
    source = demo_cache.trained(PACK)
    shutil.copytree(source.parent, ctx.demo_root, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".complete"))
    project = Project.open(ctx.demo_root / source.name)
    project.update_settings([f"train.steps={MANY_STEPS}"])
    ctx.remember_project(project.root)                   # the app's own project: every page load shows it
    with app_page(ctx, browser, tab="Output") as page:
        page.get_by_role("tab", name="Output").click()
        guide = project.pack.judge
        expect(page.locator("#eval")).to_contain_text(f"Judge by `{guide.headline}`".replace("`", ""),
                                                      timeout=60_000)
        expect(page.locator("#eval")).to_contain_text("What good looks like")
        expect(page.locator("#kept-steps")).to_be_visible()
        assert not project.checkpoints_dir.joinpath("history").is_dir()       # no kept step: nothing to act on
        expect(page.locator("#kept-export")).to_be_disabled()
        expect(page.locator("#kept-delete")).to_be_disabled()
        shot(page, "output-guide")

        # the finished run: each card says "done" once; the chart's end labels stand apart
        page.get_by_role("tab", name="Train").click()
        strip = page.locator("#stage-strip")
        expect(strip.locator('[data-stage="eval"]')).to_have_attribute("data-status", "done", timeout=60_000)
        done = strip.locator('.gt-stage[data-status="done"]')
        assert done.count() >= 3                              # corpus and precompute at least (train has more to do)
        for card in done.all():
            assert card.inner_text().lower().count("done") == 1, card.inner_text()
        chart = page.locator('#train-chart [aria-roledescription="line mark"]')
        expect(chart.first).to_be_visible(timeout=60_000)
        labels_apart(page)

        # running: training resumes from its checkpoint towards the new count
        _start(page, expect)
        train = strip.locator('[data-stage="train"]')
        expect(train).to_have_attribute("data-status", "running", timeout=120_000)
        expect(page.locator('#train-metrics [data-metric="step"]')).to_contain_text(f"/ {MANY_STEPS}",
                                                                                     timeout=120_000)
        expect(page.locator("#banner")).to_contain_text("Pipeline started")     # it stays while the run goes on
        _wait_past(page, demo_cache.STEPS + 20)
        labels_apart(page)
        shot(page, "train-running")

        # stopped: the banner gives way to the outcome, the step is the checkpoint's
        page.locator("#train-stop").click()
        # the click's answer, unless the run has already stopped and its outcome took the banner
        expect(page.locator("#banner")).to_contain_text(re.compile("Stop requested|The run stopped at step"),
                                                        timeout=30_000)
        expect(page.locator("#train-status")).to_contain_text("status stopped", timeout=120_000)
        expect(page.locator("#banner")).to_contain_text("The run stopped at step", timeout=60_000)
        expect(train).to_have_attribute("data-status", "stopped")
        stopped_at = _step(page)
        assert stopped_at > demo_cache.STEPS
        assert f"step {stopped_at}" in page.locator("#banner").inner_text()
        expect(train).to_contain_text(f"{stopped_at}/{MANY_STEPS} steps")        # the card agrees, with no ETA
        assert "ETA" not in train.inner_text()
        expect(page.locator("#train-start")).to_be_visible()
        labels_apart(page)
        shot(page, "train-stopped")

        # resumed: from the stopped step on
        _start(page, expect)
        expect(train).to_have_attribute("data-status", "running", timeout=120_000)
        _wait_past(page, stopped_at)
        labels_apart(page)
        shot(page, "train-resumed")
        page.locator("#train-stop").click()
        expect(page.locator("#banner")).to_contain_text("The run stopped at step", timeout=180_000)
    assert Project.open(project.root).read_state()["status"] == "stopped"
