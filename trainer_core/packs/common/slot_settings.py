"""The settings the packs of the slot kinds (the Qwen3.5 bridge, Ming) share: the frozen seed table's
rank and the longest template the adapter takes. Light (no torch): the registry and the GUI import it."""
from __future__ import annotations

from trainer_core.base.config import pack_setting
from trainer_core.base.parsers import count

__all__ = ["SLOT_SETTINGS"]

SLOT_SETTINGS = (
    pack_setting("train.seed_rank", 384, count(), "columns of the frozen seed table (the teacher's embeddings, PCA)"),
    pack_setting("train.max_slots", 2304, count(), "the longest teacher template the adapter takes (slots)"),
)
