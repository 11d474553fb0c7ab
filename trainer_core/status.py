"""One project's status as the CLI's `status` and the GUI show it: the run, every stage
(done from the files on disk, else what state.json says), the checkpoints, snapshots and
the engine command. Reads files only; never imports torch."""
from __future__ import annotations

from typing import Any

from trainer_core.base.atomic import read_json
from trainer_core.materials import all_statuses
from trainer_core.project import Project
from trainer_core.runner import runtime_status
from trainer_core.snapshot import job_status, read_manifest
from trainer_core.stages import STAGES, stage_done
from trainer_core.stages.export import ggk_command

__all__ = ["status_report", "STAGE_DETAILS", "output_files", "kept_steps"]

STAGE_DETAILS = ("detail", "count", "total", "unit", "step", "steps", "val_cos", "best_val_cos", "error",
                 "eta_s", "rate")


def output_files(project: Project) -> list[dict[str, Any]]:
    """The project's exported GGUFs in its output folder: the final one and the snapshots."""
    out = project.output_dir()
    name = project.settings.name
    files = []
    for path in sorted(out.glob(f"{name}*-f16.gguf")) if out.is_dir() else []:
        if path.name == f"{name}-f16.gguf" or path.name.startswith(f"{name}-step"):
            st = path.stat()
            files.append({"name": path.name, "path": str(path), "size": st.st_size, "mtime": st.st_mtime})
    if project.pack.id == "llada_image":
        from trainer_core.packs.llada_image.sigvq import sigvq_path
        extra = sigvq_path(project)
        if extra.is_file():
            st = extra.stat()
            files.append({"name": extra.name, "path": str(extra), "size": st.st_size, "mtime": st.st_mtime})
    return files


def kept_steps(project: Project) -> list[dict[str, Any]]:
    """Kept steps (train.history), newest first, from their sidecars."""
    folder = project.checkpoints_dir / "history"
    rows = []
    for sidecar in folder.glob("step*.json") if folder.is_dir() else []:
        info = read_json(sidecar, {}) or {}
        weights = sidecar.with_suffix(".pt")
        if isinstance(info.get("step"), int) and weights.is_file():
            rows.append({**info, "size": weights.stat().st_size, "path": str(weights)})
    return sorted(rows, key=lambda r: -r["step"])


def status_report(project: Project) -> dict[str, Any]:
    info = runtime_status(project)
    state = project.read_state()
    stages = []
    for spec in STAGES:
        entry = state.get("stages", {}).get(spec.name, {})
        done = stage_done(project, spec.name)
        stages.append({"name": spec.name, "title": spec.title, "done": done,
                       "status": "done" if done else entry.get("status", "-"),
                       **({} if done else {k: entry[k] for k in STAGE_DETAILS if k in entry})})
    last = read_json(project.checkpoints_dir / "last.json", None)
    best = read_json(project.checkpoints_dir / "best.json", None)
    return {"project": str(project.root), "pack": project.pack.id, "name": project.settings.name,
            "status": info["status"], "pid": info["pid"], "stage_pid": info["stage_pid"],
            "run": state.get("run"), "stage": state.get("stage"), "error": state.get("error"),
            "planned_steps": project.settings.train.steps, "stages": stages,
            "checkpoints": {"last": last, "best": best}, "export": str(project.gguf_path()),
            "ggk_command": ggk_command(project) if project.gguf_path().is_file() else None,
            "ggk_edit_args": project.pack.ggk_edit_args,
            "snapshots": read_manifest(project), "snapshot_job": job_status(project),
            "outputs": output_files(project), "kept_steps": kept_steps(project),
            "eval": read_json(project.eval_json, None), "metric_names": list(project.pack.metric_names),
            "materials": [m.to_dict() for m in all_statuses(project, online=False)]}
