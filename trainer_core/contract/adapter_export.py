"""Checkpoint → adapter GGUF, with the provenance of the checkpoint and the pack's KVs.

Used by the export stage (best.pt → <name>-f16.gguf), by snapshots (last / best / a kept step
→ <name>-step<N>-f16.gguf) and by the evaluation (the checkpoint's own output, for the
round trip). The same checkpoint always gives the same bytes. The pack adds its KVs, its
string arrays (the Qwen3.5 bridge's vocabulary) and its top-level tensors (Ming's tokenizer_json);
a pack that cannot provide them raises before anything is written.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_core.base.atomic import atomic_path
from trainer_core.contract.checkpoints import CheckpointError

if TYPE_CHECKING:  # torch loads only when a checkpoint is really read: the CLI stays fast
    from trainer_core.base.folder import ProjectFolder
    import torch

    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["checkpoint_model", "export_checkpoint", "copy_export"]


def checkpoint_model(ck: dict[str, Any]) -> tuple["AdapterConfig", "torch.nn.Module"]:
    from trainer_core.contract.kinds import AdapterConfig, build_adapter
    config = AdapterConfig.from_dict(ck["config"])
    model = build_adapter(config, init=False)                  # every weight comes from the checkpoint
    # assign: the checkpoint's (f32, possibly mapped) tensors become the weights, no second copy
    model.load_state_dict({k: v.float() for k, v in ck["model"].items()}, assign=True)
    return config, model.eval()


def export_checkpoint(project: ProjectFolder, ck: dict[str, Any], out: Path, checkpoint: str, snapshot: bool) -> Path:
    """Write the checkpoint as the engine's adapter GGUF (atomic, read back before the rename)."""
    from trainer_core.contract.gguf_io import Provenance, write_adapter_gguf
    config, model = checkpoint_model(ck)
    pack = project.pack
    val = ck.get("val") or {}
    val_cos = val.get("val_cos")
    best = ck.get("best_val_cos")
    provenance = Provenance(
        trained_steps=int(ck["step"]), planned_steps=int((ck.get("train_config") or {}).get("steps", ck["step"])),
        checkpoint=checkpoint, snapshot=snapshot,
        val_cos=float(val_cos) if val_cos is not None else None,
        best_val_cos=float(best) if best is not None and math.isfinite(best) and best > -1 else None)
    contents = pack.export_contents(project, config)         # raises before anything is written
    # "mu"/"sigma" are the (first) head's statistics; a kind with a second head keeps its own apart
    fold = {"mu": ck["mu"].float(), "sigma": ck["sigma"].float()} if config.spec.standardized else {}
    if config.spec.bank_head(config) is not None:
        if ck.get("mu_bank") is None or ck.get("sigma_bank") is None:
            raise CheckpointError(f"The {checkpoint} checkpoint has a bank head but no bank statistics "
                                  f"(mu_bank, sigma_bank); train it again with this version.")
        fold.update(bank_mu=ck["mu_bank"].float(), bank_sigma=ck["sigma_bank"].float())
    return write_adapter_gguf(out, model, config, name=project.settings.name, pack=pack.id,
                              provenance=provenance, pack_kvs=dict(contents.kvs), arrays=dict(contents.arrays),
                              extra=dict(contents.tensors), **fold)


def copy_export(src: Path, folder: str) -> Path:
    """Copy the final export to export.copy_to (e.g. the user's ggk model folder), atomically."""
    dest = Path(os.path.expanduser(folder)) / src.name
    with atomic_path(dest, needs=src.stat().st_size) as tmp:
        shutil.copyfile(src, tmp)
    return dest
