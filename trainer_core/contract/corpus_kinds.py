"""The corpus kinds: what a pack's samples are, as one object each (`TrainerPack.corpus_kind`).

A text corpus is prompts, one a line (data/train.txt, data/val.txt, or the user's own files); an image
corpus is records with a text and 0–2 reference images (data/train.jsonl, data/val.jsonl, the images
copied under data/images/). Every question the rest of the code asks of a pack's corpus — its files, the
settings that count its samples, the settings the GUI shows for it, the plan's small corpus, how a file is
read back, how the corpus stage builds it — is answered here, so nothing compares a kind's name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from trainer_core.base.errors import TrainerError

if TYPE_CHECKING:
    from trainer_core.base.events import Report
    from trainer_core.base.folder import ProjectFolder

__all__ = ["CorpusKind", "TEXT", "IMAGE"]

Sources = Callable[[], "list[tuple[str, Iterator[str]]]"]


@dataclass(frozen=True)
class CorpusKind:
    name: str                               # how messages and `gguf-trainer packs` name it
    suffix: str                             # the corpus files: data/train<suffix>, data/val<suffix>
    files_mode: bool                        # corpus.mode "files" (the user's own train/val files) is allowed
    reference_images: bool                  # samples carry reference images (image presets are materials)
    train_counts: tuple[str, ...]           # the corpus settings whose sum is the train split
    val_counts: tuple[str, ...]             # … and the val split
    calibration: Mapping[str, int] = field(default_factory=dict)   # the plan's small corpus
    settings: tuple[str, ...] = ()          # the corpus.* settings only this kind reads (the GUI shows them for it)

    def samples(self, c: Any) -> tuple[int, int]:
        """(train, val) samples the corpus settings `c` ask for."""
        return sum(getattr(c, k) for k in self.train_counts), sum(getattr(c, k) for k in self.val_counts)

    def read_samples(self, project: "ProjectFolder", path: Path) -> list[Any]:
        """The samples of a corpus file as a pack's make_shard takes them: prompts, or image records."""
        if not self.reference_images:
            from trainer_core.contract.corpus_files import read_corpus
            return read_corpus(path)
        return _image_records(project, path)

    def build(self, project: "ProjectFolder", report: "Report", should_stop: Callable[[], bool],
              sources: Sources, material: Callable[[str], Path]) -> str:
        """The corpus stage's work: data/train and data/val from the prompt `sources` (and the image sources, the
        image presets' datasets where `material(id)` finds them)."""
        if self.reference_images:
            from trainer_core.contract.image_corpus import build_image_corpus
            return build_image_corpus(project, report, should_stop, sources, material)
        from trainer_core.contract.text_corpus import build_text_corpus
        return build_text_corpus(project, report, sources)


def _image_records(project: "ProjectFolder", path: Path) -> list[dict[str, Any]]:
    """{"text", "images": [paths], "rel": [as written], BANK_TARGET: bool} per line of an image corpus .jsonl
    (image paths are relative to data/; image_corpus.has_bank_target reads the flag under its old name too)."""
    from trainer_core.contract.image_corpus import BANK_TARGET, has_bank_target
    samples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
            text, rel = record["text"], list(record.get("images") or [])
            if not isinstance(text, str) or not all(isinstance(r, str) for r in rel):
                raise ValueError("text must be a string and images a list of paths")
        except (ValueError, KeyError, TypeError) as e:
            raise TrainerError(f"{path} line {number} is not an image-corpus record ({e}); "
                               "reset the corpus and run it again.") from None
        samples.append({"text": text, "images": [project.data_dir / r for r in rel], "rel": rel,
                        BANK_TARGET: has_bank_target(record)})
    return samples


_TEXT_SETTINGS = ("mode", "presets", "extra_files", "train_file", "val_file", "n_train", "n_val")
_IMAGE_SETTINGS = ("image_presets", "image_folders", "n_image", "n_two", "n_text", "n_val_image", "n_val_text",
                   "ref_areas", "two_image_max_area")

TEXT = CorpusKind("text", ".txt", files_mode=True, reference_images=False, train_counts=("n_train",),
                  val_counts=("n_val",), calibration={"n_train": 64, "n_val": 24}, settings=_TEXT_SETTINGS)
IMAGE = CorpusKind("image", ".jsonl", files_mode=False, reference_images=True,
                   train_counts=("n_image", "n_two", "n_text"), val_counts=("n_val_image", "n_val_text"),
                   calibration={"n_image": 16, "n_two": 4, "n_text": 12, "n_val_image": 8, "n_val_text": 8},
                   settings=_IMAGE_SETTINGS)
