"""The Setup tab's materials table and its download buttons.

Buttons obey the rules of the materials issue: a material's Download is disabled while its
files are present or a download of it runs; Download missing is disabled while nothing is
missing or any download runs. The server side enforces the same (one job per material, by a
lock), so a second click can never start a second download. A demo project's materials are all
`ready` or `not needed` (materials.py), so neither button is ever enabled for it."""
from __future__ import annotations

from typing import Any

import gradio as gr

from trainer_core.base.errors import TrainerError
from trainer_core.materials import MaterialStatus, adopt_existing, all_statuses, start_job, wanted
from trainer_core.project import Project
from trainer_core.packs.lookup import find_material
from trainer_core.student_hub import FULL_PRECISION, STUDENT_ID, quant_of

from ui import student_finder
from ui.common import banner, fmt_size
from ui.paths import PathPolicy

__all__ = ["COLUMNS", "rows", "table_updates", "refresh", "download_one", "download_missing"]

COLUMNS = ["material", "required", "status", "progress", "where", "note"]


def rows(statuses: list[MaterialStatus]) -> list[list[str]]:
    out = []
    for s in statuses:
        if s.status == "ready":              # its size is no progress: that it is complete is
            progress = "✓ complete"
        elif s.bytes_total:
            progress = f"{fmt_size(s.bytes_done)} / {fmt_size(s.bytes_total)}"
            if s.files_total:
                progress += f" · {s.files_done}/{s.files_total} files"
        else:
            progress = fmt_size(s.bytes_done) if s.bytes_done else ""
        note = (f"download failed: {s.error}" if s.error and s.status not in ("ready", "not needed") else
                "the demo runs without it" if s.status == "not needed" else "linked" if s.linked else "")
        quant = quant_of(s.path) if s.id == STUDENT_ID and s.path else ""
        if quant and quant not in FULL_PRECISION:          # it trains, but on the rounding errors of its quantization
            note = ", ".join(filter(None, [note, f"{quant}: quantized, for running; train on f16"]))
        out.append([s.title, "required" if s.required else "optional", s.status, progress, s.path or "–", note])
    return out


def table_updates(project: Project, statuses: list[MaterialStatus], selected: str | None) -> tuple:
    """(table, the material picker, its Download button, Download missing, a summary line)."""
    by_id = {s.id: s for s in statuses}
    choices = [(s.title, s.id) for s in statuses if s.kind == "hf_snapshot"]
    selected = selected if selected in by_id else (choices[0][1] if choices else None)
    pick = by_id.get(selected) if selected else None
    one_ok = bool(pick and pick.kind == "hf_snapshot" and pick.status not in ("ready", "downloading", "not needed"))
    one_label = {"partial": "Continue download", "downloading": "Downloading…", "ready": "Downloaded ✓",
                 "not needed": "Not needed"}.get(
        pick.status if pick else "", "Download")
    running = [s for s in statuses if s.status == "downloading"]
    missing = [s for s in statuses if s.kind == "hf_snapshot" and s.status in ("missing", "partial")
               and wanted(project, find_material(project.pack, s.id))]
    if running:
        all_label, all_ok = "Downloading…", False
    elif missing:
        all_label, all_ok = f"Download missing ({len(missing)})", True
    else:
        all_label, all_ok = "All downloadable materials present", False
    local_missing = [s.title for s in statuses if s.kind == "local_file" and s.status in ("missing", "partial")]
    summary = []
    if running:
        summary.append("downloading: " + ", ".join(s.title for s in running) +
                       " (runs detached, survives closing this page, resumes after a reboot)")
    if missing:
        summary.append("missing: " + ", ".join(s.title for s in missing))
    if local_missing:
        summary.append("pick a file for: " + ", ".join(local_missing) + " (or Find on the Hub, below)")
    return (gr.update(value=rows(statuses)), gr.update(choices=choices, value=selected),
            gr.update(value=one_label, interactive=one_ok), gr.update(value=all_label, interactive=all_ok),
            " · ".join(summary) or "All materials present.")


def refresh(project_path: str | None, selected: str | None, online: bool = True) -> tuple:
    """Re-check the disk (and the Hub when online), linking copies found elsewhere."""
    if not project_path:
        return (gr.update(value=[]), gr.update(choices=[]), gr.update(interactive=False),
                gr.update(interactive=False), "")
    project = Project.open(project_path)
    linked = adopt_existing(project) if online else []
    if linked:
        project = Project.open(project_path)
    updates = table_updates(project, all_statuses(project, online=online), selected)
    if linked:
        updates = (*updates[:4], "Found and linked: " + ", ".join(f"{i} → {p}" for i, p in linked) + " · " + updates[4])
    return updates


def download_one(project_path: str | None, material_id: str | None) -> tuple:
    if not project_path or not material_id:
        return (banner("Pick a material first."), *refresh(project_path, material_id, online=False))
    try:
        project = Project.open(project_path)
        if material_id not in {m.id for m in project.pack.project_materials(project)}:
            raise TrainerError(f"{material_id} is not a material of the {project.pack.id} pack.")
        pid = start_job(project, material_id)
    except TrainerError as e:
        return (banner(str(e)), *refresh(project_path, material_id, online=False))
    message = (f"Download of {material_id} started (pid {pid})." if pid else
               f"{material_id} is already being downloaded.")
    return (banner(message, "ok" if pid else "notice"), *refresh(project_path, material_id, online=False))


def download_missing(project_path: str | None, selected: str | None) -> tuple:
    if not project_path:
        return (banner("Open or create a project first."), *refresh(None, None))
    try:
        project = Project.open(project_path)
        adopt_existing(project)
        project = Project.open(project_path)
        started = []
        for s in all_statuses(project, online=True):
            m = find_material(project.pack, s.id)
            if s.kind == "hf_snapshot" and s.status in ("missing", "partial") and wanted(project, m):
                if start_job(project, s.id):
                    started.append(s.title)
    except TrainerError as e:
        return (banner(str(e)), *refresh(project_path, selected, online=False))
    message = ("Started: " + ", ".join(started)) if started else "Nothing to download."
    return (banner(message, "ok" if started else "notice"), *refresh(project_path, selected, online=False))


def build(project_state: gr.State, top_banner: gr.HTML, paths: PathPolicy) -> dict[str, Any]:
    # long paths and notes wrap inside their cells instead of being cut off (issue 56)
    table = gr.Dataframe(headers=COLUMNS, value=[], interactive=False, elem_id="materials", wrap=True,
                         column_widths=["13%", "8%", "9%", "12%", "29%", "29%"])
    summary = gr.Markdown("", elem_id="materials-summary")
    with gr.Row():
        # the choices depend on the open project's pack: the handlers check the value
        pick = gr.Dropdown([], label="Material", elem_id="material-pick", scale=2, allow_custom_value=True)
        one = gr.Button("Download", interactive=False, elem_id="download-one")
        all_missing = gr.Button("Download missing", interactive=False, elem_id="download-missing")
        check = gr.Button("Refresh", elem_id="materials-refresh")
    outputs = [table, pick, one, all_missing, summary]
    check.click(lambda p, s: refresh(p, s), [project_state, pick], outputs, api_name="materials_refresh")
    pick.change(lambda p, s: refresh(p, s, online=False), [project_state, pick], outputs, api_name=False)
    one.click(download_one, [project_state, pick], [top_banner, *outputs], api_name="download_material",
              concurrency_limit=1)
    all_missing.click(download_missing, [project_state, pick], [top_banner, *outputs], api_name="download_missing",
                      concurrency_limit=1)
    student_finder.build(project_state, top_banner, paths, outputs, refresh)     # Find on the Hub, a file you have
    return {"outputs": outputs, "pick": pick}
