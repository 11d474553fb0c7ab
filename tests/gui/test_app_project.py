"""The app keeps its own project (a page load never reopens the CLI's last project), the demo button
on a demo that exists (done: say so and offer "afresh"; unfinished: resume), and the Setup form with no
project open. Handlers called directly; tests/gui/test_browser.py has the same in a real browser."""
from __future__ import annotations

import json
import shutil

import gradio as gr

import demo_cache
from trainer_core.packs.base import DEMO_SETTINGS
from trainer_core.project import Project, last_project, remember_last_project, user_dir
from trainer_core.stages import STAGE_NAMES, stage_wanted
from ui import setup_tab
from ui.app import build_app, make_context
from ui.context import APP_PROJECTS_FILE
from ui.settings_form import FIELDS

PACK = "t5xxl_pixart"
N = len(FIELDS)
FORM, NOTE, CALIBRATE, SAVE, AFRESH = range(3 + N, 3 + N + 5)         # ProjectView.extras
DEMO_STEPS = int(next(s for s in DEMO_SETTINGS if s.startswith("train.steps=")).split("=")[1])


def _form_shown(out) -> bool:
    """The settings form's state in a view: shown and usable, or hidden with Calibrate / Save off."""
    shown = out[FORM]["visible"], not out[NOTE]["visible"], out[CALIBRATE]["interactive"], out[SAVE]["interactive"]
    assert len(set(shown)) == 1, shown                 # never half of one and half of the other
    return shown[0]


# ------------------------------------------------------------ the app's own project

def test_a_cli_command_does_not_change_the_project_a_page_load_shows(ctx, run_cli, tmp_path):
    mine = setup_tab.create_project(ctx, "mine", PACK, str(ctx.projects_root))[0]
    assert setup_tab.initial_project(ctx)[0] == mine
    other = ctx.projects_root / "other"
    r = run_cli("new", "--project", str(other), "--pack", PACK)          # a terminal, meanwhile
    assert r.returncode == 0, r.stderr
    assert last_project() == other.resolve()                            # the CLI's last project moved …
    view = setup_tab.initial_project(ctx)
    assert view[0] == mine and "`" + mine + "`" in view[2] and _form_shown(view)   # … the app's did not

    # a restart of the app (same projects root) comes back to it, from the app's own file
    assert json.loads((user_dir() / APP_PROJECTS_FILE).read_text())[str(ctx.projects_root.resolve())] == mine
    again = make_context(ctx.projects_root, demo_root=ctx.demo_root)
    try:
        assert setup_tab.initial_project(again)[0] == mine
    finally:
        again.supervisor.close()
    # what the app opens is still the CLI's last project too: `gguf-trainer --auto-resume` relaunches it
    setup_tab.open_project(ctx, str(other))
    assert last_project() == other.resolve() and setup_tab.initial_project(ctx)[0] == str(other.resolve())


def test_an_app_settles_its_start_project_once(ctx, tmp_path):
    """An app never used before starts with the global last project of that moment, and from then on
    shows only what its own user opens."""
    first = Project.create(ctx.projects_root / "first", PACK)          # remembered by the CLI's side
    build_app(ctx)                                                        # the app starts
    later = Project.create(ctx.projects_root / "later", PACK)
    assert last_project() == later.root
    assert setup_tab.initial_project(ctx)[0] == str(first.root)


def test_the_demo_app_lands_on_its_demo_whatever_the_cli_did(tmp_path, monkeypatch):
    from trainer_core.supervisor import Supervisor
    from ui import app as app_module
    root = tmp_path / "projects"
    demo = root / "demo" / "t5_adapter"
    shutil.copytree(demo_cache.built(PACK), demo, symlinks=True)
    mine = Project.create(root / "mine", PACK)
    app_file = user_dir() / APP_PROJECTS_FILE
    app_file.write_text(json.dumps({str(root.resolve()): str(mine.root)}))      # what the app had open before
    remember_last_project(mine.root)
    started, seen = [], []
    monkeypatch.setattr(Supervisor, "start_run", lambda self, r, *a, **k: started.append(r) or 4242)
    monkeypatch.setattr(app_module, "serve", lambda ctx, *a, **k: (seen.append(ctx), build_app(ctx)))
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-tmp"))
    try:
        assert app_module.main(app_module.ServeOptions(open_browser=False, projects_root=str(root),
                                                       demo_pack=PACK)) == 0
        (ctx,) = seen
        assert started == [demo.resolve()]
        Project.create(root / "cli_made", PACK)                        # `gguf-trainer new` in a terminal
        view = setup_tab.initial_project(ctx)
        assert view[0] == str(demo.resolve()) and _form_shown(view)
    finally:
        for c in seen:
            c.supervisor.close()


# ------------------------------------------------------------ the demo button, a second time

def _trained_demo_in(ctx):
    """The session's trained demo (and its export beside it) as this app's demo."""
    source = demo_cache.trained(PACK)
    shutil.copytree(source.parent, ctx.demo_root, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".complete"))
    return Project.open(ctx.demo_root / source.name)


def test_a_complete_demo_is_opened_not_rerun_and_afresh_rebuilds_it(ctx, monkeypatch):
    started = []
    monkeypatch.setattr(ctx.supervisor, "start_run", lambda root: started.append(root) or 4242)
    project = _trained_demo_in(ctx)
    gguf = project.gguf_path()
    assert gguf.is_file() and not any(stage_wanted(project, s) for s in STAGE_NAMES)
    (project.root / "marker").write_text("the old run")
    current = setup_tab.create_project(ctx, "mine", PACK, str(ctx.projects_root))[0]

    out = setup_tab.run_demo(ctx, PACK, current)
    assert started == []                                                  # nothing ran again
    assert out[0] == str(project.root) and ctx.project == project.root    # it is open, and the app's own
    assert "already done" in out[1] and "Demo started" not in out[1]
    assert setup_tab.AFRESH_LABEL in out[1] and out[AFRESH]["visible"] is True
    assert "gt-error" not in out[1]
    assert setup_tab.initial_project(ctx)[AFRESH]["visible"] is False     # the offer is that answer's only

    again = setup_tab.restart_demo(ctx, out[0])
    assert "Rebuilt the demo" in again[1] and "pid 4242" in again[1], again[1]
    assert started == [project.root] and again[0] == str(project.root) and again[AFRESH]["visible"] is False
    rebuilt = Project.open(project.root)
    assert not (rebuilt.root / "marker").exists()                      # a new folder …
    assert not rebuilt.checkpoints_dir.exists() and not gguf.exists()   # … without the old run or its export
    assert rebuilt.settings.train.steps == DEMO_STEPS != project.settings.train.steps   # the cache ran 60
    assert all(stage_wanted(rebuilt, s) for s in ("corpus", "train", "export"))
    assert ctx.supervisor.view(rebuilt.root) is not None                  # watched again, from the start


def test_an_unfinished_demo_is_resumed_not_rebuilt(ctx, monkeypatch):
    started = []
    monkeypatch.setattr(ctx.supervisor, "start_run", lambda root: started.append(root) or 4343)
    project = _trained_demo_in(ctx)
    (project.root / "marker").write_text("kept")
    project.gguf_path().unlink()                                        # stopped before the export
    state = project.read_state()
    project.write_state({**state, "status": "stopped"})

    out = setup_tab.run_demo(ctx, PACK)
    assert started == [project.root] and out[0] == str(project.root)
    assert "unfinished (stopped)" in out[1] and "resumed it (pid 4343)" in out[1], out[1]
    assert "keeping its finished stages (corpus, precompute_val, precompute_train, train)" in out[1]
    assert "left to run: export, eval." in out[1]
    assert (project.root / "marker").read_text() == "kept" and project.checkpoints_dir.is_dir()
    assert out[AFRESH]["visible"] is False


def test_afresh_is_refused_for_a_project_that_is_not_the_demo(ctx, monkeypatch):
    monkeypatch.setattr(ctx.supervisor, "start_run", lambda root: 1)
    mine = setup_tab.create_project(ctx, "mine", PACK, str(ctx.projects_root))[0]
    out = setup_tab.restart_demo(ctx, mine)
    assert out[0] == mine and "gt-error" in out[1] and "not the demo project of this app" in out[1]
    assert (ctx.projects_root / "mine" / "project.json").is_file()


# ------------------------------------------------------------ no project open

def test_with_no_project_open_the_form_is_hidden_and_calibrate_and_save_are_off(ctx):
    empty = setup_tab.initial_project(ctx)
    assert empty[0] is None and _form_shown(empty) is False
    refused = setup_tab.open_project(ctx, "/etc", None)
    assert refused[0] is None and _form_shown(refused) is False and "gt-error" in refused[1]
    assert refused[-1]["interactive"] is False                          # nor a token to type for nothing
    made = setup_tab.create_project(ctx, "mine", PACK, str(ctx.projects_root))
    assert made[0] and _form_shown(made) is True and made[-1]["interactive"] is True
    kept = setup_tab.open_project(ctx, "/etc", made[0])                 # a refusal keeps the open project's form
    assert kept[0] == made[0] and _form_shown(kept) is True


def test_the_built_app_starts_with_the_form_hidden_behind_its_note(ctx):
    app = build_app(ctx)

    def one(elem_id):
        (found,) = [b for b in app.blocks.values() if getattr(b, "elem_id", None) == elem_id]
        return found
    assert one("settings-form").visible is False and one("no-project-note").visible is True
    assert "open" in one("no-project-note").value.lower() and "create" in one("no-project-note").value.lower()
    assert one("calibrate-btn").interactive is False and one("save-btn").interactive is False
    assert one("demo-afresh").visible is False
    # every field sits inside the hidden form
    form = one("settings-form")
    inside = {id(b) for b in _descendants(form)}
    assert all(id(one("set-" + f.key.replace(".", "-").replace("_", "-"))) in inside for f in FIELDS)


def _descendants(block: gr.blocks.Block):
    for child in getattr(block, "children", []):
        yield child
        yield from _descendants(child)
