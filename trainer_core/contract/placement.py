"""Where a teacher goes: the one rule the packs' teachers and the pre-flight plan both call.

Two settings place a teacher (a pack says which one it reads, `TrainerPack.teacher_control`):

* `precompute.teacher_mode` (auto, gpu, offload): `offload` keeps the weights in RAM and streams
  them through the execution device layer by layer (on a CPU-only machine too: the same code path);
  on a machine without CUDA anything else is `cpu`; `gpu` keeps the teacher resident on the card; `auto`
  does so when the card's budget holds what the pack says a resident teacher needs (its weights on the
  card plus the pack's headroom for activations and the CUDA context, `TrainerPack.teacher_need_gib`),
  else `offload`.
* `precompute.placement` (sequential, balanced): accelerate spreads the weights over the cards'
  budgets (`card_budgets`) and the CPU.

The card budget is `precompute.gpu_mem_gib`, or the card's total less 1.5 GiB (at least 1 GiB). Importable
without torch: the plan runs in the GUI process.
"""
from __future__ import annotations

from typing import Sequence

from trainer_core.base.errors import UsageError

__all__ = ["TEACHER_MODES", "CARD_RESERVE_GIB", "OTHER_CARD_MIN_GIB", "card_budget_gib", "teacher_mode",
           "card_budgets"]

TEACHER_MODES = ("auto", "gpu", "offload")
CARD_RESERVE_GIB = 1.5        # left free on a card whose budget is not set
OTHER_CARD_MIN_GIB = 2.0      # a further card takes part in `placement` only above this much room


def card_budget_gib(total_gib: float, setting: float) -> float:
    """The teacher's budget on a card of `total_gib`: the setting, or (0) the total less 1.5 GiB, at least 1."""
    return setting if setting > 0 else max(1.0, total_gib - CARD_RESERVE_GIB)


def teacher_mode(mode: str, cuda: bool, budget_gib: float, need_gib: float) -> str:
    """"gpu", "offload" or "cpu" for `precompute.teacher_mode` = `mode` (see the module docstring)."""
    if mode not in TEACHER_MODES:
        raise UsageError(f"The teacher mode {mode!r} is not known; choose one of {', '.join(TEACHER_MODES)}.")
    if mode == "offload":
        return "offload"
    if not cuda:
        return "cpu"
    if mode == "gpu":
        return "gpu"
    return "gpu" if budget_gib >= need_gib else "offload"


def card_budgets(chosen: int, totals_gib: Sequence[float], gpu_mem_gib: float) -> dict[int, float]:
    """GiB per card index for `precompute.placement`, the chosen card first: its budget, then every other
    card whose total less 1.5 GiB exceeds 2 GiB, that much."""
    rooms: dict[int, float] = {}
    for index, total in enumerate(totals_gib):
        if index == chosen:
            rooms[index] = card_budget_gib(total, gpu_mem_gib)
        elif total - CARD_RESERVE_GIB > OTHER_CARD_MIN_GIB:
            rooms[index] = total - CARD_RESERVE_GIB
    return {chosen: rooms[chosen], **{k: v for k, v in rooms.items() if k != chosen}} if chosen in rooms else rooms
