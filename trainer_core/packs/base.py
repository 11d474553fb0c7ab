"""What a trainer pack declares: identity, adapter kind, corpus kind, defaults, export facts.

A pack is data plus (in later stages) a few hooks. The values here are read by the
settings layer (defaults overlay at project creation), the CLI (`gguf-trainer packs`)
and the GUI (titles and descriptions); dimensions that come from a model are read from
the materials' configs when the stages run, never from here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["TrainerPack", "ADAPTER_KINDS", "CORPUS_KINDS"]

ADAPTER_KINDS = ("resampler", "seeded_resampler", "token_aligned_vision")
CORPUS_KINDS = ("text", "image")


@dataclass(frozen=True)
class TrainerPack:
    id: str                       # "llada_image"
    title: str                    # shown in the New project form
    description: str              # one paragraph for the GUI and `gguf-trainer packs`
    adapter_kind: str             # one of ADAPTER_KINDS
    corpus_kind: str              # "text": data/{train,val}.txt; "image": data/{train,val}.jsonl
    default_folder: str           # project folder (and adapter name without "pig_")
    shard_contract: str           # the CONTRACT string precomputed shards are written under
    teacher_repo: str             # Hugging Face repo of the teacher
    defaults: Mapping[str, Any] = field(default_factory=dict)   # overlay over built-in settings
    export_kvs: Mapping[str, Any] = field(default_factory=dict)  # pack KVs every export writes
    ggk_min_version: str = ""     # the first ggk release that loads this pack's adapter
    # The text-to-image prompt as the engine builds it for the student ("{text}" is replaced);
    # `t2i_empty` is the whole string for an empty prompt when the engine has a special form;
    # `t2i_start` is the number of leading output rows the engine drops before the DiT.
    t2i_template: str = "{text}"
    t2i_empty: str | None = None
    t2i_start: int = 0

    def __post_init__(self) -> None:
        if self.adapter_kind not in ADAPTER_KINDS:
            raise ValueError(f"pack {self.id}: unknown adapter kind {self.adapter_kind!r}")
        if self.corpus_kind not in CORPUS_KINDS:
            raise ValueError(f"pack {self.id}: unknown corpus kind {self.corpus_kind!r}")

    def format_prompt(self, text: str) -> str:
        """The engine's text-to-image string for `text` (no stripping: the engine does none)."""
        if not text and self.t2i_empty is not None:
            return self.t2i_empty
        return self.t2i_template.replace("{text}", text)

    @property
    def default_name(self) -> str:
        """The adapter name a new project gets when its folder has the pack's default name."""
        return "pig_" + self.default_folder
