"""What a pack declares besides its hooks, as plain data (no torch, no pack): its materials, a precompute run's
budgets, what an export writes besides the network and beside the adapter, the engine's side of the pack, and
the constants the declarations share. packs/base.py (the seam) and its helpers (lookup.py, estimates.py) read
them; `from trainer_core.packs.base import …` finds every name here too."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["Material", "Budgets", "EngineFacts", "ExportContents", "ExportExtras", "NO_EXTRAS", "STUDENT_MATERIALS",
           "IMAGE_PRESET_MATERIALS", "STUDENT_FILE", "PIG_CLIP_WIDTH", "CHARS_PER_TOKEN", "DEMO_SETTINGS",
           "QWEN_PAD_ID"]


@dataclass(frozen=True)
class Material:
    """Something a pack needs on disk: a Hub snapshot or a local file the user picks."""

    id: str
    title: str
    kind: str                          # "hf_snapshot" | "local_file"
    repo: str = ""
    repo_type: str = "model"
    patterns: tuple[str, ...] = ()     # allow-patterns of the snapshot
    subdir: str = ""                   # under <project>/materials/
    required: bool = True
    wanted_if: str = ""                # optional: the boolean setting ("export.export_sigvq") that asks for it
    size_hint: str = ""
    suffixes: tuple[str, ...] = ()     # local files
    hint: str = ""
    model: bool = False                # precompute loads it as a model: its weights count in the plan


# the student file a ggk command line names when the project has none picked
STUDENT_FILE = "pig_clip-q8_0.gguf"
PIG_CLIP_WIDTH = 1024     # pig_clip's hidden size (Qwen3 0.6B), for estimates before the student is on disk
CHARS_PER_TOKEN = 4.0     # English prompts in the Qwen BPE or T5's sentencepiece, on average (the estimates')
QWEN_PAD_ID = 151643      # <|endoftext|>: the Qwen BPE's pad, which the engine pads Qwen templates with

# the demo project's settings of every pack (a pack's `demo_settings` go over them); sized so
# `gguf-trainer run` finishes every stage quickly on 2 CPU cores
DEMO_SETTINGS = (
    "corpus.presets=[]", "corpus.n_train=360", "corpus.n_val=40", "corpus.seed=8",
    "precompute.shard_size=120", "precompute.val_shard_size=40", "precompute.device=cpu",
    "train.device=cpu", "train.width=64", "train.depth=2", "train.steps=200", "train.batch_size=16",
    "train.warmup=20", "train.log_every=10", "train.val_every=50", "train.save_every=50",
)

STUDENT_MATERIALS = (
    Material("student", "pig_clip student GGUF", "local_file", suffixes=(".gguf",),
             hint="pig_clip-f16.gguf, the pig_clip 0.6B Qwen3 text model as a GGUF (ggk's --llm file; train on "
                  "f16, a quantized file is for running)"),
    Material("student_tokenizer", "pig_clip tokenizer and config", "hf_snapshot",
             repo="callgg/pig-clip-tokenizer",
             patterns=("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                       "vocab.json", "merges.txt"),
             subdir="pig-clip-tokenizer", size_hint="~11 MB"),
)


# The image datasets of the image packs' corpus, one material per entry of corpus.image_presets.
IMAGE_PRESET_MATERIALS = {
    "flickr30k": Material("images_flickr30k", "Flickr30k photos and captions (image corpus)", "hf_snapshot",
                          repo="nlphuji/flickr30k", repo_type="dataset",
                          patterns=("flickr30k-images.zip", "flickr_annotations_30k.csv"), subdir="flickr30k",
                          size_hint="~4.4 GB", hint="31k photos with 5 captions each"),
    "coco_captions": Material("images_coco_captions", "COCO captions, Karpathy train split (image corpus)",
                              "hf_snapshot", repo="Multimodal-Fatima/COCO_captions_train", repo_type="dataset",
                              patterns=("data/*.parquet",), subdir="coco_captions", size_hint="~17 GB",
                              hint="113k photos with 5 captions each, in 38 parquet shards"),
}


@dataclass(frozen=True)
class Budgets:
    """Batch sizes and token budgets of one precompute run (settings of 0 already resolved)."""

    teacher_batch: int
    tok_budget: int
    student_batch: int
    student_tok_budget: int
    vis_tok_budget: int = 0      # image packs: merged vision tokens per vision-tower batch


@dataclass(frozen=True)
class ExportContents:
    """What an export writes besides the network: the pack's KVs (after the adapter's own), string-array KVs
    (the Qwen3.5 bridge's vocabulary: tokenizer.ggml.tokens and .merges) and top-level tensors under their own
    names (numpy arrays, written as they are: Ming's tokenizer_json)."""

    kvs: Mapping[str, Any] = field(default_factory=dict)
    arrays: Mapping[str, list[str]] = field(default_factory=dict)
    tensors: Mapping[str, Any] = field(default_factory=dict)


class ExportExtras:
    """Files a pack's export writes beside the adapter (LLaDA's SigVQ GGUF, Ming's vision GGUF), declared as
    `TrainerPack.extras`; the defaults write nothing. The export stage calls `prepare` (False: stopped), writes
    the adapter, then `write`; `outputs` are the files that exist now (the Output tab, `status`, resets);
    `describe` is what `gguf-trainer inspect` says of one of them; `stale` asks the pipeline to export again
    although the GGUF is newer than best.pt (cheap: asked often)."""

    def stale(self, project: "ProjectFolder") -> bool:
        return False

    def prepare(self, project: "ProjectFolder", report: Any, should_stop: Callable[[], bool]) -> bool:
        return True

    def write(self, project: "ProjectFolder", report: Any) -> None:
        """Write the files beside the adapter (skipping what is up to date)."""

    def outputs(self, project: "ProjectFolder") -> list[Path]:
        return []

    def describe(self, path: Path, kvs: Mapping[str, Any]) -> dict[str, Any] | None:
        """{"kind", "variant", "config", "problems": [{"message", "fatal"}]} when `path` (its KVs `kvs`) is one of
        the files `write` makes, else None."""
        return None


NO_EXTRAS = ExportExtras()


@dataclass(frozen=True)
class EngineFacts:
    """The engine's side of a pack (ggk's conditioner for its model versions), for bench/'s engine harness and
    the conformance suite; the stages never read it. What the harness needs of every pack is data here, so it
    never branches on a pack."""

    versions: tuple[str, ...]               # the ggk model versions whose conditioner runs the adapter; first = main
    bank_versions: tuple[str, ...] = ()     # those whose conditioner hands the DiT the adapter's bank head
    raw_prompt: bool = False                # the student reads the raw prompt's ids (the empty one: the pad token)
    pad_multiple: int = 1                   # the ids are right-padded with pad_id up to a multiple of this
    pad_id: int = QWEN_PAD_ID
    teacher: str = ""                       # the engine can run the teacher as --llm: "qwen3" or "qwen3_vl"
    references: str = ""                    # the conditioner reads reference images through: "" (none),
                                            # "mmproj" (a Qwen3-VL tower GGUF) or "vision_gguf" (the pack's own)
    reference_area: bool = False            # … rendered at the pack's reference area (Qwen-Image 2.1)
    reference_reader: str = ""              # "module:function(path) -> [h, w, 3]": how a raw-prompt pack's
                                            # precompute reads a reference (the Qwen3.5 bridge's resize)
    vision_tower: str = ""                  # "module" of a pack's own tower ("vision_gguf"): write_tiny,
                                            # load_tower, export, read_reference, patchify
    edit_tokens: bool = False               # the tokenizer check includes the edit template's ids
