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

    def __post_init__(self) -> None:
        if self.adapter_kind not in ADAPTER_KINDS:
            raise ValueError(f"pack {self.id}: unknown adapter kind {self.adapter_kind!r}")
        if self.corpus_kind not in CORPUS_KINDS:
            raise ValueError(f"pack {self.id}: unknown corpus kind {self.corpus_kind!r}")

    @property
    def default_name(self) -> str:
        """The adapter name a new project gets when its folder has the pack's default name."""
        return "pig_" + self.default_folder
