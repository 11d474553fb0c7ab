"""What Ming's export writes beside the adapter: the input-image encoder `<name>_vision-<quant>.gguf`
(`--llm_vision` for editing and layers) from the teacher's mllm/ tensors, after fitting the adapter's
vis_bridge when a stock mmproj is picked (bridge_fit.py); what `inspect` says of that file. Light: the
registry imports it with the pack, torch only inside the methods."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.base import ExportExtras
from trainer_core.packs.lookup import resolve_material

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["MingExtras", "vision_path"]


def vision_path(project: "ProjectFolder") -> Path:
    """Where the vision GGUF goes: beside the adapter, pig_ming_adapter → pig_ming_vision-f16.gguf."""
    from trainer_core.packs.ming_image.export import vision_gguf_name
    base = project.settings.name.removesuffix("_adapter")
    return project.gguf_path().with_name(vision_gguf_name(project.settings.export.vision_quant, base))


class MingExtras(ExportExtras):
    def stale(self, project: "ProjectFolder") -> bool:
        from trainer_core.packs.ming_image.bridge_fit import bridge_stale
        return bridge_stale(project)

    def prepare(self, project: "ProjectFolder", report: Any, should_stop: Callable[[], bool]) -> bool:
        """Fit the vis_bridge when a stock mmproj is picked (bridge_fit.py)."""
        from trainer_core.packs.ming_image.bridge_fit import ensure_vis_bridge
        return ensure_vis_bridge(project, report, should_stop)

    def write(self, project: "ProjectFolder", report: Any) -> None:
        """The vision GGUF beside the adapter, from the teacher's mllm/ tensors; skipped while it is newer than
        them."""
        from trainer_core.packs.ming_image.export import export_vision_gguf
        from trainer_core.packs.ming_image.vision import mllm_folder
        e = project.settings.export
        if not e.export_vision:
            return
        root = resolve_material(project, "teacher")
        if not any(mllm_folder(root).glob("model*.safetensors")):
            report("log", level="info", message="vision GGUF not exported: the teacher's mllm/ weights are not on "
                                                "disk (download the teacher to edit images with the adapter)")
            return
        done = export_vision_gguf(root, vision_path(project), e.vision_quant, source=project.pack.teacher_repo)
        if done.skipped:
            report("log", level="info", message=f"{done.path.name} is up to date")
        else:
            report("artifact", path=str(done.path), kind="vision_gguf", size=done.bytes)

    def outputs(self, project: "ProjectFolder") -> list[Path]:
        path = vision_path(project)
        return [path] if path.is_file() else []

    def describe(self, path: Path, kvs: Mapping[str, Any]) -> dict[str, Any] | None:
        """pig_ming_vision-*.gguf: the input-image encoder for --llm_vision, with what ggk reads from it."""
        from trainer_core.packs.ming_image.export import KV_QUANT, KV_SOURCE, check_vision_gguf
        if KV_SOURCE not in kvs:
            return None
        try:
            c = check_vision_gguf(path)
        except ModelFileError as e:
            return {"kind": "vision", "variant": "Ming-Image input-image encoder", "config": {},
                    "problems": [{"message": str(e), "fatal": True}]}
        return {"kind": "vision", "variant": "Ming-Image input-image encoder (Qwen2.5-VL tower + linear_proj, "
                                            "for --llm_vision)",
                "config": {"layers": c.layers, "hidden": c.hidden, "out_hidden": c.out_hidden, "vis_dim": c.vis_dim,
                           "patch_size": c.patch_size, "quant": kvs.get(KV_QUANT), "source": kvs[KV_SOURCE]},
                "problems": []}
