"""The Qwen3-VL families' targets by a plain transformers forward, written apart from the teachers
(qwen3vl/taps_teacher.py, qwen3vl/teacher.py): the conformance suite compares them with the rows a pack's shards
store (TrainerPack.reference_forward). Text samples only: the packs' own tests hold the vision path."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["layerwise_reference", "vision_text_reference"]


def layerwise_reference(project: "ProjectFolder", samples: list[Any]) -> list[Any]:
    """Per sample alone: `Qwen3VLModel`'s hidden_states at the pack's taps, stacked, over the template ids and —
    when the pack's shards store one — one pad (<|endoftext|>) masked out of attention at the engine's pad
    position (FLUX.3 Klein: 1, on every M-RoPE axis). [rows, taps · width] float32."""
    import torch
    from transformers import AutoModel

    from trainer_core.packs.common.qwen3.references import template_ids
    from trainer_core.packs.common.qwen_chat import PAD_ID
    from trainer_core.packs.lookup import require_material
    pack = project.pack
    root = require_material(project, "teacher")
    model = AutoModel.from_pretrained(root, dtype=torch.float32).eval()
    taps = pack.taps_of(int(model.config.text_config.num_hidden_layers))
    out = []
    with torch.no_grad():
        for ids in template_ids(project, root, samples):
            pads = pack.pads.stored
            mask = torch.tensor([[1] * len(ids) + [0] * pads])
            positions = torch.tensor([list(range(len(ids))) + [pack.pads.position] * pads])
            states = model(input_ids=torch.tensor([ids + [PAD_ID] * pads]), attention_mask=mask,
                           position_ids=positions[None].expand(3, -1, -1), output_hidden_states=True,
                           use_cache=False).hidden_states
            out.append(torch.cat([states[k][0] for k in taps], dim=-1))
    return out


def vision_text_reference(project: "ProjectFolder", samples: list[Any]) -> list[Any]:
    """Text samples of a token-aligned vision pack, alone: the text stack's rows over the text-to-image template
    — its final norm over plain positions (MageFlow's reduced path: `last_hidden_state`) or, for a teacher tapped
    before the final norm (Qwen-Image 2.1), the last decoder layer's output (a forward hook on it) — every row
    stored. [rows, width] float32."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from trainer_core.packs.lookup import require_material
    pack = project.pack
    root = require_material(project, "teacher")
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    lm = AutoModel.from_pretrained(root, dtype=torch.float32).language_model.eval()
    captured: list[Any] = []
    lm.layers[-1].register_forward_hook(lambda module, args, output: captured.append(
        output[0] if isinstance(output, tuple) else output))
    out = []
    with torch.no_grad():
        for sample in samples:
            text = "".join(pack.student_chunks(sample["text"] if isinstance(sample, dict) else sample))
            ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False).ids])
            captured.clear()
            final = lm(input_ids=ids, use_cache=False).last_hidden_state[0]
            out.append(captured[-1][0] if pack.tap == "pre_norm_last_layer" else final)
    return out
