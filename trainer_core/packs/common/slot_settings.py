"""The settings the packs of the slot kinds (the Qwen3.5 bridge, Ming) share: the frozen seed table's
rank and the longest template the adapter takes, and how a shard leaves out what does not fit. Light (no
torch): the registry and the GUI import it."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from trainer_core.base.config import pack_setting
from trainer_core.base.errors import TrainerError
from trainer_core.base.parsers import count

__all__ = ["SLOT_SETTINGS", "render_fitting"]

SLOT_SETTINGS = (
    pack_setting("train.seed_rank", 384, count(), "columns of the frozen seed table (the teacher's embeddings, PCA)"),
    pack_setting("train.max_slots", 2304, count(), "the longest teacher template the adapter takes (slots)"),
)


def render_fitting(samples: Sequence[dict[str, Any]], render: Callable[[dict[str, Any]], Any],
                   session: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """(samples, renderings) shortest template first: each sample rendered by `render` (a tuple whose first item
    is its template ids), or left out — logged and listed in `session.skipped` — when `render` returns the
    sentence saying why it does not fit train.max_slots; TrainerError when nothing of the shard fits."""
    rendered, kept = [], []
    for sample in samples:
        r = render(sample)
        if isinstance(r, str):
            session.log(f"{r}: {sample['text'][:60]!r}")
            session.skipped.append(sample["text"])
            continue
        rendered.append(r)
        kept.append(sample)
    if not kept:
        raise TrainerError(f"Every sample of this shard exceeds train.max_slots = {session.max_slots}; raise it.")
    order = sorted(range(len(kept)), key=lambda i: len(rendered[i][0]))
    return [kept[i] for i in order], [rendered[i] for i in order]
