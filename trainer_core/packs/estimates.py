"""The figures the plan and the packs' `shard_bytes` estimate from a project before anything runs: the mean
prompt length of its corpus, the largest reference image precompute reads, and what the pack's teacher needs on
a card to stay resident (the number its `teacher_mode=auto` compares with the card's budget)."""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from trainer_core.packs.declarations import CHARS_PER_TOKEN

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["prompt_tokens", "reference_pixels", "teacher_need_gib"]

_SAMPLE_BYTES = 1 << 16   # prompt_tokens reads this much of each prompt file


def prompt_tokens(project: "ProjectFolder", default: float) -> float:
    """The mean length in tokens of the prompts this project's corpus reads (the estimates' prompt, before
    anything is tokenized): measured at CHARS_PER_TOKEN on the corpus the corpus stage wrote, else on the
    prompt files the settings name (corpus.train_file, corpus.extra_files), the first 64 KB of each;
    `default`, the pack's typical prompt of its presets, when none of them can be read."""
    c = project.settings.corpus
    written = [p for p in project.corpus_files()[:1] if p.is_file()]
    named = [project.resolve_user_path(f) for f in (c.train_file, *c.extra_files) if f]
    chars = lines = 0
    for path in written or named:
        if not path.is_file():                  # a folder, a pipe, a device: nothing to sample
            continue
        try:
            with open(path, "rb") as f:
                text = f.read(_SAMPLE_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.split("\n")[:-1] or text.split("\n"):     # the last line may be cut short
            if line.startswith("{"):                                 # an image corpus's jsonl: its text
                try:
                    line = str(json.loads(line).get("text", ""))
                except (ValueError, AttributeError):
                    continue
            chars, lines = chars + len(line), lines + 1
    return chars / lines / CHARS_PER_TOKEN if lines else float(default)


def reference_pixels(project: "ProjectFolder") -> int:
    """The most pixels precompute reads one reference image at (the plan's memory estimate): within the pack's
    `reference_side`² when it has one, else the largest of corpus.ref_areas, an area of 0 (the image's own size)
    counted as a megapixel photo; 0 for a corpus without reference images."""
    pack = project.pack
    if not pack.corpus_kind.reference_images:
        return 0
    if pack.reference_side:
        return pack.reference_side ** 2
    return max((int(area) or 2**20 for area, _ in project.settings.corpus.ref_areas), default=2**20)


def teacher_need_gib(project: "ProjectFolder") -> float | None:
    """GiB the pack's teacher needs on a card to stay resident (its weights there plus the pack's headroom, the
    teacher module's `resident_need_gib`); None when the pack places its teacher otherwise or its files are not
    on disk or not readable yet."""
    from trainer_core.packs.lookup import resolve_material, teacher_module
    pack = project.pack
    module = teacher_module(pack)
    if not module or pack.teacher_control != "teacher_mode":
        return None
    root = resolve_material(project, "teacher")
    if root is None or not Path(root).exists():
        return None
    try:
        return float(importlib.import_module(module).resident_need_gib(root))
    except (OSError, ValueError, KeyError, TypeError):     # a download under way or damaged: the plan estimates
        return None
