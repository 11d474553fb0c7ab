"""`gguf-trainer inspect`: what a GGUF is (adapter or pig_clip student), its shape and its problems."""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from trainer_core.contract.gguf_io import PREFIX, STUDENT_MARKER, layout_of, read_gguf_kvs, read_gguf_tensors

__all__ = ["describe_gguf", "STUDENT_MARKER"]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def describe_gguf(path: str | os.PathLike) -> dict[str, Any]:
    """{kind, tensors, dtypes, kvs, problems, ...}: problems are sentences, `fatal` says whether the
    engine would misread the file (adapters) or could not use it as a student."""
    path = Path(path)
    tensors = read_gguf_tensors(path)
    info: dict[str, Any] = {
        "file": str(path), "size": path.stat().st_size, "tensors": len(tensors),
        "dtypes": dict(Counter(t.dtype for t in tensors.values())), "kvs": read_gguf_kvs(path),
    }
    if any(name.startswith(PREFIX) for name in tensors):
        config, problems = layout_of(tensors)
        info.update(kind="adapter", variant=config.kind if config else None,
                    config=config.to_dict() if config else None,
                    heads=config.heads if config else None,
                    problems=[{"message": p.message, "fatal": p.fatal} for p in problems])
        if config is not None:
            info["config"].update(config.spec.describe(config, tensors))     # what the kind adds (Ming's vis_bridge)
        return info
    if STUDENT_MARKER in tensors:
        info.update(kind="student", **_describe_student(tensors))
        return info
    from trainer_core.packs import PACKS
    for pack in PACKS.values():              # a file a pack's export writes beside the adapter
        described = pack.extras.describe(path, info["kvs"])
        if described is not None:
            info.update(pack=pack.id, **described)
            return info
    info.update(kind="unknown", problems=[{
        "message": "neither adapter.* tensors nor a Qwen3 student (model.layers.0.self_attn.q_proj.weight)",
        "fatal": True}])
    return info


def _describe_student(tensors: dict) -> dict[str, Any]:
    problems = []
    embed = tensors.get("model.embed_tokens.weight")
    layers = sorted({int(m.group(1)) for n in tensors if (m := _LAYER.match(n))})
    if embed is None:
        problems.append({"message": "model.embed_tokens.weight is missing", "fatal": True})
    if "model.norm.weight" not in tensors:
        problems.append({"message": "model.norm.weight (the final norm, the student's tap) is missing",
                         "fatal": True})
    if layers and layers != list(range(len(layers))):
        problems.append({"message": f"the layers are not numbered 0..{len(layers) - 1} without gaps",
                         "fatal": True})
    linear_attn = [n for n in tensors if "linear_attn" in n or "ssm" in n]
    if linear_attn:
        problems.append({"message": f"{linear_attn[0]} is a linear-attention tensor; pig_clip is a plain "
                                    f"Qwen3 model", "fatal": True})
    others = [n for n in tensors if not n.startswith("model.") and n != "lm_head.weight"]
    if others:
        problems.append({"message": f"{others[0]} is not a Qwen3 tensor", "fatal": True})
    up = tensors.get("model.layers.0.mlp.up_proj.weight")
    return {
        "variant": "qwen3_student",
        "config": {"hidden_size": embed.shape_ne[0] if embed else None,
                   "vocab_size": embed.shape_ne[1] if embed else None,
                   "num_hidden_layers": len(layers),
                   "intermediate_size": up.shape_ne[1] if up else None},
        "problems": problems,
    }
