"""Setup: create or open a project, its materials, every setting, and Start / Resume."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gradio as gr

from trainer_core.base.config import ConfigError
from trainer_core.materials import MaterialStatus, all_statuses
from trainer_core.base.errors import TrainerError
from trainer_core.from_adapter import HUB_SOURCE, describe_start, new_from_adapter
from trainer_core.packs import DEMO_PACKS, PACKS, get_pack
from trainer_core.project import Project, folder_is_project
from trainer_core.readiness import launch_problems
from trainer_core.runner import runtime_status

from ui import materials_panel
from ui.action_banner import RUN
from ui.common import banner, fmt_size
from ui.context import Ctx
from ui.demo_flow import demo_steps, restart_demo, run_demo
from ui.paths import PathRefused, check_length, check_name, os_error_sentence, shown
from ui.plan_panel import plan_summary, run_calibration
from ui.project_view import (AFRESH_LABEL, NO_PROJECT_NOTE, ProjectView, _opened, current_view, disk_estimate,
                             start_label)
from ui.settings_form import build_fields, form_assignments

__all__ = ["build", "open_project", "create_project", "save_settings", "start_run", "run_demo", "restart_demo",
           "missing_required", "disk_estimate", "start_label", "browse", "ProjectView", "current_view", "change_root",
           "initial_project", "launch_problems", "AFRESH_LABEL", "NO_PROJECT_NOTE"]

# ------------------------------------------------------------ pure helpers

def missing_required(project: Project) -> list[str]:
    """Required materials not on disk; one a demo runs without (its mocked teacher) is not missing."""
    return [st.title for st in all_statuses(project, online=False)
            if st.required and st.status not in ("ready", "not needed")]


PATH_SETTINGS = {"export.output_dir", "export.copy_to", "corpus.train_file", "corpus.val_file"}
PATH_LIST_SETTINGS = {"corpus.extra_files", "corpus.image_folders"}


def path_problems(ctx: Ctx, project: Project, assignments: list[str]) -> list[str]:
    """Path settings must point inside the allowed roots (relative ones are taken from the
    project folder), like every path the GUI takes; one problem per refused setting."""
    import json
    problems = []
    for text in assignments:
        key, _, value = text.partition("=")
        if key in PATH_SETTINGS:
            paths = [value] if value.strip() else []
        elif key in PATH_LIST_SETTINGS:
            try:
                parsed = json.loads(value) if value.strip().startswith("[") else value.split(",")
            except ValueError:
                continue                      # the settings validation reports the format
            paths = [p for p in parsed if isinstance(p, str) and p.strip()]
        else:
            continue
        for path in paths:
            try:
                ctx.paths.check(project.resolve_user_path(path.strip()), key)
            except PathRefused as e:
                problems.append(f"{key} {e}")
                break
    return problems


def browse(ctx: Ctx, folder: str, kind: str) -> tuple[str, Any, str]:
    """(the folder shown, the entries as radio choices, a banner)."""
    try:
        listed, entries = ctx.paths.browse(folder or str(ctx.projects_root), kind)
    except PathRefused as e:
        return folder, gr.update(choices=[], value=None), banner(str(e))
    except OSError as e:                     # whatever the filesystem says: one sentence, never a traceback
        return folder, gr.update(choices=[], value=None), banner(os_error_sentence(e, "folder"))
    choices = [("📁 .. (up)", str(listed.parent))] if any(listed.parent == r or r in listed.parent.parents
                                                           for r in ctx.paths.roots) else []
    for e in entries:
        label = (("📁 " + e.name + ("  [project]" if e.is_project else "")) if e.is_dir
                 else f"📄 {e.name}  ({fmt_size(e.size)})")
        choices.append((label, e.path))
    return str(listed), gr.update(choices=choices, value=None), ""


# ------------------------------------------------------------ handlers

def open_project(ctx: Ctx, path_text: str, current: str | None = None) -> tuple:
    """Open the project at `path_text`; refused, the project open now (`current`) stays open."""
    try:
        path = ctx.paths.check(path_text, "project folder")
        project = Project.open(path)
    except (PathRefused, TrainerError) as e:
        return current_view(ctx, current, str(e))
    except OSError as e:                     # a loop, a file in the way, no permission: one sentence
        return current_view(ctx, current, os_error_sentence(e, "project folder"))
    _opened(ctx, project)
    return ProjectView.of(ctx, project, _interrupted_note(project))


def _interrupted_note(project: Project) -> str:
    if runtime_status(project)["status"] != "interrupted":
        return ""
    return (f"{project.settings.name} was running when its process died (a reboot?). "
            f"Press Start / Resume to continue from the last checkpoint.")


def create_project(ctx: Ctx, name: str, pack_id: str, root_text: str, current: str | None = None,
                   from_adapter: str = "") -> tuple:
    """Create a project under `root_text` (starting from the adapter `from_adapter`, a file in an allowed folder
    or a Hub repo, when one is given); refused, the project open now (`current`) stays open."""
    field = "projects root"                  # what an OSError is about, for its sentence
    try:
        pack = get_pack(pack_id)
        root = ctx.paths.check(root_text or str(ctx.projects_root), "projects root")
        folder = (name or "").strip() or pack.default_folder
        if os.sep in folder or folder in (".", ".."):
            raise PathRefused(f"The adapter name {shown(folder)!r} must be a plain folder name, without slashes.")
        check_name(root, folder, "adapter name")       # fits the filesystem: refused before anything is written
        field = "project folder"
        target = root / folder
        check_length(target, "project folder")
        if target.is_symlink():              # dangling or not: never create through a link
            raise PathRefused(f"{target} is a link (to {os.readlink(target)}); pick another name, or open the "
                              f"project where the link points if that folder is allowed.")
        target = ctx.paths.check(str(target), "project folder")     # the resolved folder must be allowed too
        source = (from_adapter or "").strip()
        if source:
            if not HUB_SOURCE.match(source) or Path(source).expanduser().exists():     # a file: in an allowed folder
                source = str(ctx.paths.check(source, "adapter to start from"))
            project, adopt = new_from_adapter(target, pack.id, (name or "").strip() or None, source)
        else:
            project, adopt = Project.create(target, pack.id, name=(name or "").strip() or None), []
    except (PathRefused, TrainerError) as e:
        return current_view(ctx, current, str(e))
    except OSError as e:                     # a loop, a file in the way, no permission: one sentence
        return current_view(ctx, current, os_error_sentence(e, field))
    _opened(ctx, project)
    start = describe_start(project)
    started = f" Training starts from {start}" + (f"; taken from it: {', '.join(adopt)}." if adopt else ".")
    return ProjectView.of(ctx, project, f"Created {project.root}." + (started if start else ""), "ok")


def save_settings(ctx: Ctx, project_path: str | None, token: str, *values: Any) -> tuple:
    if not project_path:
        return ProjectView.of(ctx, None, "Open or create a project first.", "error")
    try:
        project = Project.open(project_path)
    except TrainerError as e:
        return ProjectView.of(ctx, None, str(e), "error")
    assignments = form_assignments(project, list(values))
    refused = path_problems(ctx, project, assignments)
    if refused:
        return _not_saved(ctx, project, ConfigError(refused), values)
    if token and token.strip():
        assignments.append(f"hf_token={token.strip()}")
    if not assignments:
        return ProjectView.of(ctx, project, "Nothing to save: the settings are unchanged.")
    try:
        from trainer_core.plan.refusals import refuse_unrunnable
        warnings = refuse_unrunnable(project, assignments)    # a value this machine cannot run: on its field
        stale, work = project.work_at_risk(assignments)
        if stale and work:                   # say what would be discarded; never discard it from a form save
            raise ConfigError([f"Changing {', '.join(stale)} would make this project's work stale "
                               f"({'; '.join(work)}); create a new project for it, or move that work aside with "
                               f"`gguf-trainer set --project {project.root} --force --set KEY=VALUE`"])
        project.update_settings(assignments)
    except ConfigError as e:
        return _not_saved(ctx, project, e, values)
    except TrainerError as e:              # a read-only folder, a full disk: the sentence, the form kept
        return _not_saved(ctx, project, e, values)
    ctx.supervisor.poke(project.root)
    if warnings:
        return ProjectView.of(ctx, project, f"Saved {len(assignments)} setting(s); " + "; ".join(warnings) + ".",
                              "notice")
    return ProjectView.of(ctx, project, f"Saved {len(assignments)} setting(s).", "ok")


def _not_saved(ctx: Ctx, project: Project, error: TrainerError, values: tuple) -> tuple:
    """The form with every problem on its field, keeping what the user typed so they can correct it."""
    view = list(ProjectView.of(ctx, project, f"Not saved: {error}", "error",
                               error=error if isinstance(error, ConfigError) else None))
    for i, value in enumerate(values):
        view[3 + i] = gr.update(value=value, info=view[3 + i].get("info"))
    return tuple(view)


def start_run(ctx: Ctx, project_path: str | None, anyway: bool = False) -> tuple[str, Any]:
    """(banner, the confirm button's visibility): a warning first, every problem on its line with its fix (the
    CLI's lines), when required materials are missing or the plan says the run will not fit."""
    if not project_path:
        return banner("Open or create a project first."), gr.update(visible=False)
    try:
        project = Project.open(project_path)
        missing = [] if anyway else launch_problems(project)   # the mock teacher: the teacher is not needed
        if missing:
            return (banner(f"Not started: this run needs {len(missing)} material{'s' if len(missing) > 1 else ''} "
                           "first:\n" + _bullets(missing) + "\nProvide them, or press Start anyway.", "notice"),
                    gr.update(visible=True))
        summary, warnings = plan_summary(project)
        if warnings and not anyway:           # the plan says it will not fit: say how, before anything runs
            return (banner("The plan warns:\n" + _bullets(warnings) + "\nChange the settings, or press Start anyway.",
                           "notice"), gr.update(visible=True))
        pid = ctx.supervisor.start_run(project.root)
    except TrainerError as e:
        return banner(str(e)), gr.update(visible=False)
    return (banner(f"Pipeline started (pid {pid}){'; ' + summary if summary else ''}; follow it on the Train tab.",
                   "ok", wait=RUN), gr.update(visible=False))


def _bullets(lines: list[str]) -> str:
    """One line each, as the banner shows them (it keeps the newlines)."""
    return "\n".join("• " + line for line in lines)


def change_root(ctx: Ctx, text: str, current: str | None) -> tuple:
    """Make `text` the projects root (a local app only: see ui/projects_root.py). Returns the
    project view, then the New project root field, the file browser's folder and its entries.
    The open project stays open if it lies inside the new allowed folders."""
    from ui.projects_root import change_projects_root
    try:
        root = change_projects_root(ctx, text)
    except PathRefused as e:
        return (*current_view(ctx, current, str(e)), gr.update(), gr.update(), gr.update())
    except OSError as e:                     # a name too long, a loop, no permission: one sentence
        return (*current_view(ctx, current, os_error_sentence(e, "projects root")), gr.update(), gr.update(),
                gr.update())
    message = f"The projects root is now {root} (remembered for the next start of this app)."
    view = current_view(ctx, current, message, "ok")
    if current and view[0] is None:
        message += f" The project {current} lies outside it and was closed."
        view = current_view(ctx, None, message, "ok")
    ctx.remember_project(Path(view[0]) if view[0] else None)    # the app's own project, under its new root
    shown, entries, _ = browse(ctx, str(root), "dir")
    return (*view, gr.update(value=str(root)), shown, entries)


def initial_project(ctx: Ctx) -> tuple:
    """A page load: the app's own project (ui/context.py), never the CLI's last project of the moment; it
    writes nothing (the project is already the app's)."""
    path = ctx.start_project()
    if path is None or not folder_is_project(path):
        return ProjectView.of(ctx, None, "")
    try:
        project = Project.open(ctx.paths.check(path, "project folder"))
    except PathRefused:             # remembered state never widens the folders the app may use
        return ProjectView.of(ctx, None, f"The last project, {path}, is outside the folders this app may use; "
                                         f"start the app with --allow-dir {path.parent} to open it.", "notice")
    except (TrainerError, OSError):  # unreadable since: nothing open, as for a folder gone
        return ProjectView.of(ctx, None, "")
    ctx.supervisor.attach(project.root)
    return ProjectView.of(ctx, project, _interrupted_note(project))


# ------------------------------------------------------------ layout

def materials_tick(ctx: Ctx, project_path: str | None, selected: str | None) -> tuple:
    """The materials as the Supervisor last read them (no disk scan, no Hub call)."""
    view = ctx.supervisor.view(project_path)
    report = view.snapshot()["report"] if view else None
    if not report or "materials" not in report:
        return tuple(gr.skip() for _ in range(5))
    statuses = [MaterialStatus(**d) for d in report["materials"]]
    return materials_panel.table_updates(view.project, statuses, selected)


def build(ctx: Ctx, project_state: gr.State, top_banner: gr.HTML, timer: gr.Timer) -> dict[str, Any]:
    with gr.Row():
        project_title = gr.Markdown("No project open", elem_id="project-title")
    with gr.Accordion("Project", open=True):
        with gr.Row():
            open_path = gr.Textbox(label="Project folder", placeholder=str(ctx.projects_root / "my_adapter"),
                                   scale=4, elem_id="open-path")
            open_btn = gr.Button("Open", scale=1, elem_id="open-btn")
            demo_btn = gr.Button("Try the demo", variant="primary", scale=1, elem_id="demo-btn")
            demo_pack = gr.Dropdown([(PACKS[p].title.split(" (")[0], p) for p in DEMO_PACKS], value=DEMO_PACKS[0],
                                    label="Demo pack", scale=1, elem_id="demo-pack")
            # offered only by the demo button's answer on a demo that has run every stage (ui/demo_flow.py)
            afresh_btn = gr.Button(AFRESH_LABEL, variant="stop", visible=False, scale=1, elem_id="demo-afresh")
        with gr.Accordion("+ New project", open=False):
            with gr.Row():
                new_name = gr.Textbox(label="Adapter name", placeholder="pig_<folder>", elem_id="new-name")
                new_pack = gr.Dropdown([(p.title, p.id) for p in PACKS.values()], value=DEMO_PACKS[0],
                                       label="Trainer pack", elem_id="new-pack")
                new_root = gr.Textbox(label="Projects root", value=str(ctx.projects_root), elem_id="new-root")
            new_from = gr.Textbox(label="Start from an adapter (optional): an adapter .gguf of this pack's kind and "
                                        "shapes, or a Hub repo OWNER/NAME[:file.gguf]", value="", elem_id="new-from")
            pack_info = gr.Markdown(PACKS[DEMO_PACKS[0]].description)
            with gr.Row():
                create_btn = gr.Button("Create", elem_id="create-btn")
                # the machine's owner only (loopback, no login): a shared app keeps its folders
                root_btn = gr.Button("Use this folder as the projects root", visible=ctx.local, elem_id="root-btn")
        with gr.Accordion("File browser", open=False):
            with gr.Row():
                browse_dir = gr.Textbox(label="Folder", value=str(ctx.projects_root), scale=4, elem_id="browse-dir")
                browse_kind = gr.Dropdown([("folders", "dir"), ("models", "model"), ("text", "text"), ("all", "any")],
                                          value="dir", label="Show", scale=1)
                browse_btn = gr.Button("Go", scale=1)
            entries = gr.Radio([], label="Entries (nothing is uploaded: files are used where they are)",
                               elem_id="browse-entries")
            with gr.Row():
                use_open = gr.Button("Open the selected project")
    with gr.Accordion("Materials", open=True):
        panel = materials_panel.build(project_state, top_banner, ctx.paths)
        materials = panel["outputs"][0]
        hf_token = gr.Textbox(label="HF token (for gated or private repos; kept in the project's .hf_token, "
                                    "readable only by you, never shown again)",
                              type="password", value="", interactive=False, elem_id="hf-token")
    # no project open: the form and the Plan panel are hidden behind a line that says how to get one
    no_project = gr.Markdown(NO_PROJECT_NOTE, elem_id="no-project-note")
    with gr.Column(visible=False, elem_id="settings-form") as form:
        fields = build_fields()
        disk = gr.Markdown("", elem_id="disk-estimate")       # the shards' estimate and the Plan panel
    with gr.Row():
        calibrate_btn = gr.Button("Calibrate the plan", interactive=False, elem_id="calibrate-btn")
        save_btn = gr.Button("Save settings", interactive=False, elem_id="save-btn")
        start_btn = gr.Button("Start pipeline", variant="primary", interactive=False, elem_id="setup-start")
        anyway_btn = gr.Button("Start anyway", variant="stop", visible=False, elem_id="start-anyway")

    view_outputs = [project_state, top_banner, project_title, *fields.values(),
                    form, no_project, calibrate_btn, save_btn, afresh_btn,          # ProjectView.extras
                    materials, disk, start_btn, hf_token]
    # the open project (a State: not part of the API's parameters) stays open when an action is refused
    open_btn.click(lambda p, c: open_project(ctx, p, c), [open_path, project_state], view_outputs,
                   api_name="open_project")
    create_btn.click(lambda n, k, r, c, f="": create_project(ctx, n, k, r, c, f),
                     [new_name, new_pack, new_root, project_state, new_from], view_outputs, api_name="create_project")
    # the demo buttons build or delete the demo's folder: one at a time. Their answers stream (generators): the
    # banner names each step of the build as it starts, so no output waits under a spinner meanwhile
    def demo_clicked(pack_id: str, current: str | None):
        yield from demo_steps(lambda progress: run_demo(ctx, pack_id, current, progress))

    def afresh_clicked(current: str | None):
        yield from demo_steps(lambda progress: restart_demo(ctx, current, progress))
    demo_btn.click(demo_clicked, [demo_pack, project_state], view_outputs, api_name="run_demo",
                   concurrency_id="demo", concurrency_limit=1, show_progress="hidden")
    afresh_btn.click(afresh_clicked, [project_state], view_outputs, api_name=False,
                     concurrency_id="demo", concurrency_limit=1, show_progress="hidden")
    root_btn.click(lambda r, c: change_root(ctx, r, c), [new_root, project_state],
                   [*view_outputs, new_root, browse_dir, entries], api_name=False)
    save_btn.click(lambda p, t, *v: save_settings(ctx, p, t, *v), [project_state, hf_token, *fields.values()],
                   view_outputs, api_name="save_settings")
    # an opened project's materials are checked against the Hub once (and found copies linked);
    # afterwards the slow tick shows the Supervisor's view of them
    project_state.change(lambda p, s: materials_panel.refresh(p, s), [project_state, panel["pick"]],
                         panel["outputs"], api_name=False)
    timer.tick(lambda p, s: materials_tick(ctx, p, s), [project_state, panel["pick"]], panel["outputs"],
               queue=False, show_progress="hidden", api_name="materials_tick")
    start_btn.click(lambda p: start_run(ctx, p), [project_state], [top_banner, anyway_btn], api_name="start")
    calibrate_btn.click(run_calibration, [project_state], [top_banner, disk], api_name="calibrate")
    anyway_btn.click(lambda p: start_run(ctx, p, anyway=True), [project_state], [top_banner, anyway_btn],
                     api_name=False)
    new_pack.change(lambda k: PACKS[k].description, [new_pack], [pack_info], api_name=False)
    browse_btn.click(lambda d, k: browse(ctx, d, k), [browse_dir, browse_kind], [browse_dir, entries, top_banner],
                     api_name="browse")
    entries.select(_pick_entry(ctx), [entries, browse_kind], [browse_dir, entries, top_banner, open_path],
                   api_name=False)
    use_open.click(lambda d, c: open_project(ctx, d, c), [open_path, project_state], view_outputs, api_name=False)
    return {"view_outputs": view_outputs, "start_btn": start_btn, "open_path": open_path}


def _pick_entry(ctx: Ctx):
    def pick(path: str | None, kind: str) -> tuple:
        if not path:
            return gr.update(), gr.update(), "", gr.update()
        if os.path.isdir(path):              # never raises (a name too long, a loop): not a folder then
            listed, choices, message = browse(ctx, path, kind)
            return listed, choices, message, path
        return gr.update(), gr.update(), "", path
    return pick
