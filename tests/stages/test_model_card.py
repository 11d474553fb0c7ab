"""The model card the export, eval and snapshots write beside the GGUF (trainer_core/stages/model_card.py), read
back by huggingface_hub's own ModelCard. Every demo pack's card is checked by the conformance suite, in the test
that reads its cached run (tests/packs/test_conformance.py: card_reads_back); here, how the card follows the
evaluation, the snapshots, the teacher's licence and the mock teacher."""
from __future__ import annotations

import json
import os


import demo_cache
from trainer_core.project import Project


def _card(project: Project):
    from huggingface_hub import ModelCard
    return ModelCard.load(project.card_path())


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
