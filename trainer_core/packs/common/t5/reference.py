"""The T5 families' targets by a plain transformers forward, written apart from the teacher (t5/teacher.py): the
conformance suite compares them with the rows a pack's shards store (TrainerPack.reference_forward)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["t5_reference"]


def t5_reference(project: "ProjectFolder", samples: list[Any]) -> list[Any]:
    """Per prompt alone: `T5EncoderModel` over the pack's whole window (the engine's T5 ids), with the key mask of
    the real slots or — a family whose engine passes none (Chroma) — without one; the rows the DiT reads (the real
    slots and `dit_pad_slots` more). [rows, d_model] float32."""
    import torch
    from transformers import T5EncoderModel

    from trainer_core.contract.engine_t5 import EngineT5
    from trainer_core.packs.lookup import require_material
    pack = project.pack
    root = require_material(project, "teacher")
    tokenizer = EngineT5.from_folder(root)
    model = T5EncoderModel.from_pretrained(root, dtype=torch.float32, attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for text in samples:
            ids, real = tokenizer.windows([text], pack.window)                   # [1, window], [1]
            n = int(real[0])
            mask = (torch.arange(pack.window)[None] < n).long() if pack.key_mask else None
            rows = model(input_ids=ids, attention_mask=mask).last_hidden_state[0]
            out.append(rows[:min(n + pack.dit_pad_slots, pack.window)])
    return out
