"""The Setup tab's "Start from an adapter" field of the new-project form (issue 54, item 3)."""
from __future__ import annotations

from test_from_adapter import fresh_pixart_adapter, write_plain_gguf

from trainer_core.contract import checkpoints
from trainer_core.project import Project
from ui import setup_tab


def test_the_new_project_form_starts_from_an_adapter_file_and_refuses_another_kind(ctx, tmp_path):
    ctx.projects_root.mkdir(parents=True, exist_ok=True)
    theirs = write_plain_gguf(ctx.projects_root / "theirs.gguf", fresh_pixart_adapter(tmp_path))
    out = setup_tab.create_project(ctx, "mine", "t5xxl_pixart", str(ctx.projects_root), None, str(theirs))
    project = Project.open(out[0])
    assert checkpoints.start_path(project).read_bytes() == theirs.read_bytes()
    assert f"Training starts from {theirs}" in out[1] and "train.width=64" in out[1]
    assert f"training starts from `{theirs}" in out[2]

    refused = setup_tab.create_project(ctx, "other", "qwen3vl_flux3", str(ctx.projects_root), out[0], str(theirs))
    assert refused[0] == out[0]                       # the open project stays open
    assert "has kind seeded_resampler" in refused[1] and "token_aligned_layerwise" in refused[1]
    assert not (ctx.projects_root / "other").exists()
