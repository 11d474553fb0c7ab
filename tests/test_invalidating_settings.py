"""Issue 18, item 2: a setting that makes a project's shards stale (the pack, the teacher, the
student, synthetic targets) is refused while shards or checkpoints exist, saying what would be
lost; --force moves that work aside and says where."""
from __future__ import annotations

import json

from trainer_core.project import Project


def _with_work(tmp_path):
    project = Project.create(tmp_path / "p", "llada_image")
    (project.shards_dir("val")).mkdir(parents=True)
    (project.shards_dir("val") / "val-00000.safetensors").write_bytes(b"shard")
    project.checkpoints_dir.mkdir()
    (project.checkpoints_dir / "last.json").write_text(json.dumps({"step": 200, "planned_steps": 300}))
    return project


def test_a_pack_change_is_refused_and_nothing_changes(tmp_path, run_cli):
    project = _with_work(tmp_path)
    r = run_cli("set", "--project", str(project.root), "--set", "pack=t5xxl_pixart")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "pack (llada_image → t5xxl_pixart)" in r.stderr and "1 precomputed shard(s)" in r.stderr
    assert "checkpoints" in r.stderr and "--force" in r.stderr
    assert Project.open(project.root).settings.pack == "llada_image"
    assert (project.shards_dir("val") / "val-00000.safetensors").is_file() and project.checkpoints_dir.is_dir()


def test_force_moves_the_work_aside_and_says_where(tmp_path, run_cli):
    project = _with_work(tmp_path)
    r = run_cli("set", "--project", str(project.root), "--force", "--set", "precompute.mock_teacher=true")
    assert r.returncode == 0, r.stderr
    (shards,) = project.root.glob("shards.stale-*")
    (ckpt,) = project.root.glob("checkpoints.stale-*")
    assert (shards / "val" / "val-00000.safetensors").read_bytes() == b"shard" and (ckpt / "last.json").is_file()
    assert str(shards) in r.stdout and str(ckpt) in r.stdout
    assert Project.open(project.root).settings.precompute.mock_teacher is True


def test_other_settings_and_empty_projects_need_no_force(tmp_path, run_cli):
    project = _with_work(tmp_path)
    assert run_cli("set", "--project", str(project.root), "--set", "train.lr=0.001").returncode == 0
    fresh = Project.create(tmp_path / "fresh", "llada_image")
    assert run_cli("set", "--project", str(fresh.root), "--set", "pack=t5xxl_pixart").returncode == 0
    assert Project.open(fresh.root).settings.pack == "t5xxl_pixart"


def test_the_gui_save_says_what_would_be_lost(tmp_path):
    project = _with_work(tmp_path)
    stale, work = project.work_at_risk([f"materials.student.path={tmp_path / 'other.gguf'}"])
    assert stale and stale[0].startswith("materials.student.path") and len(work) == 2
    assert project.work_at_risk(["train.steps=500"]) == ([], work)


def test_the_setup_tab_refuses_the_save_and_keeps_the_work(tmp_path):
    from ui import setup_tab
    from ui.app import make_context
    from ui.settings_form import FIELDS
    ctx = make_context(tmp_path / "projects", demo_root=tmp_path / "demo", tick_s=0.3)
    try:
        out = setup_tab.create_project(ctx, "mine", "t5xxl_pixart", str(ctx.projects_root))
        project = Project.open(out[0])
        project.shards_dir("train").mkdir(parents=True)
        (project.shards_dir("train") / "train-00000.safetensors").write_bytes(b"shard")
        keys = [f.key for f in FIELDS]
        values = [u["value"] for u in out[3:3 + len(FIELDS)]]
        values[keys.index("precompute.mock_teacher")] = not values[keys.index("precompute.mock_teacher")]
        before = project.project_json.read_bytes()
        saved = setup_tab.save_settings(ctx, out[0], "", *values)
        assert "Not saved" in saved[1] and "precompute.mock_teacher" in saved[1] and "--force" in saved[1]
        assert project.project_json.read_bytes() == before
        assert (project.shards_dir("train") / "train-00000.safetensors").is_file()
    finally:
        ctx.supervisor.close()
