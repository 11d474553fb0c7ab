"""FLUX.3 Klein's text conditioning (ggk ≥ 0.9.5, conditioner.hpp; packs-contract-more §D.3), which two packs
read: the FLUX.3 Klein pack (its adapter) and the Qwen3.5 bridge (its Klein bank).

* **Template.** The Qwen chat template (qwen_chat.py): no system turn, no `<think>` block, every row goes to
  the DiT.
* **Pads.** The sequence is right-padded with <|endoftext|> to the next multiple of 80 rows (none when it
  already is one). Pads sit at rope position 1, are masked as attention keys (causal otherwise) and are kept
  as rows: the DiT reads them. Real rows take positions 0 … n−1. Every pad row of a sample is therefore the
  same state, for the teacher and for the student alike, and a shard keeps one.
* **Taps.** The teacher target of a row is Qwen3-VL's hidden_states[k] (the output of decoder layer k−1,
  before any norm) for the 8 taps k, stacked in ascending order along the features. For the 36-layer
  Qwen3-VL-4B they are 4, 8, …, 32: `taps_for` spreads 8 taps the same way over any depth (the tiny demo
  teacher's 9 layers give 1 … 8).
"""
from __future__ import annotations

from trainer_core.base.errors import ModelFileError

__all__ = ["PAD_POSITION", "PAD_MULTIPLE", "N_TAPS", "TAPS", "ENGINE_MAX_TOKENS", "taps_for", "padded_length",
           "tap_text"]

PAD_POSITION = 1
PAD_MULTIPLE = 80
N_TAPS = 8
TAPS = (4, 8, 12, 16, 20, 24, 28, 32)
ENGINE_MAX_TOKENS = 4096        # the engine's cut of the whole sequence


def taps_for(n_layers: int) -> tuple[int, ...]:
    """The 8 tapped layers of a teacher with `n_layers` decoder layers: k·n // 9 for k = 1 … 8
    (4, 8, …, 32 for Qwen3-VL-4B's 36)."""
    if n_layers < N_TAPS + 1:
        raise ModelFileError(f"The teacher has {n_layers} decoder layers; FLUX.3 Klein stacks {N_TAPS} "
                             f"intermediate layers, so it needs at least {N_TAPS + 1}.")
    return tuple(k * n_layers // (N_TAPS + 1) for k in range(1, N_TAPS + 1))


def padded_length(n_real: int, multiple: int = PAD_MULTIPLE) -> int:
    """The rows the engine hands the adapter for n_real template tokens."""
    return -(-n_real // multiple) * multiple


def tap_text(taps: tuple[int, ...]) -> str:
    """How an export names its taps (adapter.teacher_tap)."""
    return f"layers {','.join(map(str, taps))} (hidden_states[k], stacked ascending)"
