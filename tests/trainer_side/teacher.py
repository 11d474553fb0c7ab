"""The teacher side of the engine check: a pack's text teacher on a tiny model the engine can run itself, and the
targets the pack's own teacher gives on it, for every pack whose teacher the engine runs (`EngineFacts.teacher`).

Without an adapter the engine's conditioner runs the --llm model as the teacher and dumps the rows it takes
(SD_DUMP_COND: llm_hidden.bin and tokens.txt, conditioner.hpp:2843-2893). The engine reads Z-Image's rows
at hidden_states[35] (`out_layers = {35}`, conditioner.hpp:3424) and fixes Qwen3's head_dim at 128
(llm.hpp:177), so the demo's teacher (4 layers, head_dim 16) cannot stand in: the check writes a tiny
Qwen3 with Qwen3-4B's 36 layers and head_dim 128 (hidden 64, random weights, the real Qwen BPE), as a
snapshot the pack's own teacher loads (ours: the pack's build_teacher, its hidden over the ids the pack's
template gives, as make_shard feeds it) and as a float32 GGUF with the student's layout (the engine's). A
Qwen3-VL teacher (`teacher="qwen3_vl"`: the taps of FLUX.3 Klein and Krea 2, conditioner.hpp:3556, 3565) the
same way with a tiny Qwen3-VL whose text stack has Qwen3-VL-4B's 36 layers, its text stack as the GGUF;
text-to-image prompts.
"""
from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainer_core.packs.lookup import engine_ids

__all__ = ["PROMPTS", "SEED", "TINY_TEACHERS", "teacher_ids", "pack_teacher", "predict_teacher"]

SEED = 20261205
_TEXT = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "intermediate_size": 128,
         "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                             "mrope_interleaved": True}}
PROMPTS = ("", "a sheep in sunglasses", "a (red:1.3) fox in a snowy forest", "一只猫坐在窗台上",
           "café ☕ at dawn, 35mm film")


def write_qwen3(folder: Path, gguf: bool = True) -> tuple[Path, Path | None]:
    """(the snapshot folder, its GGUF unless not `gguf`): a seeded random Qwen3 of 36 layers, 2 heads and 1 KV
    head of 128, hidden 64; every norm scale drawn around 1 so a swapped or misnamed tensor shows in the rows."""
    import torch
    from transformers import Qwen3ForCausalLM

    from trainer_core.packs.common.tiny_models import tiny_qwen3_config, write_qwen_tokenizer, write_student_gguf
    config = tiny_qwen3_config(hidden_size=64, layers=36, heads=2, kv_heads=1, head_dim=128, intermediate=128)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen3ForCausalLM(config).float().eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_qwen_tokenizer(folder)
    return folder, write_student_gguf(model, folder.parent / "teacher-f32.gguf", dtype="f32") if gguf else None


def write_qwen3vl(folder: Path, gguf: bool = True) -> tuple[Path, Path | None]:
    """(the snapshot folder, its text stack's GGUF): a seeded random Qwen3-VL (write_tiny_qwen3vl) whose text stack
    has Qwen3-VL-4B's 36 layers and head_dim 128, its norm scales drawn around 1; the GGUF holds the text stack
    in the student's layout (model.language_model.* as model.*)."""
    import torch
    from safetensors.torch import load_file, save_file

    from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
    from trainer_core.packs.common.tiny_models import write_student_gguf
    write_tiny_qwen3vl(folder, hidden=64, layers=36, text=_TEXT)
    gen = torch.Generator().manual_seed(SEED)
    text: dict[str, Any] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(shard)
        for name in sorted(tensors):
            if "norm" in name and tensors[name].ndim == 1:
                tensors[name] = 1.0 + 0.1 * torch.randn(tensors[name].shape, generator=gen)
            if name.startswith("model.language_model."):
                text["model." + name.removeprefix("model.language_model.")] = tensors[name]
        save_file(tensors, shard, metadata={"format": "pt"})
    return folder, write_student_gguf(text, folder.parent / "teacher-f32.gguf", dtype="f32") if gguf else None


# the tiny teacher of each architecture EngineFacts.teacher names
TINY_TEACHERS: dict[str, Callable[[Path, bool], tuple[Path, Path | None]]] = {"qwen3": write_qwen3,
                                                                              "qwen3_vl": write_qwen3vl}


def teacher_ids(ours: Any, text: str) -> list[int]:
    """The ids the pack's make_shard gives its teacher for `text`: its Qwen chat template (the family both teacher
    architectures read), cut to the student's room as that family cuts it."""
    from trainer_core.packs.common.qwen_chat import fit_template
    return fit_template(ours.student.ids(ours.pack.student_chunks(text)), ours.pack.max_len_student)


def pack_teacher(ours: Any, work: Path, gguf: bool = True) -> tuple[Any, Path | None]:
    """(the pack's own teacher on the tiny snapshot, the snapshot's GGUF): the pack's choice of teacher class and
    tap (build_teacher) on a scratch project whose teacher material is the snapshot."""
    from trainer_core.project import Project
    write = TINY_TEACHERS.get(ours.pack.engine.teacher)
    if write is None:
        raise ValueError(f"the {ours.pack.id} pack declares no teacher the engine can run "
                         f"(EngineFacts.teacher {ours.pack.engine.teacher!r}; known: {', '.join(TINY_TEACHERS)})")
    shutil.rmtree(work, ignore_errors=True)           # a kept folder from an earlier check: made afresh
    root, file = write(work / "teacher", gguf)
    scratch = Project.create(work / "scratch", ours.pack.id)
    scratch.update_settings([f"materials.teacher.path={root}"])
    return ours.pack.build_teacher(Project.open(scratch.root), "cpu"), file


def predict_teacher(ours: Any, teacher: Any, text: str) -> tuple[np.ndarray, list[int]]:
    """(our target rows over the rows the engine runs, the ids the engine runs): a teacher whose ids the engine pads
    (EngineFacts.pad_multiple) gives the one pad row it reads; a Qwen3-VL teacher reads text to image (no images)."""
    ids, engine = teacher_ids(ours, text), engine_ids(ours.pack, ours.student, text)
    vision = ([[]],) if "vision" in inspect.signature(teacher.hidden).parameters else ()
    return teacher.hidden([ids], *vision)[0].numpy()[:len(engine)], engine
