"""Export stage: best.pt → <output_dir>/<name>-f16.gguf (+ a copy to export.copy_to).

    python -m trainer_core.stages.export --project DIR

The pipeline reruns it only when best.pt is newer than the GGUF (or with --force). It first removes
the temp files (`.<name>.*.tmp`, base/atomic.py) of this project's exports (and of its model card,
stages/model_card.py, which it rewrites after the GGUF) that a kill left behind;
a snapshot job's temps (`<name>-step<N>-f16.gguf`) are the job's and are left alone.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from trainer_core.base.atomic import remove_stale_temps
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import Report
from trainer_core.contract import checkpoints
from trainer_core.contract.adapter_export import copy_export, export_checkpoint
from trainer_core.project import Project
from trainer_core.stages.base import exit_process, never, stage_main
from trainer_core.stages.model_card import write_card

__all__ = ["run", "remove_temps"]


def remove_temps(project: Project) -> list[Path]:
    """Delete leftover temps of the files this stage writes: the GGUF, its export.copy_to copy and
    the pack's extra outputs. The run lock means no other export of this project is writing them."""
    targets = [project.gguf_path(), *project.pack.extras.outputs(project), project.card_path(),
               project.card_plot_path()]
    if project.settings.export.copy_to:
        # where copy_export puts it
        targets.append(Path(os.path.expanduser(project.settings.export.copy_to)) / project.gguf_path().name)
    return remove_stale_temps(*targets)


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never) -> str:
    stale = remove_temps(project)
    if stale:
        report("log", level="info", message=f"removed {len(stale)} temp file(s) of an export a kill interrupted: "
                                            f"{', '.join(str(p) for p in stale)}")
    if not checkpoints.exists(project, checkpoints.BEST):
        raise TrainerError("There is nothing to export: checkpoints/best.pt does not exist yet (train first).")
    ck = checkpoints.load(project, checkpoints.BEST, mmap=True)
    if not project.pack.extras.prepare(project, report, should_stop):      # e.g. Ming's vis_bridge fit
        return "stopped"
    out = export_checkpoint(project, ck, project.gguf_path(), "best", snapshot=False)
    report("artifact", path=str(out), kind="gguf", step=int(ck["step"]), size=out.stat().st_size)
    if project.settings.export.copy_to:
        copy = copy_export(out, project.settings.export.copy_to)
        report("artifact", path=str(copy), kind="gguf_copy", size=copy.stat().st_size)
    project.pack.extras.write(project, report)        # e.g. LLaDA's SigVQ GGUF beside the adapter
    card = write_card(project)                         # before its evaluation: "not evaluated yet"
    if card is not None:
        report("artifact", path=str(card), kind="card")
    report("log", level="info", message=f"use it: {project.pack.ggk_command(project)}")
    if project.pack.ggk_edit_args:
        report("log", level="info", message=f"to edit images, add: {project.pack.ggk_edit_args}")
    return "done"


if __name__ == "__main__":
    exit_process(stage_main("export", run))
