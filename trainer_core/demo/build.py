"""`gguf-trainer demo`: a complete project on tiny offline models, built in seconds.

The student is a random Qwen3 with pig_clip's architecture at toy width, written as a
pig_clip-layout GGUF next to a real Qwen BPE tokenizer folder; the teacher is a random model
of the pack's real architecture where transformers has it (T5 for PixArt) and the pack's mock
teacher otherwise (LLaDA: rows of the real [256, 2560] shape with the real rows' large
per-dimension offset, so standardization and the export fold are exercised); the corpus is a
generated prompt file read by the real corpus stage. The same command builds byte-identical
materials and corpus, and `gguf-trainer run` takes the project through the whole pipeline in a
couple of minutes on two CPU cores.
"""
from __future__ import annotations

import random
from pathlib import Path

from trainer_core.base.atomic import atomic_write_text
from trainer_core.base.errors import UsageError
from trainer_core.packs import get_pack
from trainer_core.project import Project

__all__ = ["build_demo", "demo_prompts", "DEMO_SETTINGS", "DEMO_PACKS"]

SEED = 20261129
_SUBJECTS = ("a sheep", "an old lighthouse", "a red fox", "a glass teapot", "a robot gardener", "a koi pond",
             "a desert caravan", "a paper boat", "a snowy cabin", "a neon street", "a violin", "a dragonfly")
_STYLES = ("watercolor", "oil painting", "studio photo", "pixel art", "ink sketch", "35mm film", "3d render",
           "ukiyo-e print", "pastel drawing", "cinematic still")
_DETAILS = ("at sunset", "in the rain", "under a full moon", "on a misty morning", "with dramatic lighting",
            "in soft focus", "surrounded by flowers", "seen from above", "in a busy market", "on a quiet beach")

# sized so `gguf-trainer run` finishes every stage quickly on 2 CPU cores
DEMO_SETTINGS = [
    "corpus.presets=[]", "corpus.n_train=360", "corpus.n_val=40", "corpus.seed=8",
    "precompute.shard_size=120", "precompute.val_shard_size=40", "precompute.device=cpu",
    "train.device=cpu", "train.width=64", "train.depth=2", "train.steps=200", "train.batch_size=16",
    "train.warmup=20", "train.log_every=10", "train.val_every=50", "train.save_every=50",
]
_IMAGE_DEMO = ["corpus.image_presets=[]", "corpus.image_folders=materials/demo_images", "corpus.n_image=64",
               "corpus.n_two=8", "corpus.n_text=48", "corpus.n_val_image=12", "corpus.n_val_text=12",
               "precompute.shard_size=60", "precompute.val_shard_size=24", "train.lr=0.001"]
# per pack, over DEMO_SETTINGS; LLaDA's mock rows are 1.3 MB a prompt, so its corpus is smaller
DEMO_PACKS = {
    "t5xxl_pixart": [],
    "llada_image": ["corpus.n_train=96", "corpus.n_val=32", "precompute.shard_size=48",
                    "precompute.val_shard_size=32", "precompute.mock_teacher=true",
                    "train.lr=0.002"],   # the mock rows are learnt slowly at the recipe's 2e-4 in 200 steps
    # a tiny random Qwen3-VL teacher and 32 generated captioned images in a local folder
    "qwen3vl_mageflow": _IMAGE_DEMO,
    # the same, rendered at 128² or 192² (16 or 36 slots) instead of 384²…1024²
    "qwen3vl_qwenimage": _IMAGE_DEMO + ["corpus.ref_areas=[[16384, 0.5], [36864, 0.5]]",
                                        "corpus.two_image_max_area=16384"],
}
DEMO_IMAGES = 32


def demo_prompts(n: int = 480, seed: int = SEED) -> list[str]:
    """n distinct, deterministic image prompts."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        text = f"{rng.choice(_STYLES)} of {rng.choice(_SUBJECTS)} {rng.choice(_DETAILS)}"
        if rng.random() < 0.5:
            text += f", {rng.choice(_STYLES)}, {rng.choice(_DETAILS)}"
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def build_demo(root: str | Path, pack_id: str = "t5xxl_pixart") -> Project:
    """Create the demo project at `root` (which must not be a project yet)."""
    import torch
    from transformers import Qwen3Model

    from trainer_core.demo.fixtures import tiny_qwen3_config, write_qwen_tokenizer, write_student_config, write_student_gguf

    pack = get_pack(pack_id)
    if pack.id not in DEMO_PACKS:       # every pack has one; a pack added later must bring its own
        raise UsageError(f"The {pack.id} pack has no demo; use --pack with one of {', '.join(DEMO_PACKS)}.")
    project = Project.create(root, pack.id)
    materials = project.materials_dir
    prompts = demo_prompts()
    atomic_write_text(materials / "demo_prompts.txt", "".join(p + "\n" for p in prompts))

    config = tiny_qwen3_config(hidden_size=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128)
    tokenizer_dir = materials / "pig-clip-tokenizer"
    write_qwen_tokenizer(tokenizer_dir)
    write_student_config(tokenizer_dir, config)
    torch.manual_seed(SEED)
    write_student_gguf(Qwen3Model(config), materials / "pig_clip-demo-f16.gguf", dtype="f16")
    _build_teacher(project, prompts)

    project.update_settings(DEMO_SETTINGS + DEMO_PACKS[pack.id] + [
        "corpus.extra_files=materials/demo_prompts.txt",
        "materials.student.path=materials/pig_clip-demo-f16.gguf",
    ])
    return project


def _build_teacher(project: Project, prompts: list[str]) -> None:
    """The tiny real teacher where the demo has one (PixArt); the others run their mock. LLaDA
    gets a small random SigVQ file, so its export writes the vision GGUF too."""
    from trainer_core.demo.fixtures import write_tiny_qwen3vl, write_tiny_sigvq, write_tiny_t5
    pack = project.pack
    if pack.id == "t5xxl_pixart":
        write_tiny_t5(pack.resolve_material(project, "teacher"), prompts)
    elif pack.id == "llada_image":
        write_tiny_sigvq(pack.resolve_material(project, "sigvq"))
    elif pack.id in ("qwen3vl_mageflow", "qwen3vl_qwenimage"):
        write_tiny_qwen3vl(pack.resolve_material(project, "teacher"))
        write_demo_images(project.materials_dir / "demo_images", DEMO_IMAGES)


def write_demo_images(folder: Path, n: int, seed: int = SEED) -> None:
    """n small PNG scenes (a sky, ground and a few shapes, in varied sizes) with a caption sidecar
    each; the same arguments give the same bytes."""
    from PIL import Image, ImageDraw

    from trainer_core.base.atomic import atomic_path
    rng = random.Random(seed)
    sizes = ((96, 64), (128, 128), (200, 150), (320, 240), (500, 375), (64, 160), (384, 384), (640, 360))
    colors = {"red": (200, 40, 40), "blue": (40, 70, 200), "green": (40, 160, 60), "yellow": (230, 200, 40),
              "purple": (130, 50, 160), "white": (240, 240, 240)}
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        sky, ground = rng.choice(list(colors)), rng.choice(list(colors))
        image = Image.new("RGB", (w, h), colors[sky])
        draw = ImageDraw.Draw(image)
        draw.rectangle([0, h * 2 // 3, w, h], fill=colors[ground])
        things = []
        for _ in range(rng.randint(1, 3)):
            color, shape = rng.choice(list(colors)), rng.choice(("ball", "box"))
            x, y, r = rng.randrange(w), rng.randrange(h), rng.randint(4, max(5, min(w, h) // 4))
            (draw.ellipse if shape == "ball" else draw.rectangle)([x - r, y - r, x + r, y + r], fill=colors[color])
            things.append(f"a {color} {shape}")
        name = folder / f"scene_{i:03d}.png"
        with atomic_path(name) as tmp:
            image.save(tmp, format="PNG")
        captions = [f"{' and '.join(things)} over {ground} ground under a {sky} sky",
                    f"{rng.choice(_STYLES)} of {things[0]}"]
        atomic_write_text(name.with_suffix(".txt"), "\n".join(captions) + "\n")
