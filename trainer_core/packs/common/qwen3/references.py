"""The Qwen3 families' targets by a plain transformers forward, written apart from the teacher (qwen3/teacher.py):
the conformance suite compares them with the rows a pack's shards store (TrainerPack.reference_forward)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["qwen3_reference", "template_ids"]


def template_ids(project: "ProjectFolder", root: Any, samples: list[Any]) -> list[list[int]]:
    """Each sample's template ids by the teacher snapshot's own tokenizer over the whole template string (the
    emphasis syntax removed), cut as the pack cuts it."""
    from tokenizers import Tokenizer

    from trainer_core.packs.common.qwen_chat import fit_template
    from trainer_core.packs.lookup import teacher_prompt
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    texts = [s["text"] if isinstance(s, dict) else s for s in samples]
    return [fit_template(tokenizer.encode(teacher_prompt(project.pack, t), add_special_tokens=False).ids,
                         project.pack.max_len_student) for t in texts]


def qwen3_reference(project: "ProjectFolder", samples: list[Any]) -> list[Any]:
    """Per sample alone (no batch, no pads): `Qwen3Model`'s hidden_states at the pack's taps, stacked, one row per
    template token (float32, CPU)."""
    import torch
    from transformers import AutoModel

    from trainer_core.packs.lookup import require_material
    root = require_material(project, "teacher")
    model = AutoModel.from_pretrained(root, dtype=torch.float32).eval()
    taps = project.pack.taps_of(int(model.config.num_hidden_layers))
    out = []
    with torch.no_grad():
        for ids in template_ids(project, root, samples):
            states = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False).hidden_states
            out.append(torch.cat([states[k][0] for k in taps], dim=-1))
    return out
