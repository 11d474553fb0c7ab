"""The teacher half of bench/engine_check.py: a pack's text teacher run by the engine itself, against the
targets precompute writes.

Without an adapter the engine's conditioner runs the --llm model as the teacher and dumps the rows it takes
(SD_DUMP_COND: llm_hidden.bin and tokens.txt, conditioner.hpp:2843-2893). The engine reads Z-Image's rows
at hidden_states[35] (`out_layers = {35}`, conditioner.hpp:3424) and fixes Qwen3's head_dim at 128
(llm.hpp:177), so the demo's teacher (4 layers, head_dim 16) cannot stand in: the check writes a tiny
Qwen3 with Qwen3-4B's 36 layers and head_dim 128 (hidden 64, random weights, the real Qwen BPE), as a
snapshot the pack's own teacher loads (ours: the pack's build_teacher, its hidden over the ids the pack's
template gives, as make_shard feeds it) and as a float32 GGUF with the student's layout (the engine's). The
Qwen3-VL teachers (MageFlow, Qwen-Image 2.1, FLUX.3 Klein, Krea 2) the same way with a tiny Qwen3-VL whose text
stack has Qwen3-VL-4B's 36 layers, its text stack as the GGUF; text-to-image prompts. Compared: the ids and
max |engine − ours| / max |ours| over every row the engine runs.
"""
from __future__ import annotations

import importlib
import inspect
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from trainer_core.packs.lookup import engine_ids

# the packs whose teacher the engine can run here: the model version whose conditioner taps it, and whether the
# teacher is Qwen3-VL's text stack (FLUX.3 Klein's taps 4…32, Krea 2's; conditioner.hpp:3556, 3565) or Qwen3
PACKS = {"qwen3_zimage": (("z_image",), False), "qwen3vl_flux3": (("flux3",), True),
         "qwen3vl_krea2": (("krea2", "iris"), True), "qwen3vl_mageflow": (("mage_flow",), True),
         "qwen3vl_qwenimage": (("qwen_image_2_1",), True)}
SEED = 20261205
_TEXT = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "intermediate_size": 128,
         "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                             "mrope_interleaved": True}}
PROMPTS = ("", "a sheep in sunglasses", "a (red:1.3) fox in a snowy forest", "一只猫坐在窗台上",
           "café ☕ at dawn, 35mm film")


def write_teacher(folder: Path, gguf: bool = True) -> tuple[Path, Path | None]:
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


def write_vl_teacher(folder: Path, gguf: bool = True) -> tuple[Path, Path | None]:
    """(the snapshot folder, its text stack's GGUF): a seeded random Qwen3-VL (the pack's write_tiny_qwen3vl)
    whose text stack has Qwen3-VL-4B's 36 layers and head_dim 128, its norm scales drawn around 1; the GGUF
    holds the text stack in the student's layout (model.language_model.* as model.*)."""
    import torch
    from safetensors.torch import load_file, save_file

    from trainer_core.packs.common.tiny_models import write_student_gguf
    from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
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


def teacher_ids(ours: Any, text: str) -> list[int]:
    """The ids the pack's make_shard gives its teacher for `text`: the template, cut to the student's room."""
    ids = ours.student.ids(ours.pack.student_chunks(text))
    fit = getattr(importlib.import_module(type(ours.pack).__module__), "fit_template", None)
    return fit(ids, ours.pack.max_len_student) if fit is not None else ids


def pack_teacher(ours: Any, work: Path, gguf: bool = True) -> tuple[Any, Path | None]:
    """(the pack's own teacher on the tiny snapshot, the snapshot's GGUF): the pack's choice of teacher class and
    tap (build_teacher) on a scratch project whose teacher material is the snapshot."""
    from trainer_core.project import Project
    _, vl = PACKS[ours.pack.id]
    shutil.rmtree(work, ignore_errors=True)           # a kept folder from an earlier check: made afresh
    root, file = (write_vl_teacher if vl else write_teacher)(work / "teacher", gguf)
    scratch = Project.create(work / "scratch", ours.pack.id)
    scratch.update_settings([f"materials.teacher.path={root}"])
    return ours.pack.build_teacher(Project.open(scratch.root), "cpu"), file


def predict_teacher(ours: Any, teacher: Any, text: str) -> tuple[np.ndarray, list[int]]:
    """(our target rows over the rows the engine runs, the ids the engine runs): a layerwise teacher adds the one
    pad row FLUX.3 reads; Krea 2 stores no pad row; a Qwen3-VL teacher reads text to image (no images)."""
    ids, engine = teacher_ids(ours, text), engine_ids(ours.pack, ours.student, text)
    vision = ([[]],) if "vision" in inspect.signature(teacher.hidden).parameters else ()
    return teacher.hidden([ids], *vision)[0].numpy()[:len(engine)], engine


def check_teacher(driver: Path, ours: Any, version: str, work: Path, fixture: list | None = None) -> dict:
    """PROMPTS through the engine's teacher path and the pack's teacher: {"prompts", "teacher_max_rel",
    "ids_equal", "problems"}; with `fixture` (a list), also the engine's ids and row fingerprints of each."""
    from engine_check import fingerprint, int_lines, rows, run_engine
    teacher, gguf = pack_teacher(ours, work)
    answers = run_engine(driver, _TeacherOnly(ours, gguf), version, list(PROMPTS), work / "dumps")
    out = {"prompts": len(PROMPTS), "teacher_max_rel": 0.0, "ids_equal": True, "problems": []}
    for text, answer in zip(PROMPTS, answers):
        dump = answer["dump"]
        mine, engine_ids = predict_teacher(ours, teacher, text)
        if not (dump / "llm_hidden.bin").exists():
            out["problems"].append(f"{version} {text[:40]!r}: the engine wrote no teacher rows "
                                   f"({answer.get('engine_abort') or answer.get('error')})")
            out["ids_equal"] = False
            continue
        got = rows(dump / "llm_hidden.bin", mine.shape[1])
        got = got[:mine.shape[0]]          # FLUX.3 pads the template to a multiple of 80: the pads' rows are alike
        rel = (float(np.abs(got - mine).max() / max(np.abs(mine).max(), 1e-30)) if got.shape == mine.shape
               else float("inf"))
        out["teacher_max_rel"] = max(out["teacher_max_rel"], rel)
        seen = int_lines(dump / "tokens.txt")
        if seen != engine_ids:
            out["ids_equal"] = False
            out["problems"].append(f"{version} {text[:40]!r}: the engine's ids differ from the template's")
        if rel > 1e-4:
            out["problems"].append(f"{version} {text[:40]!r}: teacher rows {got.shape} vs {mine.shape}, "
                                   f"max_rel {rel:.3g}")
        if fixture is not None:
            fixture.append({"prompt": text, "ids": seen, "teacher": fingerprint(got)})
    return out


class _TeacherOnly:
    """What run_engine reads of an Ours, for the teacher as --llm and no adapter."""

    def __init__(self, ours: Any, gguf: Path) -> None:
        self.student_gguf, self.adapter_path, self.t5 = gguf, None, None
        self.pack, self.project = ours.pack, ours.project
