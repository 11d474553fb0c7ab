"""How an evaluation is presented (issue: a bare metric list says nothing of what is good): every pack declares
the metric to judge by and the published reference figures (`TrainerPack.judge`, packs/eval_guide.py), and
`gguf-trainer status` and the eval stage's summary lead with them, marking a mock-teacher run as a machinery
check. The Output tab's panel is tested in tests/gui/test_eval_panel.py."""
from __future__ import annotations

import json

import pytest

import demo_cache
from conftest import cli
from trainer_core.base.events import ListReport
from trainer_core.packs import DEMO_PACKS, PACKS
from trainer_core.materials import DEMO_MARKER
from trainer_core.packs.eval_guide import DEMO_NOTE, MOCK_NOTE, NO_FIGURE, EvalGuide, eval_lines, machinery_note
from trainer_core.project import Project

PUBLISHED = "gguf-trainer 0.0.14's pack hint (the published package, PyPI)"

# the published figures (gguf-trainer 0.0.14's pack hints), as the guides must quote them
FIGURES = {
    "llada_image": {"cos_centered": "0.965", "rel_mse": "0.0024"},
    "qwen3vl_mageflow": {"cos": "0.915", "cos_vis": "0.80", "cos_txt": "0.98"},
    "t5xxl_pixart": {"cos": "0.80–0.83"},
    "qwen3vl_krea2": {"cos": "0.948"},
}


@pytest.mark.parametrize("pack_id", list(PACKS))
def test_every_pack_declares_what_to_judge_and_its_figures(pack_id):
    pack = PACKS[pack_id]
    guide = pack.judge
    assert isinstance(guide, EvalGuide), f"{pack_id} declares no judge"
    assert set(guide.keys()) <= set(pack.metric_names)
    assert dict(guide.references) == FIGURES.get(pack_id, {})
    assert guide.good and guide.source
    if not guide.references:                     # says plainly that none is published
        assert guide.source.startswith("none") and "published" in guide.source
    else:                                         # and where a user can read a figure that is
        assert PUBLISHED in guide.source


@pytest.mark.parametrize("pack_id", DEMO_PACKS)
def test_the_judged_metric_is_in_the_demo_eval_json(pack_id):
    """The eval.json the pack's own pipeline writes holds the headline and every figure's metric as numbers."""
    ev = json.loads(Project.open(demo_cache.trained(pack_id)).eval_json.read_text())
    guide = PACKS[pack_id].judge
    for key in (guide.headline, *(k for k, _ in guide.references)):
        assert isinstance(ev.get(key), float), (pack_id, key, sorted(ev))


def test_lines_put_the_figure_beside_the_value_and_say_when_there_is_none():
    mageflow, qwenimage = PACKS["qwen3vl_mageflow"].judge, PACKS["qwen3vl_qwenimage"].judge
    lines = mageflow.lines({"cos_slice": 0.9, "cos_vis": 0.7, "cos": 0.85}, mock=False)
    assert lines[:4] == ["judge by cos_slice 0.90000", "cos_vis 0.70000 (reference 0.80)",
                         "cos_txt not in this eval (reference 0.98)", "cos 0.85000 (reference 0.915)"]
    assert lines[-1].startswith(f"source: {PUBLISHED}") and MOCK_NOTE not in " ".join(lines)
    lines = qwenimage.lines({"cos_slice": 0.5}, mock=True)
    assert lines[0].startswith(MOCK_NOTE) and lines[1] == f"judge by cos_slice 0.50000 ({NO_FIGURE})"
    assert eval_lines(None, {"cos": 0.5, "time": 1e9}, ["cos"], True) == [machinery_note(True), "cos 0.50000"]
    assert machinery_note(False, True).startswith(DEMO_NOTE) and machinery_note(False) is None


def test_status_leads_with_the_judged_metric_and_marks_the_mock_llada_run(tmp_path):
    """LLaDA's demo runs on the mock teacher: its status says so before the reference figures."""
    root = demo_cache.copy_trained("llada_image", tmp_path)
    ev = json.loads(Project.open(root).eval_json.read_text())
    r = cli("status", "--project", str(root))
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("eval:")]
    assert lines[0] == f"eval: {MOCK_NOTE} (synthetic targets: these numbers say nothing about quality)"
    assert lines[1] == f"eval: judge by cos_centered {ev['cos_centered']:.5f} (reference 0.965)"
    assert lines[2] == f"eval: rel_mse {ev['rel_mse']:.5f} (reference 0.0024)"
    assert lines[-1].startswith("eval: others: cos_rms ") and "cos_centered" not in lines[-1]
    report = json.loads(cli("status", "--project", str(root), "--json").stdout)
    assert report["eval_mock"] is True and report["eval_guide"]["headline"] == "cos_centered"

    # switched to the real teacher, the evaluation on disk is still the mock's: its val shards say so
    Project.open(root).update_settings(["precompute.mock_teacher=false"])
    assert MOCK_NOTE in cli("status", "--project", str(root)).stdout


def test_status_of_a_real_teacher_run_shows_the_figure_and_no_mock_marker(tmp_path):
    """PixArt's demo runs a tiny real T5 teacher: no mock marker, but the demo's; without the demo marker (a
    user's own project) neither."""
    root = demo_cache.copy_trained("t5xxl_pixart", tmp_path)
    project = Project.open(root)
    ev = json.loads(project.eval_json.read_text())
    out = cli("status", "--project", str(root)).stdout
    assert f"  eval: {machinery_note(False, True)}\n  eval: judge by cos {ev['cos']:.5f} (reference 0.80–0.83)\n" in out
    assert "mock teacher" not in out and f"eval: source: {PUBLISHED}" in out
    assert "{" not in out and "  checkpoint best: step " in out          # a table, not JSON (issue 56 item 9)
    (project.materials_dir / DEMO_MARKER).unlink()
    out = cli("status", "--project", str(root)).stdout
    assert "machinery check" not in out
    assert [line for line in out.splitlines() if "eval: " in line][0] == \
        f"  eval: judge by cos {ev['cos']:.5f} (reference 0.80–0.83)"


def test_the_eval_stage_summary_leads_with_the_judged_metric(tmp_path):
    from trainer_core.stages import evaluate
    for pack_id, mock, figure in (("llada_image", True, "(reference 0.965)"), ("t5xxl_pixart", False,
                                                                                "(reference 0.80–0.83)")):
        project = Project.open(demo_cache.copy_trained(pack_id, tmp_path / pack_id))
        report = ListReport()
        assert evaluate.run(project, report) == "done"
        (line,) = [e["message"] for e in report.of_type("log") if e["message"].startswith("evaluation of")]
        head = line.split(": ", 1)[1]
        headline = PACKS[pack_id].judge.headline
        assert head.startswith(f"{MOCK_NOTE} — judge by {headline} ") if mock else \
            head.startswith(f"judge by {headline} ")
        assert figure in head and "; all: " in head
