"""The example pack's teacher: a Qwen3 text model's final-norm rows over the chat template's ids, and its mock.

`FinalNormTeacher` loads the snapshot with transformers (a `Qwen3ForCausalLM` checkpoint read as its base model),
places it by the project's `precompute.teacher_mode` (the plan asks this module's `choose_mode` and
`resident_need_gib`, the same rule), and runs a batch right-padded with <|endoftext|>, the pads masked as keys:
no real row attends to a pad, so a real row is that of the template run alone.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from trainer_core.contract.batching import pad_batch
from trainer_core.contract.devices import place_teacher
from trainer_core.packs.common.qwen_chat import PAD_ID

__all__ = ["FinalNormTeacher", "MockTeacher", "choose_mode", "resident_need_gib", "reference_rows"]

HEADROOM_GIB = 3.0                 # activations and the CUDA context next to the resident weights


def resident_need_gib(root: str | os.PathLike) -> float:
    """The weights on disk plus the headroom: what a resident teacher needs on the card."""
    return sum(p.stat().st_size for p in Path(root).glob("*.safetensors")) / 2**30 + HEADROOM_GIB


def choose_mode(root: str | os.PathLike, mode: str, device: torch.device, gpu_mem_gib: float) -> str:
    return place_teacher(mode, device, gpu_mem_gib, resident_need_gib(root))


class FinalNormTeacher:
    def __init__(self, root: str | os.PathLike, device: Any = "cpu", mode: str = "auto", gpu_mem_gib: float = 0.0):
        from tokenizers import Tokenizer
        from transformers import AutoModel
        self.root, self.device = Path(root), torch.device(device)
        self.mode = choose_mode(self.root, mode, self.device, gpu_mem_gib)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModel.from_pretrained(self.root, dtype=dtype).eval().requires_grad_(False)
        if self.mode == "offload":
            from accelerate import cpu_offload
            self.model = cpu_offload(self.model, execution_device=self.device)
        else:
            self.model = self.model.to(self.device)
        self.tokenizer = Tokenizer.from_file(str(self.root / "tokenizer.json"))
        self.out_dim = int(self.model.config.hidden_size)

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sample, its final-norm rows [len, out_dim] float32 on the CPU; one padded batch."""
        ids, mask = pad_batch(token_lists, PAD_ID)
        with torch.inference_mode():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.long().to(self.device),
                             use_cache=False).last_hidden_state
        return [out[b, :len(t)].to("cpu", torch.float32) for b, t in enumerate(token_lists)]


class MockTeacher:
    """Deterministic rows of the teacher's shape with no file: a fixed embedding of each id plus a running mean."""

    mode, tokenizer = "mock", None

    def __init__(self, out_dim: int):
        self.out_dim = int(out_dim)
        self.table = torch.randn(4096, self.out_dim, generator=torch.Generator().manual_seed(3))

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        out = []
        for tokens in token_lists:
            x = self.table[torch.tensor(list(tokens)) % 4096]                       # [len, out]
            out.append(x + torch.cumsum(x, 0) / torch.arange(1, len(tokens) + 1)[:, None])
        return out


def reference_rows(project: Any, samples: list[str]) -> list[torch.Tensor]:
    """The pack's targets by a plain transformers forward, one sample alone (the conformance suite compares them
    with the shards): the final-norm rows of the whole template string as the teacher's own tokenizer reads it."""
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from trainer_core.packs.lookup import require_material, teacher_prompt
    root = require_material(project, "teacher")
    model = AutoModel.from_pretrained(root, dtype=torch.float32).eval()
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    out = []
    with torch.no_grad():
        for text in samples:
            ids = tokenizer.encode(teacher_prompt(project.pack, text), add_special_tokens=False).ids
            out.append(model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0])
    return out
