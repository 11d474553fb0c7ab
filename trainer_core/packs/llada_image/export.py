"""The LLaDA pack's SigVQ export: the vision encoder's safetensors as an f16 GGUF beside the
adapter, so the engine's `--llm_vision` finds it (`<export base>_sigvq-f16.gguf`, the export base
being the adapter name without its `_adapter` suffix).

Every tensor keeps its safetensors name and is cast to f16; the engine reads no KVs. The file
is written atomically and read back before the rename, and skipped when it is newer than the
safetensors it came from.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.packs.base import ExportExtras
from trainer_core.packs.lookup import resolve_material

if TYPE_CHECKING:  # the project layer sits above this one
    from trainer_core.base.folder import ProjectFolder

__all__ = ["sigvq_source", "sigvq_path", "export_sigvq", "SigVQExtras"]


def sigvq_source(project: ProjectFolder) -> Path | None:
    root = resolve_material(project, "sigvq")
    path = root / "sigvq" / "diffusion_pytorch_model.safetensors" if root else None
    return path if path is not None and path.is_file() else None


def sigvq_path(project: ProjectFolder) -> Path:
    name = project.settings.name
    base = name[: -len("_adapter")] if name.endswith("_adapter") else name
    return project.output_dir() / f"{base}_sigvq-f16.gguf"


def export_sigvq(project: ProjectFolder) -> tuple[Path | None, str]:
    """(the GGUF or None, what happened: "written", "current", "no source" or "off")."""
    if not project.settings.export.export_sigvq:
        return None, "off"
    source = sigvq_source(project)
    if source is None:
        return None, "no source"
    out = sigvq_path(project)
    if out.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        return out, "current"
    import gguf
    import numpy as np
    from safetensors import safe_open

    from trainer_core.contract.gguf_io import write_gguf   # lazy: torch stays out of the pack's import
    out.parent.mkdir(parents=True, exist_ok=True)
    with safe_open(str(source), framework="pt") as f:
        names = list(f.keys())

        def check(tmp: Path) -> None:
            written = {t.name for t in gguf.GGUFReader(tmp).tensors}
            if written != set(names):
                raise OSError(f"{out.name}: {len(set(names) - written)} tensors missing after writing")
        # read from the open file inside the call; checked before the rename
        tensors = ((name, np.ascontiguousarray(f.get_tensor(name).float().numpy().astype(np.float16)))
                   for name in names)
        write_gguf(out, "sigvq", tensors, check=check)
    return out, "written"


class SigVQExtras(ExportExtras):
    """The SigVQ GGUF beside the adapter (`export.export_sigvq`), what `inspect` says of it, and where it is."""

    def write(self, project: "ProjectFolder", report: Any) -> None:
        sigvq, what = export_sigvq(project)
        if what == "written":
            report("artifact", path=str(sigvq), kind="sigvq_gguf", size=sigvq.stat().st_size)
        elif what == "current":
            report("log", level="info", message=f"{sigvq.name} is up to date")
        elif what == "no source":
            report("log", level="info", message="SigVQ not exported: the optional sigvq material is not on disk "
                                                "(download it to get the editing encoder)")

    def outputs(self, project: "ProjectFolder") -> list[Path]:
        path = sigvq_path(project)
        return [path] if path.is_file() else []

    def describe(self, path: Path, kvs: Mapping[str, Any]) -> dict[str, Any] | None:
        """<name>_sigvq-f16.gguf: the SigVQ image tokenizer the engine's --llm_vision loads (the snapshot's
        tensors as they are, f16)."""
        if kvs.get("general.architecture") != "sigvq":
            return None
        from trainer_core.contract.gguf_io import read_gguf_tensors
        names = set(read_gguf_tensors(path))
        missing = [n for n in ("patch_embed.proj.weight", "quantizer.codebook") if n not in names]
        return {"kind": "vision", "variant": "LLaDA-Image SigVQ image tokenizer (for --llm_vision)",
                "config": {"tensors": len(names)},
                "problems": [{"message": f"it lacks {', '.join(missing)}; export it again from the snapshot",
                              "fatal": True}] if missing else []}
