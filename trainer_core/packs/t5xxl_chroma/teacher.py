"""The Chroma teacher: T5-XXL v1.1's encoder over the whole 512-slot window with no key mask (template.py).

The snapshot, the tokenizer, the loading (eager attention, bf16 on CUDA, float32 on the CPU) and the
placement (`precompute.teacher_mode`) are the PixArt teacher's (common/t5/teacher.py). What differs is what
the engine does for Chroma: the window has 512 slots, the encoder runs over all of them with every slot a
key (the real rows see the pads), and the rows kept per prompt are the real slots, EOS and the first pad
slot. Because the pads are keys, every batch runs the full window, so a prompt's rows never depend on the
batch it ran in.

`choose_mode` and `resident_need_gib` are the T5 placement rule this teacher takes (TrainerPack.teacher_class:
the plan asks them through this module). `MockChromaTeacher` gives deterministic synthetic rows of the same
shapes with no file.
"""
from __future__ import annotations

from typing import Sequence

import torch

from trainer_core.packs.common.t5.teacher import MockT5Teacher, T5Teacher, choose_mode, resident_need_gib
from trainer_core.packs.t5xxl_chroma.template import CHROMA_WINDOW, supervised_lens

__all__ = ["ChromaTeacher", "MockChromaTeacher", "choose_mode", "resident_need_gib"]


def _longest(ids: torch.Tensor, lens: torch.Tensor, window: int) -> int:
    """The batch's longest supervised length, after checking ids are whole windows and lens fit them."""
    if ids.dim() != 2 or ids.shape[1] != window or lens.shape != ids.shape[:1]:
        raise ValueError(f"expected ids [B, {window}] and lens [B], got {list(ids.shape)} and {list(lens.shape)}")
    if ids.shape[0] == 0:
        return 0
    longest = int(lens.max())
    if int(lens.min()) < 1 or longest > window:
        raise ValueError(f"every len must be in 1..{window}, got {int(lens.min())}..{longest}")
    return longest


class ChromaTeacher(T5Teacher):
    """T5Teacher (the same snapshot and placement) over Chroma's unmasked 512-slot window."""

    window = CHROMA_WINDOW

    def seed_windows(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids LongTensor [B, 512], lens LongTensor [B]): the engine's window of each raw prompt (pieces + EOS,
        cut to 511 + EOS, padded with 0) and its supervised rows, min(real + 1, 512)."""
        ids, real = self.tokenizer.windows(prompts, self.window)
        return ids, supervised_lens(real, self.window)

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """last_hidden_state [B, L, out_dim] float32 on the CPU for L = max(lens), of the encoder run over the
        whole window with no attention mask (every slot a key, as the engine runs it)."""
        longest = _longest(ids, lens, self.window)
        if longest == 0:
            return torch.zeros(0, 0, self.out_dim)
        with torch.inference_mode(), torch.autocast(self.device.type, torch.bfloat16,
                                                    enabled=self.device.type == "cuda"):
            hidden = self.model(input_ids=ids.to(self.device)).last_hidden_state     # [B, 512, out]
        return hidden[:, :longest].to("cpu", torch.float32)                         # [B, L, out]


class MockChromaTeacher(MockT5Teacher):
    """MockT5Teacher's rows over a 512-slot window, with Chroma's supervised lengths (real + 1, at most 512)."""

    def __init__(self, out_dim: int, vocab_size: int, window: int = CHROMA_WINDOW):
        super().__init__(out_dim, vocab_size, window)

    def seed_windows(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, real = super().seed_windows(prompts)
        return ids, supervised_lens(real, self.window)
