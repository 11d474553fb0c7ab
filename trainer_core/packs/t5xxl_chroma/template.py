"""The engine contract of Chroma: the 512-slot T5 window ggk 0.9.7's T5CLIPEmbedder builds, and which of the
encoder's rows its DiT reads.

* The window (conditioning/conditioner.hpp:1371-1395, 1427-1435) is the PixArt window's rule at another
  length: the raw prompt's T5 ids (the engine's own unigram tokenizer, contract/engine_t5.py) + EOS (1),
  padded with 0 to chunk_len = 512 slots; a longer prompt keeps its first 511 ids and EOS. The same ids
  seed the adapter's 512 queries.
* The engine's T5 runs over the whole window with no key mask (`chroma_use_t5_mask` is false and the mask
  is passed only with `use_mask`, 1504-1506): every slot is a key, so a real slot's row depends on the pads
  after it. The teacher copies that (teacher.py).
* The DiT masks its text keys with c_vector, the T5 key mask with one more pad slot unmasked
  (`chroma_t5_mask_pad` 1; 1533, gk-diffuser.cpp:4389-4391, `chroma_use_dit_mask` true): it reads the real
  slots, EOS and the first pad slot, min(real + 1, 512) rows a prompt. Those are the supervised rows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the registry imports the pack's declaration, which stays free of torch
    import torch

__all__ = ["CHROMA_WINDOW", "DIT_PAD_SLOTS", "supervised_lens"]

CHROMA_WINDOW = 512   # chunk_len of T5CLIPEmbedder: the window's slots = the adapter's queries
DIT_PAD_SLOTS = 1     # chroma_t5_mask_pad: pad slots after EOS the DiT reads


def supervised_lens(real_lens: "torch.Tensor", window: int = CHROMA_WINDOW) -> "torch.Tensor":
    """The rows the DiT reads per prompt, min(real + 1, window), from the real slot counts (pieces + EOS)."""
    return (real_lens + DIT_PAD_SLOTS).clamp(max=window)
