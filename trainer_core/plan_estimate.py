"""The plan before a calibration: the placement the settings give on the hardware found, and rough
figures from the pack's shapes and the throughputs the benches measured (bench/RESULTS.md).

Placement is the teachers' own rule (contract/placement.py): `teacher_mode` auto is `gpu` when the card's
budget (precompute.gpu_mem_gib, else its total − 1.5 GiB) holds what the pack's teacher says it needs
resident (`TrainerPack.teacher_need_gib`: its weights plus the pack's headroom), else `offload` (the
weights stay in RAM and stream through the card); a pack placed by `placement` fills the chosen card, then
the other cards with room, then CPU RAM (`sequential`), or splits evenly (`balanced`).

Rough times: FLOPs over a machine's matmul rate times the efficiency the benches measured — the
train stage ran at 20 % of the matmul peak on an H200 and 33 % on the 2-core VM; precompute
passes are counted at 30 % — plus a fixed start per stage. An MoE teacher is counted at its full
size, so its precompute is overestimated. Every figure says it is a rough estimate: on the five demo
packs the rough total came within 0.66–3.3× of the run (bench/RESULTS.md).
"""
from __future__ import annotations

import re
from typing import Any

from trainer_core.base.diskspace import human
from trainer_core.contract.placement import card_budget_gib, card_budgets, teacher_mode
from trainer_core.project import Project

__all__ = ["placement", "rough_stages", "teacher_bytes", "SOURCE"]

SOURCE = "rough estimate (±4×) from the pack's shapes and bench/RESULTS.md, scaled to this machine; calibrate"
# bf16 dense matmul rates measured or derated to ~80 % of the datasheet (the bench measured 788 of 989 on H200)
_GPU_TFLOPS = (("H200", 790), ("H100", 790), ("A100", 250), ("L40S", 290), ("L40", 145), ("4090", 130),
               ("4080", 80), ("3090", 57), ("A6000", 125), ("A10", 100), ("4070", 47), ("3080", 48), ("T4", 52))
_CPU_GFLOPS_PER_CORE = 40.0          # fp32, what torch reaches on one AVX2 core
_TRAIN_MFU = {"cuda": 0.20, "cpu": 0.33}
_PASS_MFU = 0.30
_STAGE_START_S = 8.0                 # a stage process: interpreter, torch and transformers imports
_LOAD_BYTES_PER_S = 1.0e9            # weights read from disk
_STUDENT_PARAMS = 0.6e9              # pig_clip
_TOKENS = 90                         # a prompt with its template, on average


def teacher_bytes(project: Project) -> int | None:
    """The teacher's weights (every model the pack's precompute loads, pack.teacher_material_ids): the
    safetensors on disk, else the material's size hint (~8.3 GB)."""
    total, known = 0, False
    for material_id in project.pack.teacher_material_ids(project):
        try:
            material = project.pack.material(material_id)
        except KeyError:
            continue
        root = project.pack.resolve_material(project, material_id)
        found = sum(p.stat().st_size for p in root.rglob("*.safetensors")) if root is not None and root.exists() else 0
        if not found:
            m = re.search(r"([\d.]+)\s*(GB|MB)", material.size_hint or "")
            found = int(float(m.group(1)) * (1e9 if m.group(2) == "GB" else 1e6)) if m else 0
        total, known = total + found, known or bool(found)
    return total if known else None


def _embedding(folder: Any) -> float:
    """vocab × hidden of the config.json in `folder` (its text_config's for a VLM): parameters that
    cost memory but no FLOPs."""
    from trainer_core.base.atomic import read_json
    config = read_json(folder / "config.json", None) if folder is not None else None
    if not isinstance(config, dict):
        return 0.0
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        return float(config["vocab_size"]) * float(config.get("hidden_size") or config.get("d_model"))
    except (KeyError, TypeError, ValueError):
        return 0.0


def _student_params(project: Project) -> float:
    """pig_clip's parameters: the student GGUF's size at 2 bytes a weight, else the real 0.6B."""
    path = project.pack.resolve_material(project, "student")
    try:
        return path.stat().st_size / 2 if path is not None and path.is_file() else _STUDENT_PARAMS
    except OSError:
        return _STUDENT_PARAMS


def _budget(hw: dict[str, Any], gpu_mem_gib: float) -> int:
    return int(card_budget_gib(hw["gpus"][0]["memory_bytes"] / 2**30, gpu_mem_gib) * 2**30)


def placement(project: Project, hw: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """(what goes where, in words; the teacher's bytes per GPU index)."""
    p, t = project.settings.precompute, project.settings.train
    device = t.device if t.device != "auto" else ("cuda:0" if hw["gpus"] else "cpu")
    train = f"the adapter trains on {device}" + (f" (DDP over {t.gpus} GPUs)" if t.gpus > 1 else "")
    if p.mock_teacher:
        return f"mock teacher (synthetic targets): nothing to place; {train}", {}
    weights = teacher_bytes(project) or 0
    if not hw["gpus"] or p.device == "cpu":
        return (f"teacher on the CPU: ~{human(weights)} of weights in RAM ({human(hw['ram_available_bytes'])} "
                f"available); student on the CPU; {train}"), {}
    gpu, budget = hw["gpus"][0], _budget(hw, p.gpu_mem_gib)
    if project.pack.teacher_control == "placement":
        shares: dict[int, int] = {}
        left = weights
        totals = {g["index"]: g["memory_bytes"] / 2**30 for g in hw["gpus"]}
        rooms = card_budgets(gpu["index"], [totals.get(i, 0.0) for i in range(max(totals) + 1)], p.gpu_mem_gib)
        cards = [(index, int(gib * 2**30)) for index, gib in rooms.items()]
        if p.placement == "balanced":
            for index, room in cards:
                shares[index] = min(room, weights // len(cards))
            left = weights - sum(shares.values())
        else:
            for index, room in cards:
                shares[index] = min(room, left)
                left -= shares[index]
        where = ", ".join(f"{human(v)} on GPU {k}" for k, v in shares.items() if v)
        ram = f", {human(left)} in CPU RAM (accelerate hooks)" if left > 0 else ""
        return f"teacher placement={p.placement}: {where or 'nothing on the GPUs'}{ram}; {train}", shares
    need = project.pack.teacher_need_gib(project)       # what the pack's teacher itself compares
    if need is None:                                     # no files yet: the size hint and the usual headroom
        need = weights / 2**30 + 3.0
    mode = teacher_mode(p.teacher_mode, True, budget / 2**30, need)
    if mode == "gpu":
        return (f"teacher_mode {p.teacher_mode} → gpu: the teacher's ~{human(weights)} resident on GPU {gpu['index']} "
                f"({gpu['name']}, budget {human(budget)}); {train}"), {gpu["index"]: weights}
    return (f"teacher_mode {p.teacher_mode} → offload: the teacher's ~{human(weights)} stay in RAM and stream through "
            f"GPU {gpu['index']} ({gpu['name']}) layer by layer; {train}"), {gpu["index"]: min(weights, 2 * 2**30)}


def _rate(hw: dict[str, Any], device: str) -> tuple[float, str]:
    """(matmul FLOP/s, "cuda" | "cpu") of the device a stage runs on."""
    if hw["gpus"] and device != "cpu":
        name = str(hw["gpus"][0].get("name") or "")
        tflops = next((v for key, v in _GPU_TFLOPS if key in name), 60)
        return tflops * 1e12, "cuda"
    return hw["cpus"] * _CPU_GFLOPS_PER_CORE * 1e9, "cpu"


def rough_stages(project: Project, hw: dict[str, Any], params: int, samples: tuple[int, int],
                 vram: dict[str, int]) -> dict[str, dict[str, float | None]]:
    """{stage: {"seconds", "peak_ram_bytes", "peak_vram_bytes"}} before any measurement."""
    p, t = project.settings.precompute, project.settings.train
    weights = 0 if p.mock_teacher else (teacher_bytes(project) or 0)
    teacher_params = weights / 2                                            # bf16 on disk
    pass_rate, kind = _rate(hw, p.device)
    train_rate, train_kind = _rate(hw, t.device)
    n_train, n_val = samples
    student = _student_params(project)
    pack = project.pack
    teacher_root = pack.resolve_material(project, "teacher") if "teacher" in {m.id for m in pack.materials} else None
    compute = max(0.0, teacher_params - _embedding(teacher_root)) + max(
        0.0, student - _embedding(pack.resolve_material(project, "student_tokenizer")))
    per_sample = 2 * compute * _TOKENS / (pass_rate * _PASS_MFU)
    load = _STAGE_START_S + (weights + student * 2) / _LOAD_BYTES_PER_S
    rows = t.batch_size * 2 * _TOKENS
    step = 6 * params * rows / (train_rate * _TRAIN_MFU[train_kind])
    val_pass = n_val * 2 * _TOKENS * 2 * params / (train_rate * _TRAIN_MFU[train_kind])
    vals = t.steps // max(t.val_every, 1) + 1
    on_gpu = kind == "cuda"
    pre_ram = (0 if on_gpu and sum(vram.values()) >= weights else weights) + 4 * student + 2**30
    pre_vram = (sum(vram.values()) + 2 * student + 2 * 2**30) if on_gpu else None
    train_vram = 16 * params + 2 * 2**30 if train_kind == "cuda" else None
    small = 2**30 + 8 * params
    return {
        "corpus": {"seconds": _STAGE_START_S + 0.002 * (n_train + n_val), "peak_ram_bytes": 2**30,
                   "peak_vram_bytes": None},
        "precompute_val": {"seconds": load + n_val * per_sample, "peak_ram_bytes": pre_ram,
                           "peak_vram_bytes": pre_vram},
        "precompute_train": {"seconds": load + n_train * per_sample, "peak_ram_bytes": pre_ram,
                             "peak_vram_bytes": pre_vram},
        "train": {"seconds": _STAGE_START_S + t.steps * step + vals * val_pass,
                  "peak_ram_bytes": 2**30 + 16 * params, "peak_vram_bytes": train_vram},
        "export": {"seconds": _STAGE_START_S + params * 2 / 2e8, "peak_ram_bytes": small, "peak_vram_bytes": None},
        "eval": {"seconds": _STAGE_START_S + val_pass, "peak_ram_bytes": small,
                 "peak_vram_bytes": 4 * params + 2**30 if train_kind == "cuda" else None},
    }
