"""The bridge's slot targets by a plain transformers forward, written apart from the teacher (teacher.py): the
conformance suite compares them with the rows the shards store (TrainerPack.reference_forward). Text samples,
one alone: transformers' own `Qwen3_5Model` over the MOSS template string as the snapshot's tokenizer reads it,
`last_hidden_state`, one row per template token."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["moss_reference"]


def moss_reference(project: "ProjectFolder", samples: list[Any]) -> list[Any]:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from trainer_core.packs.lookup import require_material
    from trainer_core.packs.qwen35_bridge.template import prompt_string
    root = require_material(project, "teacher")
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    model = AutoModel.from_pretrained(root, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for sample in samples:
            ids = tokenizer.encode(prompt_string(sample["text"], []), add_special_tokens=False).ids
            out.append(model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0])
    return out
