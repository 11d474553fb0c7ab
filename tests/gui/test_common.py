"""The tabs' shared formatting: the stage strip's cards."""
from __future__ import annotations

import re

from ui.common import banner, stage_strip_html


def _card_texts(strip: str, stage: str) -> list[str]:
    """The visible texts of one stage's card (its title, status and progress lines)."""
    card = re.search(rf'<div class="gt-stage" data-stage="{stage}"[^>]*>(.*?)</div></div>', strip).group(1)
    return [t for t in re.findall(r">([^<]*)<", card + "<") if t.strip()]


def test_a_done_stage_says_done_once_and_a_running_one_its_progress():
    report = {"status": "running", "stages": [
        {"name": "corpus", "title": "Corpus", "status": "done"},
        {"name": "train", "title": "Train", "status": "running"}]}
    strip = stage_strip_html(report, {"train": {"count": 40, "total": 200, "unit": "steps", "eta_s": 75}})
    assert _card_texts(strip, "corpus") == ["Corpus", "done"]
    assert _card_texts(strip, "train") == ["Train", "running", "40/200 steps · ETA 1m 15s"]


def test_a_stopped_stage_shows_its_count_without_an_eta():
    """A stopped stage has no time left to run: its count and total as the report gives them (for train: the
    checkpoint's step of the saved count, tests/test_status.py), with no ETA."""
    stage = {"name": "train", "title": "Train", "status": "stopped", "count": 138, "total": 400, "unit": "steps",
             "eta_s": 9300}
    report = {"status": "stopped", "stages": [stage], "checkpoints": {"last": {"step": 138}}}
    assert _card_texts(stage_strip_html(report, {}), "train") == ["Train", "stopped", "138/400 steps"]


def test_a_waiting_banner_says_what_it_waits_for_and_others_do_not():
    assert 'data-wait="run"' in banner("Pipeline started (pid 7)", "ok", wait="run")
    marked = banner("Snapshot export started (pid 42)", "ok", wait="snapshot", pid=42)
    assert 'data-wait="snapshot"' in marked and 'data-pid="42"' in marked
    assert "data-wait" not in banner("Saved 3 setting(s).", "ok")
