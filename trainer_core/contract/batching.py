"""Greedy length-bucketed batching (packs-contract §A.5), shared by teachers and the student."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["greedy_batches", "pad_batch"]


def greedy_batches(lengths: Sequence[int], max_count: int, tok_budget: int) -> list[list[int]]:
    """Indices of `lengths` (already sorted by length) cut into batches: the next sample joins
    while count < max_count and (count + 1) × its length ≤ tok_budget; a batch holds at least
    one sample, so one over-long sample still runs, alone."""
    batches: list[list[int]] = []
    current: list[int] = []
    for index, length in enumerate(lengths):
        if current and (len(current) >= max_count or (len(current) + 1) * length > tok_budget):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def pad_batch(token_lists: Sequence[Sequence[int]], pad_id: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(ids [B, L] long right-padded with `pad_id`, mask [B, L] bool) for L = the longest list."""
    import torch
    length = max(len(ids) for ids in token_lists)
    ids = torch.full((len(token_lists), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), length), dtype=torch.bool)
    for row, tokens in enumerate(token_lists):
        ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, :len(tokens)] = True
    return ids, mask
