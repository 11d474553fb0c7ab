"""Resets: delete what a stage produced, and everything that depends on it.

    state    state.json only (files kept)
    train    checkpoints/, eval.json and the snapshot manifest and job files
    shards   shards/ + train
    corpus   data/ + shards + train
    output   this project's exported GGUFs in the output folder (final and step-tagged), its model card
             and plot;
             never the folder, never the copies in export.copy_to

Refused while the pipeline or a snapshot job runs. Materials are never touched.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from trainer_core.base.errors import AlreadyRunningError, UsageError
from trainer_core.base.locks import FileLock
from trainer_core.project import Project, new_state

__all__ = ["planned_deletions", "RESETS", "reset"]

RESETS = ("state", "train", "shards", "corpus", "output")
_SNAPSHOT_FILES = (".snapshot.status", ".snapshot.pid")


def _targets(project: Project, what: str) -> list[Path]:
    train = [project.checkpoints_dir, project.eval_json, project.snapshots_json,
             *(project.root / n for n in _SNAPSHOT_FILES)]
    if what == "train":
        return train
    if what == "shards":
        return [project.root / "shards", *train]
    if what == "corpus":
        return [project.data_dir, project.root / "shards", *train]
    if what == "output":
        out = project.output_dir()
        name = project.settings.name
        return [project.gguf_path(), *sorted(out.glob(f"{name}-step*-f16.gguf")), project.card_path(),
                project.card_plot_path()]
    return []


def planned_deletions(project: Project, what: str) -> list[Path]:
    """What `reset(project, what)` would delete now (the paths that exist): the GUI's
    confirmation lists them."""
    if what not in RESETS:
        raise UsageError(f'"{what}" is not a reset; choose one of: {", ".join(RESETS)}.')
    return [p for p in _targets(project, what) if p.exists()]


def reset(project: Project, what: str) -> list[Path]:
    """Delete what `what` names; returns the paths removed."""
    if what not in RESETS:
        raise UsageError(f'"{what}" is not a reset; choose one of: {", ".join(RESETS)}.')
    from trainer_core.snapshot import job_status
    if job_status(project).get("status") == "running":
        raise AlreadyRunningError("A snapshot job is running; wait for it to finish before resetting.")
    lock = FileLock(project.run_lock)
    if not lock.acquire():
        raise AlreadyRunningError("The pipeline is running; stop it before resetting.")
    try:
        removed = []
        for path in _targets(project, what):
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            else:
                continue
            removed.append(path)
        state = project.read_state()
        if what == "state":
            state = new_state()
        elif what != "output":
            dropped = {"train": ("train", "export", "eval"),
                       "shards": ("precompute_val", "precompute_train", "train", "export", "eval"),
                       "corpus": None}[what]
            state["stages"] = {} if dropped is None else {k: v for k, v in state["stages"].items() if k not in dropped}
            state.update(status="idle", error=None, stage=None)
        project.write_state(state)
        return removed
    finally:
        lock.release()
