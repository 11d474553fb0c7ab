"""The learning-rate schedule, computed from the step count in force (engine-contract §0.5).

Linear warmup lr·(step+1)/warmup, then a cosine from lr down to a 10 % floor over the steps
left. Because `steps` is whatever count is in force at this step, raising the count of a
finished run lowers the progress t and lifts the lr again: a warm restart.
"""
from __future__ import annotations

import math

__all__ = ["lr_at"]


def lr_at(step: int, lr: float, warmup: int, steps: int) -> float:
    """The lr of optimizer step `step` (0-based)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    span = steps - warmup
    t = 1.0 if span <= 0 else min(1.0, (step - warmup) / span)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))
