"""Each tab's handlers, called directly (no browser, no server)."""
from __future__ import annotations

import json

import gradio as gr

from trainer_core.project import Project
from ui import hardware_tab, logs_tab, materials_panel, output_tab, setup_tab, train_tab
from ui.settings_form import FIELDS

KEYS = [f.key for f in FIELDS]


def _create(ctx, name="mine"):
    out = setup_tab.create_project(ctx, name, "t5xxl_pixart", str(ctx.projects_root))
    assert out[0] == str(ctx.projects_root / name), out[1]
    return out


def _values(out):
    return [u["value"] for u in out[3:3 + len(FIELDS)]]


# ------------------------------------------------------------ Setup

def test_create_fills_the_form_with_the_pack_defaults(ctx):
    out = _create(ctx)
    values = dict(zip(KEYS, _values(out)))
    project = Project.open(ctx.projects_root / "mine")
    assert values["train.steps"] == str(project.settings.train.steps)
    assert values["train.width"] == str(project.settings.train.width)
    assert values["precompute.mock_teacher"] is project.settings.precompute.mock_teacher
    assert "Created" in out[1]
    again = setup_tab.create_project(ctx, "mine", "t5xxl_pixart", str(ctx.projects_root))
    assert again[0] is None and "already" in again[1]


def test_create_outside_the_roots_or_with_a_slash_is_refused(ctx, tmp_path):
    out = setup_tab.create_project(ctx, "x", "t5xxl_pixart", "/etc")
    assert out[0] is None and "outside the folders" in out[1]
    out = setup_tab.create_project(ctx, "../escape", "t5xxl_pixart", str(ctx.projects_root))
    assert out[0] is None and "without slashes" in out[1]
    assert not (tmp_path / "escape").exists()


def test_save_lists_every_problem_on_its_field_and_writes_nothing(ctx):
    out = _create(ctx)
    project = Project.open(out[0])
    before = project.project_json.read_bytes()
    values = _values(out)
    values[KEYS.index("train.width")] = "100"
    values[KEYS.index("corpus.min_chars")] = "lots"
    saved = setup_tab.save_settings(ctx, out[0], "", *values)
    assert "Not saved" in saved[1] and "train.width" in saved[1] and "corpus.min_chars" in saved[1]
    infos = {k: u.get("info") or "" for k, u in zip(KEYS, saved[3:3 + len(FIELDS)])}
    assert infos["train.width"].startswith("⚠") and infos["corpus.min_chars"].startswith("⚠")
    assert not infos["train.depth"].startswith("⚠")
    assert saved[3 + KEYS.index("train.width")]["value"] == "100"       # what the user typed stays
    assert project.project_json.read_bytes() == before


def test_save_writes_the_changes_and_the_token_never_comes_back(ctx):
    out = _create(ctx)
    values = _values(out)
    values[KEYS.index("train.steps")] = "12k"
    values[KEYS.index("precompute.mock_teacher")] = True
    saved = setup_tab.save_settings(ctx, out[0], "hf_secretTOKEN123", *values)
    assert "Saved 3 setting(s)" in saved[1]
    project = Project.open(out[0])
    assert project.settings.train.steps == 12000 and project.settings.precompute.mock_teacher
    assert project.settings.hf_token == "hf_secretTOKEN123"
    token_file = project.root / ".hf_token"                       # readable only by the user, not in project.json
    assert token_file.stat().st_mode & 0o777 == 0o600 and "hf_secretTOKEN123" in token_file.read_text()
    assert "hf_secretTOKEN123" not in project.project_json.read_text()
    assert "hf_secretTOKEN123" not in json.dumps(saved, default=str)
    assert saved[-1]["value"] == "" and "hidden" in saved[-1]["placeholder"]
    reopened = setup_tab.open_project(ctx, out[0])
    assert "hf_secretTOKEN123" not in json.dumps(reopened, default=str)


def test_materials_and_disk_estimate(ctx):
    out = _create(ctx)
    project = Project.open(out[0])
    from trainer_core.materials import all_statuses
    rows = materials_panel.rows(all_statuses(project, online=False))
    assert [r[2] for r in rows] == ["missing"] * len(project.pack.materials)
    assert set(setup_tab.missing_required(project)) == {m.title for m in project.pack.materials if m.required}
    message, anyway = setup_tab.start_run(ctx, out[0])
    assert "Not started: this run needs" in message and "gguf-trainer download" in message
    assert anyway["visible"] is True
    assert "Shards on disk" in setup_tab.disk_estimate(project)


def test_a_ready_materials_progress_says_it_is_complete_not_its_size(ctx):
    project = Project.open(_create(ctx)[0])
    student = project.root / "student.gguf"
    student.write_bytes(b"GGUF" + bytes(3000))
    project.update_settings([f"materials.student.path={student}"])
    from trainer_core.materials import all_statuses
    by_id = {st.id: st for st in all_statuses(Project.open(project.root), online=False)}
    assert by_id["student"].status == "ready" and by_id["student"].bytes_done == 3004
    row = materials_panel.rows([by_id["student"]])[0]
    assert row[2] == "ready" and row[3] == "✓ complete" and "KB" not in " ".join(row)


def test_browse_handler_refuses_etc_and_lists_projects(ctx):
    _create(ctx)
    shown, entries, message = setup_tab.browse(ctx, "/etc", "dir")
    assert "outside the folders" in message and entries["choices"] == []
    shown, entries, message = setup_tab.browse(ctx, str(ctx.projects_root), "dir")
    assert message == "" and any("[project]" in label for label, _ in entries["choices"])


# ------------------------------------------------------------ Train

def test_apply_steps_validates_and_explains(ctx):
    out = _create(ctx)
    message, _ = train_tab.apply_steps(ctx, out[0], "abc")
    assert "positive whole number" in message
    message, _ = train_tab.apply_steps(ctx, out[0], -5)
    assert "positive whole number" in message
    message, box = train_tab.apply_steps(ctx, out[0], "40000")
    assert "Saved 40000" in message and box["value"] == "40000"
    assert Project.open(out[0]).settings.train.steps == 40000
    message, _ = train_tab.apply_steps(ctx, out[0], "40k")         # as the CLI's --steps takes it (issue 56)
    assert "already 40000" in message
    message, box = train_tab.apply_steps(ctx, out[0], " 1.5k ")
    assert "Saved 1500" in message and box["value"] == "1500"
    message, _ = train_tab.apply_steps(ctx, out[0], "12q")
    assert message.count("Planned steps must be a positive whole number such as 12000 or 12k, got “12q”") == 1


def test_reset_preview_lists_what_goes_and_confirm_deletes_it(ctx):
    out = _create(ctx)
    project = Project.open(out[0])
    (project.checkpoints_dir).mkdir(parents=True)
    (project.checkpoints_dir / "last.pt").write_bytes(b"x")
    listing, confirm = train_tab.preview_reset(out[0], "train")
    assert str(project.checkpoints_dir) in listing and confirm["visible"] is True
    message, _ = train_tab.confirm_reset(ctx, out[0], "train")
    assert "deleted 1 item" in message and not project.checkpoints_dir.exists()


def test_tick_without_a_project_is_harmless_and_with_one_shows_stages(ctx):
    out = train_tab.train_tick(ctx, None, -1)
    assert out[0] == "No project open"
    created = _create(ctx)
    tick = train_tab.train_tick(ctx, created[0], -1)
    assert 'data-stage="corpus"' in tick[1] and 'data-stage="eval"' in tick[1]
    assert tick[7] == 0            # chart version seen


def test_snapshot_without_a_checkpoint_is_refused(ctx):
    out = _create(ctx)
    assert "no checkpoint" in train_tab.request_snapshot(ctx, out[0], "last", False)


# ------------------------------------------------------------ Logs, Hardware, Output

def test_the_log_view_starts_with_the_tail_of_a_big_log_at_a_line_boundary(ctx):
    out = _create(ctx)
    project = Project.open(out[0])
    lines = [f"line {i:07d} " + "x" * 80 + "\n" for i in range(40_000)]            # ~3.6 MB
    project.pipeline_log.write_text("".join(lines), encoding="utf-8")
    view = ctx.supervisor.attach(project.root)
    view.refresh(force=True)
    text, path, seen = logs_tab.log_tick(ctx, out[0], True, -1, 0)
    assert len(text.encode()) <= 256 * 1024 and text.startswith("line ") and text.endswith(lines[-1])
    with open(project.pipeline_log, "a", encoding="utf-8") as f:
        f.write("appended line\n")
    view.refresh()
    text2, _, seen2 = logs_tab.log_tick(ctx, out[0], True, seen, 0)
    assert text2.endswith("appended line\n") and seen2 > seen
    assert isinstance(logs_tab.log_tick(ctx, out[0], True, seen2, 0)[0], type(gr.skip()))
    cleared = view.snapshot()["log_total"]
    with open(project.pipeline_log, "a", encoding="utf-8") as f:
        f.write("after clear\n")
    view.refresh()
    assert logs_tab.log_tick(ctx, out[0], True, seen2, cleared)[0] == "after clear\n"


def test_hardware_report_names_the_versions(ctx):
    html = hardware_tab.hardware_report(ctx, None, ask_torch=False)
    assert "gradio" in html and gr.__version__ in html and "RAM" in html
    assert ("none detected" in html) or ("GPU 0" in html)


def test_output_lists_exports_evaluation_and_the_command(ctx):
    out = _create(ctx)
    project = Project.open(out[0])
    gguf = project.gguf_path()
    gguf.parent.mkdir(parents=True, exist_ok=True)
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    project.eval_json.write_text(json.dumps({"cos": 0.875, "rel_mse": 0.25, "note": "x"}))
    ctx.supervisor.attach(project.root).refresh(force=True)
    files, note, eval_md, snaps, quality, kept, pick, command, _, export_btn, delete_btn = \
        output_tab.output_tick(ctx, out[0])
    assert files[0][0] == gguf.name and "104 B" in files[0][1]
    assert "0.8750" in eval_md and "0.2500" in eval_md
    assert "--llm-adapter" in command and str(gguf) in command
    assert snaps == [] and kept == []
    assert export_btn["interactive"] is False and delete_btn["interactive"] is False     # nothing to act on
    assert "no kept step" in output_tab.delete_kept_step(ctx, out[0], "step5").lower()
    assert "best.pt" in output_tab.export_again(ctx, out[0])


def test_the_kept_steps_buttons_are_usable_only_with_a_kept_step(ctx, monkeypatch):
    root = _create(ctx)[0]
    assert [u["interactive"] for u in output_tab.output_tick(ctx, None)[-2:]] == [False, False]
    view = ctx.supervisor.attach(root)
    idle = view.snapshot()
    assert [u["interactive"] for u in output_tab.output_tick(ctx, root)[-2:]] == [False, False]
    kept = {"step": 120, "val_cos": 0.8, "size": 2048, "time": 0, "id": "step120"}
    monkeypatch.setattr(view, "snapshot", lambda: {**idle, "report": {**idle["report"], "kept_steps": [kept]}})
    tick = output_tab.output_tick(ctx, root)
    assert tick[5][0][0] == 120 and tick[6]["choices"] == [("step 120", "step120")]
    assert [u["interactive"] for u in tick[-2:]] == [True, True]


def test_path_settings_outside_the_roots_are_refused_on_their_field(ctx):
    out = _create(ctx)
    roots = ctx.paths.roots
    values = _values(out)
    values[KEYS.index("export.output_dir")] = "/"
    values[KEYS.index("corpus.extra_files")] = '["materials/ok.txt", "../../../../../etc/passwd"]'
    saved = setup_tab.save_settings(ctx, out[0], "", *values)
    assert "Not saved" in saved[1]
    infos = {k: u.get("info") or "" for k, u in zip(KEYS, saved[3:3 + len(FIELDS)])}
    assert infos["export.output_dir"].startswith("⚠") and infos["corpus.extra_files"].startswith("⚠")
    project = Project.open(out[0])
    assert project.settings.export.output_dir == "" and project.settings.corpus.extra_files == []
    values = _values(out)
    values[KEYS.index("corpus.extra_files")] = '["materials/ok.txt"]'       # inside the project: fine
    assert "Saved" in setup_tab.save_settings(ctx, out[0], "", *values)[1]
    setup_tab.open_project(ctx, out[0])
    assert ctx.paths.roots == roots                                          # settings never widen them


def test_the_demo_button_builds_the_chosen_packs_demo(ctx, monkeypatch):
    started = []
    monkeypatch.setattr(ctx.supervisor, "start_run", lambda root: started.append(root) or 4242)
    out = setup_tab.run_demo(ctx, "llada_image")
    root = ctx.demo_root / "llada_adapter"
    assert out[0] == str(root) and "Demo started (pid 4242)" in out[1] and started == [root]
    project = Project.open(root)
    assert project.pack.id == "llada_image" and project.settings.precompute.mock_teacher is True
    values = dict(zip(KEYS, _values(out)))
    assert values["precompute.mock_teacher"] is True
    refused = setup_tab.run_demo(ctx, "no_such_pack")
    assert refused[0] is None and "no_such_pack" in refused[1] and started == [root]


def test_the_form_shows_the_packs_own_teacher_placement_control(ctx):
    from ui.settings_form import FIELDS, visibility_updates
    for pack, shown, hidden in (("llada_image", "precompute.placement", "precompute.teacher_mode"),
                                ("t5xxl_pixart", "precompute.teacher_mode", "precompute.placement")):
        out = setup_tab.create_project(ctx, f"p_{pack}", pack, str(ctx.projects_root))
        updates = dict(zip([f.key for f in FIELDS], visibility_updates(Project.open(out[0]))))
        assert updates[shown]["visible"] is True and updates[hidden]["visible"] is False


def test_a_llada_project_estimates_its_shards_before_the_teacher_is_downloaded(ctx):
    from ui.common import fmt_size
    out = setup_tab.create_project(ctx, "llada", "llada_image", str(ctx.projects_root))
    project = Project.open(out[0])
    samples = project.settings.corpus.n_train + project.settings.corpus.n_val          # 60000 + 1024
    per = 60 * 1024 * 2 + 256 * 2560 * 2              # student rows + [256, 2560] bf16 targets: 1,433,600 B
    text = setup_tab.disk_estimate(project)
    assert f"≈ {fmt_size(per * samples)} for {samples} samples" in text and "real teacher's shapes" in text


def test_a_mageflow_project_estimates_about_the_references_bytes_per_sample(ctx):
    out = setup_tab.create_project(ctx, "mf", "qwen3vl_mageflow", str(ctx.projects_root))
    text = setup_tab.disk_estimate(Project.open(out[0]))
    # the reference's own estimate for the trainer5 mix: 1,797,185 B a sample on average
    assert "for 87536 samples (1.8 MB each, estimated from the real teacher's shapes)" in text


# ------------------------------------------------------------ issue 19: Train and Output

def _running_view(snap, saved, trainer, step, metric_planned):
    """The project's live view `snap` as it reads while the trainer runs at `step` on `trainer`
    steps, with `saved` in project.json; the last checkpoint (and the last logged point) still
    say `metric_planned`."""
    report = dict(snap["report"], status="running", stage="train", planned_steps=saved,
                  checkpoints={"last": {"step": 200, "planned_steps": 200}, "best": None})
    report["stages"] = [dict(s, status="running", planned_steps=trainer, step=step, count=step)
                        if s["name"] == "train" else s for s in report["stages"]]
    return dict(snap, report=report, last_train={"step": step, "planned_steps": metric_planned, "loss": 0.5})


def test_the_steps_note_follows_the_trainer_and_goes_once_it_has_the_count(ctx, monkeypatch):
    root = _create(ctx)[0]
    view = ctx.supervisor.attach(root)
    idle = view.snapshot()
    # saved 300 while the trainer, at step 220, still runs on 200: the note says so, with the live step
    monkeypatch.setattr(view, "snapshot", lambda: _running_view(idle, 300, 200, 220, 200))
    tick = train_tab.train_tick(ctx, root, -1)
    assert "saved 300, trainer still on 200 at step 220" in tick[5]
    assert 'data-metric="step">220 / 200' in tick[3]
    # the trainer read the new count (its status event; the last logged point and the checkpoint still say
    # 200): the note is gone and the metrics show the count in force
    monkeypatch.setattr(view, "snapshot", lambda: _running_view(idle, 300, 300, 220, 200))
    tick = train_tab.train_tick(ctx, root, -1)
    assert tick[5] == "" and 'data-metric="step">220 / 300' in tick[3]
    # a count below the trainer's step: pending until the trainer stops at its own step, then gone
    monkeypatch.setattr(view, "snapshot", lambda: _running_view(idle, 150, 300, 220, 300))
    assert "saved 150, trainer still on 300" in train_tab.train_tick(ctx, root, -1)[5]
    monkeypatch.setattr(view, "snapshot", lambda: _running_view(idle, 150, 220, 220, 300))
    assert train_tab.train_tick(ctx, root, -1)[5] == ""


def test_reset_cancel_closes_the_confirmation_and_deletes_nothing(ctx):
    out = _create(ctx)
    project = Project.open(out[0])
    project.checkpoints_dir.mkdir(parents=True)
    (project.checkpoints_dir / "last.pt").write_bytes(b"x")
    listing, row = train_tab.preview_reset(out[0], "train")
    assert row["visible"] is True and str(project.checkpoints_dir) in listing
    listing, row, what = train_tab.cancel_reset()
    assert listing == "" and row["visible"] is False and what["value"] is None
    assert (project.checkpoints_dir / "last.pt").read_bytes() == b"x"


def test_one_snapshot_is_a_visible_point_on_the_quality_plot(ctx):
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_rgb
    out = _create(ctx)
    project = Project.open(out[0])
    project.snapshots_json.write_text(json.dumps({"snapshots": [
        {"id": "step120-last", "step": 120, "planned_steps": 240, "checkpoint": "last", "val_cos": 0.8,
         "path": str(project.root / "x-step120-f16.gguf"), "eval": None}]}))
    ctx.supervisor.attach(project.root).refresh(force=True)
    tick = output_tab.output_tick(ctx, out[0])
    fig, key = tick[4], tick[8]
    (ax,) = fig.axes
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [120] and line.get_marker() == "o" and line.get_markersize() > 0
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3] / 255.0
    x, y = ax.transData.transform((120, 0.8))
    at = pixels[int(round(pixels.shape[0] - y)), int(round(x))]
    assert np.allclose(at, to_rgb(line.get_color()), atol=0.05), at        # the point is drawn, not the background
    # unchanged snapshots: the figure is not drawn again on the next tick
    assert isinstance(output_tab.output_tick(ctx, out[0], key)[4], type(gr.skip()))


def test_the_ggk_command_names_the_packs_model_files_and_takes_the_users(ctx):
    from trainer_core.packs import PACKS
    out = _create(ctx)
    project = Project.open(out[0])
    dit, vae = output_tab.model_files(project.pack)
    assert dit.endswith(".gguf") and vae.endswith(".gguf") and "MODEL.gguf" not in (dit, vae)
    assert [u["value"] for u in output_tab.model_file_defaults(out[0])] == [dit, vae]
    gguf = project.gguf_path()
    gguf.parent.mkdir(parents=True, exist_ok=True)
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    ctx.supervisor.attach(project.root).refresh(force=True)
    command = output_tab.output_tick(ctx, out[0])[7]
    assert f"--diffusion-model {dit} --vae {vae} " in command and str(gguf) in command
    command = output_tab.output_tick(ctx, out[0], None, "my dit.gguf", "vae-q8.gguf")[7]
    assert "--diffusion-model 'my dit.gguf' --vae vae-q8.gguf " in command and dit not in command
    assert output_tab.command_tick(ctx, out[0], "", "") == output_tab.output_tick(ctx, out[0])[7]
    # every pack names its engine files (Qwen-Image 2.1's are not published: the placeholder stays)
    named = {p.id: output_tab.model_files(p) for p in PACKS.values()}
    assert all(d and v for d, v in named.values())
    assert [i for i, (d, _) in named.items() if d == "MODEL.gguf"] == ["qwen3vl_qwenimage"]
