"""Export stage: best.pt → <output_dir>/<name>-f16.gguf (+ a copy to export.copy_to).

    python -m trainer_core.stages.export --project DIR

The pipeline reruns it only when best.pt is newer than the GGUF (or with --force).
"""
from __future__ import annotations

import sys
from typing import Callable

from trainer_core.base.errors import TrainerError
from trainer_core.base.events import Report
from trainer_core.contract.adapter_export import copy_export, export_checkpoint, load_checkpoint
from trainer_core.project import Project
from trainer_core.stages.base import never, stage_main

__all__ = ["run", "ggk_command"]


def ggk_command(project: Project) -> str:
    """The engine command line that uses the export (the student file as picked for training)."""
    student = project.pack.resolve_material(project, "student")
    args = project.pack.ggk_command(str(project.gguf_path()))
    if student is not None:
        args = args.replace("pig_clip-q8_0.gguf", str(student))
    if "{sigvq}" in args:                      # LLaDA: the vision encoder exported beside the adapter
        from trainer_core.packs.llada_image.sigvq import sigvq_path
        args = args.replace("{sigvq}", str(sigvq_path(project)))
    return "ggk diffuser engine -- --diffusion-model MODEL.gguf --vae VAE.gguf " + args + ' -p "a prompt" -o out.png'


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never) -> str:
    best = project.checkpoints_dir / "best.pt"
    if not best.is_file():
        raise TrainerError("There is nothing to export: checkpoints/best.pt does not exist yet (train first).")
    ck = load_checkpoint(best)
    out = export_checkpoint(project, ck, project.gguf_path(), "best", snapshot=False)
    report("artifact", path=str(out), kind="gguf", step=int(ck["step"]), size=out.stat().st_size)
    if project.settings.export.copy_to:
        copy = copy_export(out, project.settings.export.copy_to)
        report("artifact", path=str(copy), kind="gguf_copy", size=copy.stat().st_size)
    if project.pack.id == "llada_image":
        from trainer_core.packs.llada_image.sigvq import export_sigvq
        sigvq, what = export_sigvq(project)
        if what == "written":
            report("artifact", path=str(sigvq), kind="sigvq_gguf", size=sigvq.stat().st_size)
        elif what == "current":
            report("log", level="info", message=f"{sigvq.name} is up to date")
        elif what == "no source":
            report("log", level="info", message="SigVQ not exported: the optional sigvq material is not on disk "
                                                "(download it to get the editing encoder)")
    report("log", level="info", message=f"use it: {ggk_command(project)}")
    if project.pack.ggk_edit_args:
        report("log", level="info", message=f"to edit images, add: {project.pack.ggk_edit_args}")
    return "done"


if __name__ == "__main__":
    sys.exit(stage_main("export", run))
