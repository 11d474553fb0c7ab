"""The Output tab's evaluation panel leads with the pack's judged metric and its published figure, then the
rest; a mock-teacher run is marked as a machinery check (tests/test_eval_guide.py covers the CLI side)."""
from __future__ import annotations

import json

import demo_cache
from trainer_core.packs import PACKS
from trainer_core.materials import DEMO_MARKER
from trainer_core.packs.eval_guide import DEMO_NOTE, MOCK_NOTE, NO_FIGURE
from trainer_core.project import Project
from ui import output_tab
from ui.common import fmt_num


def _panel(ctx, pack_id: str, demo: bool = True) -> tuple[str, dict]:
    root = demo_cache.copy_trained(pack_id, ctx.projects_root / (pack_id if demo else f"{pack_id}-own"))
    if not demo:                                  # as a user's own project: no demo marker
        (Project.open(root).materials_dir / DEMO_MARKER).unlink()
    ctx.supervisor.attach(root).refresh(force=True)
    eval_md = output_tab.output_tick(ctx, str(root))[2]
    return eval_md, json.loads(Project.open(root).eval_json.read_text())


def test_the_mock_llada_run_is_marked_and_led_by_its_judged_metric(ctx):
    eval_md, ev = _panel(ctx, "llada_image")
    first, judged = eval_md.split("\n\n")[:2]
    assert MOCK_NOTE in first.lower() and "machinery check, not a score" in first
    assert judged == f"**Judge by `cos_centered`: {fmt_num(ev['cos_centered'])}** · reference **0.965**"
    assert f"- `rel_mse`: {fmt_num(ev['rel_mse'])} · reference 0.0024" in eval_md
    assert "gguf-trainer 0.0.14's pack hint" in eval_md and "RTX 5090" in eval_md
    rest = eval_md.split("**Other metrics**", 1)[1]
    assert "**cos_rms**" in rest and "cos_centered" not in rest          # each metric once, the judged one first


def test_a_real_teacher_run_shows_its_figure_and_no_mock_marker(ctx):
    eval_md, ev = _panel(ctx, "t5xxl_pixart")                 # the demo's tiny real T5: marked as a demo
    first, judged = eval_md.split("\n\n")[:2]
    assert DEMO_NOTE in first.lower() and "mock teacher" not in eval_md.lower()
    assert judged == f"**Judge by `cos`: {fmt_num(ev['cos'])}** · reference **0.80–0.83**"
    eval_md, ev = _panel(ctx, "t5xxl_pixart", demo=False)
    assert eval_md.startswith(f"**Judge by `cos`: {fmt_num(ev['cos'])}** · reference **0.80–0.83**")
    assert "machinery check" not in eval_md


def test_a_pack_without_a_published_figure_says_so():
    guide = PACKS["qwen3vl_qwenimage"].judge
    md = output_tab.eval_markdown({"eval": {"cos_slice": 0.5, "cos_edit": 0.4, "cos": 0.45},
                                   "metric_names": list(PACKS["qwen3vl_qwenimage"].metric_names)}, guide)
    assert md.startswith(f"**Judge by `cos_slice`: 0.5000** · {NO_FIGURE}")
    assert "no reference run of Qwen-Image 2.1 with an adapter is published" in md and "**cos**: 0.4500" in md
