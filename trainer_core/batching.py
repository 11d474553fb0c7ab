"""Greedy length-bucketed batching (packs-contract §A.5), shared by teachers and the student."""
from __future__ import annotations

from typing import Sequence

__all__ = ["greedy_batches"]


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
