"""`gguf-trainer demo`: a complete project on tiny offline models, built in seconds (the demo builder, a service).

The student is a random Qwen3 with pig_clip's architecture at toy width, written as a
pig_clip-layout GGUF next to a real Qwen BPE tokenizer folder; the teacher is what the pack's
`build_demo_materials` writes (a random model of the pack's real architecture where
transformers has it: T5 for PixArt, Qwen3-VL for the image packs) or the pack's mock teacher
(LLaDA: rows of the real [256, 2560] shape with the real rows' large per-dimension offset, so
standardization and the export fold are exercised); the corpus is a generated prompt file read
by the real corpus stage. The same command builds byte-identical materials and corpus, and
`gguf-trainer run` takes the project through the whole pipeline in seconds (demo_times.json holds the measured
figures). Nothing here reaches the network, and nothing later does either: the project is marked
a demo (`materials/.demo.json`, first thing after it is created), so its materials are never
looked up on the Hub, linked from elsewhere or downloaded (materials.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from trainer_core.base.atomic import atomic_write_text
from trainer_core.base.errors import UsageError
from trainer_core.materials import mark_demo
from trainer_core.packs import DEMO_PACKS, get_pack
from trainer_core.packs.base import DEMO_SETTINGS
from trainer_core.project import Project

__all__ = ["build_demo", "DEMO_PACKS"]


def build_demo(root: str | Path, pack_id: str = DEMO_PACKS[0],
               progress: Callable[[int, int, str], None] | None = None) -> Project:
    """Create the demo project at `root` (which must not be a project yet); `progress(done, total, what)`
    hears each step as it starts (`gguf-trainer demo` draws it as a bar)."""
    step = progress or (lambda done, total, what: None)
    pack = get_pack(pack_id)
    if pack.id not in DEMO_PACKS:
        raise UsageError(f"The {pack.id} pack has no demo; use --pack with one of {', '.join(DEMO_PACKS)}.")
    # seconds on a first build (this module imports neither, so that a caller can speak first): said before it
    step(0, 5, "loading torch and transformers")
    import torch
    from transformers import Qwen3Model

    from trainer_core.packs.common.tiny_models import (SEED, demo_prompts, tiny_qwen3_config, write_qwen_tokenizer,
                                                       write_student_config, write_student_gguf)

    project = Project.create(root, pack.id)
    mark_demo(project, pack.id)      # before anything else: even a half-built demo stays offline
    materials = project.materials_dir
    prompts = demo_prompts()
    atomic_write_text(materials / "demo_prompts.txt", "".join(p + "\n" for p in prompts))

    step(1, 5, "the student's tokenizer and config")
    config = tiny_qwen3_config(hidden_size=64, layers=2, heads=2, kv_heads=1, head_dim=128, intermediate=128)
    tokenizer_dir = materials / "pig-clip-tokenizer"
    write_qwen_tokenizer(tokenizer_dir)
    write_student_config(tokenizer_dir, config)
    step(2, 5, "the student GGUF")
    torch.manual_seed(SEED)
    write_student_gguf(Qwen3Model(config), materials / "pig_clip-demo-f16.gguf", dtype="f16")
    step(3, 5, "the teacher")
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()          # save_pretrained's "Writing model shards" bar: not among our lines
    try:
        pack.build_demo_materials(project, prompts)
    finally:
        hf_logging.enable_progress_bar()
    step(4, 5, "the settings")

    project.update_settings([*DEMO_SETTINGS, *pack.demo_settings,
                             "corpus.extra_files=materials/demo_prompts.txt",
                             "materials.student.path=materials/pig_clip-demo-f16.gguf"])
    step(5, 5, "ready")
    return project
