"""FLUX.3 Klein's text contract (ggk ≥ 0.9.5, conditioner.hpp; packs-contract-more §D.3): what the
teacher, the student and the adapter see for a prompt.

* **Template.** `<|im_start|>user\n` + prompt + `<|im_end|>\n<|im_start|>assistant\n`: no system
  turn, no `<think>` block, every row goes to the DiT. The pieces are tokenized one by one: the
  prefix (3 ids), the prompt's chunks after the engine's attention parse (emphasis such as
  `(word:1.2)` is removed; its weights scale the adapter's rows afterwards), the suffix (5 ids).
* **Pads.** The sequence is right-padded with <|endoftext|> to the next multiple of 80 rows (none
  when it already is one). Pads sit at rope position 1, are masked as attention keys (causal
  otherwise) and are kept as rows: the DiT reads them. Real rows take positions 0 … n−1. Every pad
  row of a sample is therefore the same state, for the teacher and for the student alike.
* **Taps.** The teacher target of a row is Qwen3-VL's hidden_states[k] (the output of decoder
  layer k−1, before any norm) for the 8 taps k, stacked in ascending order along the features.
  For the 36-layer Qwen3-VL-4B they are 4, 8, …, 32: `taps_for` spreads 8 taps the same way over
  any depth (the tiny demo teacher's 9 layers give 1 … 8).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from trainer_core.base.errors import ModelFileError

if TYPE_CHECKING:
    import torch

__all__ = ["PREFIX", "SUFFIX", "PREFIX_IDS", "SUFFIX_IDS", "PAD_ID", "PAD_POSITION", "PAD_MULTIPLE", "N_TAPS",
           "TAPS", "ENGINE_MAX_TOKENS", "taps_for", "padded_length", "fit_template", "padded_batch",
           "check_templates"]

PREFIX = "<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
PREFIX_IDS = (151644, 872, 198)
SUFFIX_IDS = (151645, 198, 151644, 77091, 198)
PAD_ID = 151643                 # <|endoftext|>
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


def fit_template(ids: Sequence[int], max_len: int) -> list[int]:
    """The template ids cut to `max_len` tokens by shortening the prompt's body, the suffix kept
    (the pack trains on at most max_len rows; the engine would cut only past 4096)."""
    ids = list(ids)
    if len(ids) <= max_len:
        return ids
    return ids[:max_len - len(SUFFIX_IDS)] + list(SUFFIX_IDS)


def padded_batch(token_lists: Sequence[Sequence[int]], length: int | None = None
                 ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """(ids [B, L], key mask [B, L] bool, positions [B, L]) of samples right-padded with PAD_ID to
    `length` (default: the longest + 1, so every sample has a pad row); real rows at 0 … n−1, pads at
    PAD_POSITION."""
    import torch
    length = length or max(len(t) for t in token_lists) + 1
    ids = torch.full((len(token_lists), length), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(token_lists), length, dtype=torch.bool)
    positions = torch.full((len(token_lists), length), PAD_POSITION, dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        n = len(tokens)
        if n > length:
            raise ValueError(f"a sample of {n} tokens does not fit a batch of {length} rows")
        ids[row, :n] = torch.tensor(list(tokens), dtype=torch.long)
        mask[row, :n] = True
        positions[row, :n] = torch.arange(n)
    return ids, mask, positions


def check_templates(encode, what: str) -> None:
    """Refuse a tokenizer (`encode(text) -> ids`, one piece) that does not give the engine's template ids."""
    for piece, want in ((PREFIX, PREFIX_IDS), (SUFFIX, SUFFIX_IDS)):
        got = tuple(encode(piece))
        if got != want:
            raise ModelFileError(f"The {what} tokenizer encodes the FLUX.3 template piece {piece!r} as {list(got)}, "
                                 f"not the engine's {list(want)}; use the Qwen tokenizer of the snapshot.")
