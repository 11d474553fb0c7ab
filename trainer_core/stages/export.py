"""Export stage: best.pt → <output_dir>/<name>-f16.gguf (+ a copy to export.copy_to).

    python -m trainer_core.stages.export --project DIR

The pipeline reruns it only when best.pt is newer than the GGUF (or with --force).
"""
from __future__ import annotations

import sys
from typing import Callable

from trainer_core.base.errors import TrainerError
from trainer_core.base.events import Report
from trainer_core.contract import checkpoints
from trainer_core.contract.adapter_export import copy_export, export_checkpoint
from trainer_core.project import Project
from trainer_core.stages.base import never, stage_main

__all__ = ["run"]


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never) -> str:
    if not checkpoints.exists(project, checkpoints.BEST):
        raise TrainerError("There is nothing to export: checkpoints/best.pt does not exist yet (train first).")
    ck = checkpoints.load(project, checkpoints.BEST)
    out = export_checkpoint(project, ck, project.gguf_path(), "best", snapshot=False)
    report("artifact", path=str(out), kind="gguf", step=int(ck["step"]), size=out.stat().st_size)
    if project.settings.export.copy_to:
        copy = copy_export(out, project.settings.export.copy_to)
        report("artifact", path=str(copy), kind="gguf_copy", size=copy.stat().st_size)
    project.pack.export_extras(project, report)        # e.g. LLaDA's SigVQ GGUF beside the adapter
    report("log", level="info", message=f"use it: {project.pack.ggk_command(project)}")
    if project.pack.ggk_edit_args:
        report("log", level="info", message=f"to edit images, add: {project.pack.ggk_edit_args}")
    return "done"


if __name__ == "__main__":
    sys.exit(stage_main("export", run))
