"""In a real browser (as tests/gui/test_browser.py), on a trained demo given many more steps: the Output tab with
the pack's judging guide, then the Train tab running, stopped and resumed (screenshots of each, `shot`). What a
person sees along the way: each stage card says "done" once, the export and evaluation of the shorter training
are stale with why (issue 56 item 5), the chart's step labels never run into each other and its lines never go
blank, from the finished run through the live one (item 10), an action's banner gives
way to its outcome, a count applied while stopped is what the cards, the metrics and the note say before and after
the resume (item 4), and the kept steps' buttons wait for a kept step."""
from __future__ import annotations

import json
import re
import shutil

import demo_cache
from trainer_core.project import Project

from .test_browser import app_page, browser, labels_apart, shot  # noqa: F401 — the browser fixture

PACK = "t5xxl_pixart"
MANY_STEPS = 100_000            # the resumed training runs until it is stopped
APPLIED = 2 * MANY_STEPS        # applied while stopped, before the second resume

# every change of the steps note, the step metric and the train card, recorded in the page from the moment it is
# installed: what the page showed at any time, not only when the test looked
RECORD_JS = """() => { window.__seen = []; const text = s => { const e = document.querySelector(s);
  return e ? e.textContent.trim() : null; };
  const rec = () => { const row = [text('#steps-note'), text('#train-metrics [data-metric="step"]'),
    text('#stage-strip [data-stage="train"]')]; const last = window.__seen[window.__seen.length - 1];
    if (!last || last.join('|') !== row.join('|')) window.__seen.push(row); };
  rec(); const watch = new MutationObserver(rec);
  for (const id of ['#steps-note', '#train-metrics', '#stage-strip'])
    watch.observe(document.querySelector(id), {subtree: true, childList: true, characterData: true}); }"""

# what the loss chart shows, recorded in the page from the moment it is installed: each state that lasts to the
# next task or animation frame (one a frame can show) in which a line with points has no stroke colour (drawn as
# nothing: Gradio's plot colours only the series it built its view with), or no line has one once one had. The
# plot's rebuild on a new step axis empties its element and redraws it within one task: no frame shows that
CHART_JS = """() => { const r = window.__chart = {drawn: 0, blank: []};
  const look = when => { const chart = document.querySelector('#train-chart'); if (!chart) return;
    const lines = Array.from(chart.querySelectorAll('[aria-roledescription="line mark"]'))
      .map(m => m.matches('path') ? m : m.querySelector('path')).filter(p => p && p.getAttribute('d'));
    const coloured = lines.filter(p => (p.getAttribute('stroke') || 'none') !== 'none').length;
    if (coloured) r.drawn += 1;
    if ((r.drawn && !coloured) || coloured < lines.length)
      r.blank.push([when, Math.round(performance.now()), lines.length, coloured]); };
  const task = new MessageChannel(); task.port1.onmessage = () => look('task');
  new MutationObserver(() => task.port2.postMessage(0)).observe(document.body, {subtree: true, childList: true,
    attributes: true, attributeFilter: ['stroke', 'd']});
  const frame = () => { look('frame'); requestAnimationFrame(frame); }; requestAnimationFrame(frame); }"""


def _chart_drawn_throughout(page) -> None:
    """Since CHART_JS was installed, the chart has drawn its lines and never shown them blank."""
    seen = page.evaluate("() => window.__chart")
    assert seen["drawn"] and not seen["blank"], f"the chart went blank ([how, ms, lines, coloured]): {seen}"


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
    ctx.first_tab = "train"           # as `app.py --demo` opens: the chart is on the page before its points are
    with app_page(ctx, browser, tab="Train") as page:
        # the finished run's lines reach the chart after the page has built it empty: they are drawn in colour
        page.locator("#train-chart").wait_for()
        page.evaluate(CHART_JS)
        chart = page.locator('#train-chart [aria-roledescription="line mark"]')
        expect(chart.first).to_be_visible(timeout=60_000)
        page.wait_for_function("() => window.__chart.drawn || window.__chart.blank.length")
        _chart_drawn_throughout(page)
        page.get_by_role("tab", name="Output").click()
        guide = project.pack.judge
        expect(page.locator("#eval")).to_contain_text(f"Judge by `{guide.headline}`".replace("`", ""),
                                                      timeout=60_000)
        expect(page.locator("#eval")).to_contain_text("What good looks like")
        # the GGUF and its figures are of best.pt at the finished run's end: an earlier checkpoint than the run's
        exported = json.loads((project.checkpoints_dir / "best.json").read_text())["step"]
        why = f"from step {exported}; training goes on to {MANY_STEPS}"
        expect(page.locator("#eval")).to_contain_text(f"These figures are of an earlier export ({why})")
        expect(page.locator("#output-note")).to_contain_text(f"is from an earlier checkpoint ({why})")
        expect(page.locator("#kept-steps")).to_be_visible()
        assert not project.checkpoints_dir.joinpath("history").is_dir()       # no kept step: nothing to act on
        expect(page.locator("#kept-export")).to_be_disabled()
        expect(page.locator("#kept-delete")).to_be_disabled()
        shot(page, "output-guide")

        # the finished run: each card says "done" once, export and evaluation stale with why; the chart's end
        # labels stand apart
        page.get_by_role("tab", name="Train").click()
        strip = page.locator("#stage-strip")
        for stage in ("export", "eval"):
            expect(strip.locator(f'[data-stage="{stage}"]')).to_have_attribute("data-status", "stale", timeout=60_000)
            expect(strip.locator(f'[data-stage="{stage}"]')).to_contain_text(why)
        done = strip.locator('.gt-stage[data-status="done"]')
        assert done.count() >= 3                              # corpus and precompute at least (train has more to do)
        for card in done.all():
            assert card.inner_text().lower().count("done") == 1, card.inner_text()
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
        _chart_drawn_throughout(page)            # the finished run's lines, then each new point (issue 56 item 10)
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

        # a count applied while stopped: the banner, the card and the metrics say the checkpoint's step of it
        page.locator("#planned-steps").get_by_role("textbox").fill(f"{APPLIED / 1000:g}k")    # as the CLI reads it
        page.locator("#apply-steps").click()
        expect(page.locator("#banner")).to_contain_text(f"Saved {APPLIED}: press Start / Resume to continue from "
                                                        f"step {stopped_at}", timeout=60_000)
        expect(train).to_contain_text(f"{stopped_at}/{APPLIED} steps", timeout=60_000)
        expect(page.locator('#train-metrics [data-metric="step"]')).to_have_text(f"{stopped_at} / {APPLIED}")

        # resumed: from the stopped step on, towards the applied count; at no time (recorded in the page) does
        # the note, the metrics or the card take the stopped run's count for the live trainer's
        page.evaluate(RECORD_JS)
        _start(page, expect)
        expect(train).to_have_attribute("data-status", "running", timeout=120_000)
        _wait_past(page, stopped_at)
        expect(train).to_contain_text(f"/{APPLIED} steps", timeout=60_000)
        metric, card = page.evaluate("() => [document.querySelector('#train-metrics [data-metric=\"step\"]')"
                                     ".textContent, document.querySelector('#stage-strip [data-stage=\"train\"]')"
                                     ".textContent]")
        assert metric.endswith(f"/ {APPLIED}") and f"/{APPLIED} steps" in card, (metric, card)
        seen = page.evaluate("() => window.__seen")
        assert len(seen) > 1
        for note, step, card in seen:
            assert "trainer still on" not in (note or ""), seen
            assert f"/ {MANY_STEPS}" not in (step or "") and f"/{MANY_STEPS} " not in (card or ""), seen
        _chart_drawn_throughout(page)            # through the stop, the applied count and the resume
        labels_apart(page)
        shot(page, "train-resumed")
        page.locator("#train-stop").click()
        expect(page.locator("#banner")).to_contain_text("The run stopped at step", timeout=180_000)
    assert Project.open(project.root).read_state()["status"] == "stopped"
