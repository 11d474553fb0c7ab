"""The model card the export, eval and snapshots write beside the GGUF (trainer_core/stages/model_card.py), read
back by huggingface_hub's own ModelCard, on every demo pack's cached run (tests/demo_cache.py: no new run)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import demo_cache
from trainer_core.packs import DEMO_PACKS
from trainer_core.project import Project


def _card(project: Project):
    from huggingface_hub import ModelCard
    return ModelCard.load(project.card_path())


@pytest.mark.parametrize("pack_id", DEMO_PACKS)
def test_every_demo_export_has_a_card_the_hub_reads_with_its_eval_figures(pack_id):
    project = Project.open(demo_cache.trained(pack_id))            # read only: the card the run's stages wrote
    text = project.card_path().read_text(encoding="utf-8")
    card = _card(project)
    data = card.data.to_dict()
    materials = {m.id: m.repo for m in project.pack.project_materials(project)}
    assert data["base_model"][0] == materials.get("teacher", project.pack.teacher_repo)
    assert materials["student_tokenizer"] in data["base_model"]
    assert {"gguf", "pig_clip", pack_id, "machinery-check"} <= set(data["tags"])
    # model-index holds this export's figures: eval.json's numbers, each under its own key
    record = json.loads(project.eval_json.read_text())
    assert Path(record["gguf"]).name == project.gguf_path().name
    results = card.data.eval_results
    assert results and {r.metric_type for r in results} >= set(project.pack.judge.keys() if project.pack.judge else ())
    for r in results:
        assert r.metric_value == record[r.metric_type]
    # the body: a demo says so first; the engine command names the GGUF by its name; the plot sits beside it
    assert card.text.lstrip().startswith("**Machinery check")
    command = text.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert project.gguf_path().name in command.split() and "/" not in command
    assert project.card_plot_path().read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"]({project.card_plot_path().name})" in text
    # nothing of this machine's folders
    for folder in (project.root, project.output_dir(), Path(os.environ.get("HOME", "/nonexistent"))):
        assert str(folder) not in text


def test_the_card_follows_the_evaluation_and_snapshots(tmp_path):
    """Rewritten in-process from a copy: before eval.json scored the GGUF the card has no figures; a snapshot is
    listed; a real (non-demo) project's card has no machinery line; the token is never in it."""
    from trainer_core.base import token_store
    from trainer_core.base.folder import DEMO_MARKER
    from trainer_core.stages.model_card import write_card
    root = demo_cache.copy_trained("t5xxl_pixart", tmp_path)
    project = Project.open(root)
    token_store.write_token(project.root, "hf_secret_card_token_123")
    (project.materials_dir / DEMO_MARKER).unlink()                  # no longer a demo
    gguf = project.gguf_path()
    os.utime(project.eval_json, (gguf.stat().st_mtime - 10,) * 2)   # eval.json older than the GGUF: stale
    write_card(project)
    card = _card(project)
    assert card.data.to_dict().get("model-index") is None and "not evaluated yet" in card.text
    assert "Machinery check" not in card.text
    os.utime(project.eval_json, (gguf.stat().st_mtime + 10,) * 2)
    (project.root / "snapshots.json").write_text(json.dumps({"snapshots": [
        {"step": 50, "checkpoint": "last", "val_cos": 0.25, "name": gguf.name.replace("-f16", "-step50-f16")}]}))
    teacher = project.materials_dir / next(m.subdir or m.repo.rsplit("/", 1)[-1]
                                           for m in project.pack.materials if m.id == "teacher")
    (teacher / "README.md").write_text("---\nlicense: apache-2.0\n---\n# the teacher\n")
    write_card(Project.open(root))
    text = project.card_path().read_text(encoding="utf-8")
    card = _card(project)
    assert card.data.eval_results and "| 50 | last | 0.2500 |" in text
    assert card.data.license == "apache-2.0"                          # as the teacher's own card states it
    assert "hf_secret_card_token_123" not in text
    # the mock teacher's synthetic targets: a machinery check again, its first line says why
    project.update_settings(["precompute.mock_teacher=true"])
    write_card(Project.open(root))
    assert _card(project).text.lstrip().startswith("**Machinery check") and "mock teacher" in _card(project).text
    # no final export, only the snapshot: the card describes the snapshot, with no figures of another file
    snapshot = gguf.with_name(gguf.name.replace("-f16", "-step50-f16"))
    gguf.rename(snapshot)
    write_card(Project.open(root))
    card = _card(project)
    assert card.text.count(f"# {snapshot.name}") == 1 and card.data.to_dict().get("model-index") is None
