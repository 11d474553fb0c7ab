"""One project's status as the CLI's `status` and the GUI show it: the run, every stage
(done from the files on disk, else what state.json says), the checkpoints, snapshots and
the engine command. Reads files only; never imports torch."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_core.base import token_store
from trainer_core.base.atomic import read_json
from trainer_core.contract import checkpoints
from trainer_core.contract.shards import mock_enabled, read_contract
from trainer_core.from_adapter import describe_start
from trainer_core.materials import all_statuses, is_demo
from trainer_core.plan import planned_vs_actual
from trainer_core.project import Project
from trainer_core.runner import runtime_status
from trainer_core.snapshot import job_status, read_manifest
from trainer_core.stages import STAGES, export_current, stage_done

__all__ = ["status_report", "STAGE_DETAILS", "output_files", "stale_reason"]

STAGE_DETAILS = ("started", "detail", "count", "total", "unit", "step", "planned_steps", "val_cos", "best_val_cos",
                 "error", "eta_s", "rate", "kept")


def output_files(project: Project) -> list[dict[str, Any]]:
    """The project's exported GGUFs in its output folder: the final one and the snapshots."""
    out = project.output_dir()
    name = project.settings.name
    files = []
    for path in sorted(out.glob(f"{name}*-f16.gguf")) if out.is_dir() else []:
        if path.name == f"{name}-f16.gguf" or path.name.startswith(f"{name}-step"):
            st = path.stat()
            files.append({"name": path.name, "path": str(path), "size": st.st_size, "mtime": st.st_mtime})
    for extra in project.pack.extras.outputs(project):         # what the pack exports beside the adapter
        st = extra.stat()
        files.append({"name": extra.name, "path": str(extra), "size": st.st_size, "mtime": st.st_mtime})
    return files


def _result_of(project: Project, stage: str) -> str:
    """What a stage leaves on disk, in words, for the sentence that names it."""
    if stage == "export":
        return f"export {project.gguf_path().name}"
    if stage == "eval":
        return f"evaluation {project.eval_json.name}"
    if stage == "train":
        return "checkpoint"
    return "result" if stage == "corpus" else "shards"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _result_step(project: Project, stage: str, ev: Any) -> int | None:
    """The training step the export (or the evaluation) on disk is of: eval.json says its GGUF's; a GGUF at
    least as new as best.pt is best.pt's export; else unknown (reading the GGUF's header is not for status)."""
    evaluated = ev.get("trained_steps") if isinstance(ev, dict) else None
    gguf, at = _mtime(project.gguf_path()), _mtime(project.eval_json)
    if isinstance(evaluated, int) and (stage == "eval" or (gguf is not None and at is not None and at >= gguf)):
        return evaluated
    best, best_at = checkpoints.read_sidecar(project, checkpoints.BEST), checkpoints.mtime(project, checkpoints.BEST)
    if stage == "export" and best and gguf is not None and best_at is not None and gguf >= best_at:
        return best.trained_steps
    return None


def stale_reason(project: Project, stage: str, last: checkpoints.Sidecar | None, ev: Any) -> str | None:
    """Why the export or evaluation on disk no longer stands, in words: it is of a shorter training than the one
    planned now, or older than what it comes from. None for the other stages, and when there is none on disk."""
    planned = project.settings.train.steps
    result = {"export": project.gguf_path(), "eval": project.eval_json}.get(stage)
    if result is None or not result.is_file():
        return None
    if last is None or last.trained_steps < planned:
        step = _result_step(project, stage, ev)
        return (f"from step {step}" if step is not None else "from an earlier checkpoint") + \
            f"; training goes on to {planned}"
    if stage == "export" and not export_current(project):
        best = checkpoints.read_sidecar(project, checkpoints.BEST)
        return "older than the best checkpoint" + (f" (step {best.trained_steps})" if best else "")
    if stage == "eval" and stage_done(project, "export"):
        return f"older than {project.gguf_path().name}"
    return None


def _train_figures(entry: dict[str, Any], last: checkpoints.Sidecar | None, planned: int) -> dict[str, Any]:
    """The train stage's figures when it is not running now: the last checkpoint's step (where a resume starts)
    of the saved count (where it goes). The entry's own are the last log of the run that ended, and its
    count the one in force then: a count applied since is not in them, nor the steps after the last log."""
    out = {k: v for k, v in entry.items() if k not in ("eta_s", "rate")}
    if last is not None or "total" in entry:
        out.update(total=planned, planned_steps=planned, unit="steps")
    if last is not None:
        out.update(count=last.trained_steps, step=last.trained_steps)
    return out


def status_report(project: Project) -> dict[str, Any]:
    info = runtime_status(project)
    state = project.read_state()
    last = checkpoints.read_sidecar(project, checkpoints.LAST)
    ev = read_json(project.eval_json, None)
    # the trainer runs now: its entry is this stage's own (the driver writes it afresh when the stage starts).
    # Not while a new driver has yet to write state.json: the stage and entry there are the last run's
    training = info["status"] == "running" and state.get("status") == "running" and state.get("stage") == "train"
    stages = []
    for spec in STAGES:
        entry = state.get("stages", {}).get(spec.name, {})
        done = stage_done(project, spec.name)
        recorded = entry.get("status", "-")
        if spec.name == "train" and not training:
            entry = _train_figures(entry, last, project.settings.train.steps)
        if recorded == "failed" and done:
            # its last run failed (a forced export, say) while an earlier result still stands: failed, and that
            # result named as the one on disk, never the green "done"
            entry = {**entry, "kept": f"the previous {_result_of(project, spec.name)} is still on disk"}
        # done once, but what it made is gone or older than its inputs now (a later stage failed, a resume
        # trained further): "stale", never the green "done" of results that no longer stand; so is an export or
        # evaluation on disk that no longer stands where state.json has no record of the stage (a reset state)
        why = None if done or recorded not in ("done", "-") else stale_reason(project, spec.name, last, ev)
        shown = "failed" if recorded == "failed" else "done" if done else \
            "stale" if recorded == "done" or why else recorded
        if why:          # the card and the CLI say why, instead of the finished run's progress
            entry = {**{k: v for k, v in entry.items() if k not in ("count", "total", "unit", "eta_s")},
                     "detail": why}
        stages.append({"name": spec.name, "title": spec.title, "done": done, "status": shown,
                       **({} if shown == "done" else {k: entry[k] for k in STAGE_DETAILS if k in entry})})
    best = checkpoints.read_sidecar(project, checkpoints.BEST)
    return {"project": str(project.root), "pack": project.pack.id, "name": project.settings.name,
            "status": info["status"], "pid": info["pid"], "stage_pid": info["stage_pid"],
            "run": state.get("run"), "stage": state.get("stage"), "error": state.get("error"),
            "hf_token": token_store.describe(project.settings.hf_token),      # where it comes from, never what
            "planned_steps": project.settings.train.steps, "stages": stages, "start": describe_start(project),
            "checkpoints": {"last": last and last.to_dict(), "best": best and best.to_dict()},
            "export": str(project.gguf_path()),
            "ggk_command": project.pack.ggk_command(project) if project.gguf_path().is_file() else None,
            "ggk_edit_args": project.pack.ggk_edit_args,
            "snapshots": read_manifest(project), "snapshot_job": job_status(project),
            "outputs": output_files(project), "kept_steps": checkpoints.kept_steps(project),
            "eval": ev, "metric_names": list(project.pack.metric_names),
            # how to read it (the pack's judge); whether its targets were the mock teacher's (the val shards it scored
            # were written under a " mock-teacher" contract, or the project runs the mock now) or a demo's stand-ins
            "eval_guide": project.pack.judge.to_dict() if project.pack.judge else None,
            "eval_mock": mock_enabled(project) or (read_contract(project, "val") or "").endswith(" mock-teacher"),
            "eval_demo": is_demo(project),
            "plan": planned_vs_actual(project),
            "materials": [m.to_dict() for m in all_statuses(project, online=False)]}
