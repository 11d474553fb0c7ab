"""The plan before a calibration: the placement the settings give on the hardware found, and rough
figures from the pack's shapes and the throughputs the benches measured (bench/RESULTS.md); also the
sizes both sources share — the samples the corpus settings ask for, the student's width, the adapter the
settings build and the shards' disk (`shard_disk_estimate`, which the Setup tab and the status show too).

Placement is the teachers' own rule (contract/placement.py): `teacher_mode` auto is `gpu` when the card's
budget (precompute.gpu_mem_gib, else its total − 1.5 GiB) holds what the pack's teacher says it needs
resident (`packs.estimates.teacher_need_gib`: its weights plus the pack's headroom), else `offload` (the
weights stay in RAM and stream through the card); a pack placed by `placement` fills the chosen card, then
the other cards with room, then CPU RAM (`sequential`), or splits evenly (`balanced`).

Rough times: FLOPs over a machine's matmul rate times the efficiency the benches measured — the
train stage ran at 20 % of the matmul peak on an H200 and 33 % on the 2-core VM; precompute
passes are counted at 30 % — plus what a run pays whatever its size: the driver's start, one start per
stage process (the stages a StageSpec chains share one), the models' libraries and weights loaded once,
a floor per training step and per precompute sample. The FLOPs come from the sizes the project declares:
the teacher's parameters counted from its safetensors headers (its embedding table aside) over the rows a
sample has (the pack's shard_bytes over the row widths; a query kind's queries), the adapter's
multiplying parameters (AdapterKind.table_count aside) and its attention over those rows. Memory is the
stage process's own (interpreter, torch, the models' libraries), the weights, what precompute holds of a
shard and of a reference image, and in training the trained parameters' AdamW state, the shard pages read
and a batch's rows (train_ram). An MoE teacher is counted at its full size, so its precompute is
overestimated. Every figure says it is a rough estimate; on every demo pack it lands within ×2 of the run's
seconds and peak RSS and ±50 % of its bytes (bench/plan_accuracy.py, tests/test_plan.py).
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

from trainer_core.base.atomic import read_json
from trainer_core.base.diskspace import human
from trainer_core.base.errors import TrainerError
from trainer_core.contract.placement import card_budget_gib, card_budgets, teacher_mode
from trainer_core.contract.shards import shard_files, shard_intact
from trainer_core.packs.base import PIG_CLIP_WIDTH
from trainer_core.project import Project
from trainer_core.stages import STAGES
from trainer_core.packs.lookup import find_material, resolve_material, teacher_material_ids
from trainer_core.packs.estimates import reference_pixels, teacher_need_gib

__all__ = ["placement", "rough_stages", "teacher_bytes", "train_ram", "SOURCE", "sample_counts", "student_width",
           "shard_disk_estimate", "adapter_config", "adapter_params"]

SOURCE = ("rough estimate (within ×2 on the demo runs, untested at full size) from the pack's shapes and "
          "bench/RESULTS.md, scaled to this machine; calibrate")
# bf16 dense matmul rates measured or derated to ~80 % of the datasheet (the bench measured 788 of 989 on H200)
_GPU_TFLOPS = (("H200", 790), ("H100", 790), ("A100", 250), ("L40S", 290), ("L40", 145), ("4090", 130),
               ("4080", 80), ("3090", 57), ("A6000", 125), ("A10", 100), ("4070", 47), ("3080", 48), ("T4", 52))
# fp32, what torch reaches on one core: bench/gpu.py's timed 1024³ matmul on the 2-core VM (AMD EPYC, 172 GFLOP/s
# on its two cores), the peak its 33 % train MFU is a share of
_CPU_GFLOPS_PER_CORE = 80.0
_TRAIN_MFU = {"cuda": 0.20, "cpu": 0.33}
_PASS_MFU = 0.30
_LOAD_BYTES_PER_S = 1.0e9            # weights read from disk
_STUDENT_PARAMS = 0.6e9              # pig_clip
# What a run pays whatever its size, measured on the 2-core VM (bench/plan_accuracy.py, bench/RESULTS.md): the
# driver's start; each stage process's (the interpreter, torch and our modules: `import torch` alone takes
# 1.5–3 s there); what the process that loads the models adds (transformers and the models' code); a training
# step's floor (the Python and optimizer work of the smallest adapters: 8–30 ms a step of the width-64 demo
# adapters) and a precompute sample's (tokenizing, batching, writing: 0.4 ms on the PixArt demo). One process
# runs the stages a StageSpec chains, so it starts once.
_DRIVER_S, _PROCESS_START_S, _MODEL_LIBS_S = 0.5, 2.5, 2.0
_STEP_FLOOR_S, _SAMPLE_FLOOR_S = 0.010, 0.001
# A stage process's own memory (the interpreter, torch and our modules: 0.33–0.36 GiB for the train process of
# every demo pack on the VM), what the models' libraries add (precompute: 0.47–0.55 GiB with tiny models), and
# what a process that uses CUDA adds on the host (the context and its libraries; not measured on the VM).
_PROCESS_RSS, _MODEL_LIBS_RSS, _CUDA_RSS = int(0.35 * 2**30), int(0.15 * 2**30), 2**30
# An image pack's precompute also holds its image libraries and, per reference it reads, ~300 bytes a pixel (the
# arrays, the patches and the tower's activations): 0.17–0.44 GiB above a text pack's process on the demos of
# MageFlow (384²), the Qwen3.5 bridge (~0.25 MP) and Ming (1 MP) on the VM
_IMAGE_RSS, _PIXEL_BYTES = int(0.12 * 2**30), 300
_STEP_COPIES = 10                    # float32 copies of a batch's rows a training step holds (input, target,
                                     # standardized target, prediction, its gradient, the loss's terms)
_MAPPED_CAP = 2**30                  # what stays resident of the memory-mapped shards the steps read (the kernel
                                     # drops the rest under pressure)


def sample_counts(project: Project) -> tuple[int, int]:
    """(train, val) samples the corpus settings ask for."""
    return project.pack.corpus_kind.samples(project.settings.corpus)


def student_width(project: Project) -> int:
    """The student's hidden size from its config where the tokenizer folder has one."""
    folder = resolve_material(project, "student_tokenizer")
    config = read_json(folder / "config.json", None) if folder is not None else None
    width = config.get("hidden_size") if isinstance(config, dict) else None
    return width if isinstance(width, int) and width > 0 else PIG_CLIP_WIDTH


def shard_disk_estimate(project: Project) -> dict[str, Any]:
    """Bytes the shards will take: measured on the shards written so far, else from the pack's
    shapes (the teacher's config, or the real teacher's reference shapes before it is on disk).
    {samples, per_sample (None: not known before the first shard), total, source}."""
    count = sum(sample_counts(project))
    files = [f for f in shard_files(project, "train") + shard_files(project, "val") if shard_intact(f)]
    if files:
        from trainer_core.contract.shards import Shard
        done = sum(len(Shard(f)) for f in files)
        per = sum(f.stat().st_size for f in files) / max(done, 1)
        source = f"measured on {done} samples"
    else:
        try:
            dims, source = project.pack.teacher_dims(project), "estimated from the pack's shapes"
        except TrainerError:          # the teacher is not downloaded yet: the real teacher's shapes
            dims, source = dict(project.pack.reference_dims), "estimated from the real teacher's shapes"
        per = project.pack.shard_bytes(project, dims, student_width(project)) if dims else None
    return {"samples": count, "per_sample": per, "total": None if per is None else per * count,
            "source": source if per is not None else "known after the first shard"}


def adapter_config(project: Project) -> Any:
    """The adapter config the settings build: the pack's config of the teacher's dims (the reference dims while
    the teacher is not on disk); None for a pack that cannot size its adapter before precompute."""
    try:
        dims = project.pack.teacher_dims(project)
    except TrainerError:
        dims = dict(project.pack.reference_dims)
    try:
        return project.pack.adapter_config(project, student_width(project), dims)
    except (KeyError, ValueError, TrainerError):
        return None


def adapter_params(project: Project) -> int:
    """Parameters of that adapter, counted by its kind from the tensors it has (no torch: the GUI process
    never imports it); 0 when it cannot be sized yet."""
    config = adapter_config(project)
    return config.spec.parameter_count(config) if config is not None else 0


def teacher_bytes(project: Project) -> int | None:
    """The teacher's weights (every model the pack's precompute loads, pack.teacher_material_ids): the
    safetensors on disk, else the material's size hint (~8.3 GB)."""
    total, known = 0, False
    for material_id in teacher_material_ids(project):
        try:
            material = find_material(project.pack, material_id)
        except KeyError:
            continue
        root = resolve_material(project, material_id)
        found = sum(p.stat().st_size for p in root.rglob("*.safetensors")) if root is not None and root.exists() else 0
        if not found:
            m = re.search(r"([\d.]+)\s*(GB|MB)", material.size_hint or "")
            found = int(float(m.group(1)) * (1e9 if m.group(2) == "GB" else 1e6)) if m else 0
        total, known = total + found, known or bool(found)
    return total if known else None


def _embedding(folder: Any) -> float:
    """vocab × hidden of the config.json in `folder` (its text_config's for a VLM): parameters that
    cost memory but no FLOPs."""
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
    path = resolve_material(project, "student")
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
    need = teacher_need_gib(project)       # what the pack's teacher itself compares
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


def _model_params(root: Path | None) -> int:
    """Parameters in the safetensors files under `root`, counted from their headers (the tensors' shapes, so
    whatever dtype they are stored in); 0 when there are none to read."""
    total = 0
    for path in sorted(root.rglob("*.safetensors")) if root is not None and root.is_dir() else ():
        try:
            with open(path, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        except (OSError, ValueError, struct.error):
            return 0
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for d in entry.get("shape", ()):
                    n *= int(d)
                total += n
    return total


def _text_shape(folder: Path | None) -> tuple[float, float]:
    """(hidden size, layers) of the config.json in `folder` (its text_config's for a VLM); (0, 0) unknown."""
    config = read_json(folder / "config.json", None) if folder is not None else None
    if not isinstance(config, dict):
        return 0.0, 0.0
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden = config.get("hidden_size") or config.get("d_model") or 0
    layers = config.get("num_hidden_layers") or config.get("num_layers") or 0
    return (float(hidden), float(layers)) if isinstance(hidden, int) and isinstance(layers, int) else (0.0, 0.0)


def _teacher_flops(project: Project, tokens: float) -> float:
    """FLOPs of one sample's forward through every model precompute loads besides the student: 2 per weight
    that multiplies (the embedding tables do not) per token, plus attention over the sample's tokens."""
    total = 0.0
    for material_id in teacher_material_ids(project):
        try:
            root = resolve_material(project, material_id)
        except KeyError:
            continue
        params = _model_params(root) or (teacher_bytes(project) or 0) / 2      # the size hint: bf16
        hidden, layers = _text_shape(root)
        total += 2 * max(0.0, params - _embedding(root)) * tokens + 4 * tokens**2 * hidden * layers
    return total


def train_ram(project: Project, config: Any, per_sample: float, samples: tuple[int, int], on_cuda: bool) -> float:
    """Peak RAM of the train stage: its process, the adapter's weights (f32) with the gradient and AdamW's two
    moments of what trains, the shard pages its steps read (capped), and a batch's rows held as _STEP_COPIES
    float32 tensors; on a GPU the weights and the batch live on the card instead."""
    t = project.settings.train
    params = config.spec.parameter_count(config) if config is not None else 0
    frozen = config.spec.frozen_count(config) if config is not None else 0
    touched = min((min(samples[0], t.steps * t.batch_size) + samples[1]) * per_sample, _MAPPED_CAP)
    if on_cuda:
        return _PROCESS_RSS + _CUDA_RSS + 4 * params + touched
    return _PROCESS_RSS + 16 * (params - frozen) + 4 * frozen + touched + _STEP_COPIES * t.batch_size * per_sample * 2


def _adapter_flops(config: Any, rows: float) -> tuple[float, float]:
    """(training FLOPs, forward FLOPs) of one sample through the adapter: 6 (2) per multiplying parameter per
    row it computes, plus attention among those rows."""
    if config is None:
        return 0.0, 0.0
    dense = max(0, config.spec.parameter_count(config) - config.spec.table_count(config))
    attention = 4 * config.depth * rows**2 * config.width
    return 6 * dense * rows + 3 * attention, 2 * dense * rows + attention


def rough_stages(project: Project, hw: dict[str, Any], config: Any, samples: tuple[int, int],
                 vram: dict[str, int], per_sample: float) -> dict[str, dict[str, float | None]]:
    """{stage: {"seconds", "peak_ram_bytes", "peak_vram_bytes"}} before any measurement. `config` is the
    adapter's (None: not known yet), `per_sample` a sample's shard bytes (the pack's shard_bytes)."""
    p, t = project.settings.precompute, project.settings.train
    weights = 0 if p.mock_teacher else (teacher_bytes(project) or 0)
    pass_rate, kind = _rate(hw, p.device)
    train_rate, train_kind = _rate(hw, t.device)
    n_train, n_val = samples
    student = _student_params(project)
    # the rows a sample has: the shard's, a student and a teacher row each (a query kind computes its queries)
    dims = {"out_dim": config.out_dim, "in_dim": config.in_dim} if config is not None else {}
    rows = per_sample / (2 * (dims["in_dim"] + dims["out_dim"])) if dims and per_sample else 90.0
    queries = float(config.spec.step_rows(config)) if config is not None else 0.0
    teacher = 0.0 if p.mock_teacher else _teacher_flops(project, queries or rows)
    student_flops = 2 * max(0.0, student - _embedding(resolve_material(project, "student_tokenizer"))) * rows
    sample_s = _SAMPLE_FLOOR_S + (teacher + student_flops) / (pass_rate * _PASS_MFU)
    load = _MODEL_LIBS_S + (weights + student * 2) / _LOAD_BYTES_PER_S
    rate = train_rate * _TRAIN_MFU[train_kind]
    step_flops, pass_flops = _adapter_flops(config, queries or rows)
    step = _STEP_FLOOR_S + t.batch_size * step_flops / rate
    val_pass = n_val * pass_flops / rate + n_val / max(t.batch_size, 1) * _STEP_FLOOR_S
    vals = t.steps // max(t.val_every, 1) + 1
    params = config.spec.parameter_count(config) if config is not None else 0
    on_gpu = kind == "cuda"
    cuda_ram = _CUDA_RSS if on_gpu else 0
    shard_buffer = 3 * p.shard_size * per_sample                # the rows gathered, packed and written
    pixels = reference_pixels(project)
    images = _IMAGE_RSS + _PIXEL_BYTES * pixels if pixels else 0
    pre_ram = ((0 if on_gpu and sum(vram.values()) >= weights else weights) + 4 * student + _PROCESS_RSS
               + _MODEL_LIBS_RSS + cuda_ram + shard_buffer + images)
    pre_vram = (sum(vram.values()) + 2 * student + 2 * 2**30) if on_gpu else None
    train_vram = 16 * params + 2 * 2**30 if train_kind == "cuda" else None
    small = _PROCESS_RSS + 8 * params + (_CUDA_RSS if train_kind == "cuda" else 0)
    work = {"corpus": 0.002 * (n_train + n_val), "precompute_val": load + n_val * sample_s,
            "precompute_train": n_train * sample_s, "train": t.steps * step + vals * val_pass,
            "export": params * 2 / 2e8, "eval": 2 * val_pass}
    seconds = {}
    for i, spec in enumerate(STAGES):            # a stage that starts a process pays its start (module text)
        starts = i == 0 or not STAGES[i - 1].chains
        extra = (_DRIVER_S if i == 0 else 0.0) + (_PROCESS_START_S if starts else 0.0)
        if spec.name == "precompute_train" and starts:
            extra += load                         # apart from the val split, it loads the models itself
        seconds[spec.name] = extra + work[spec.name]
    return {
        "corpus": {"seconds": seconds["corpus"], "peak_ram_bytes": _PROCESS_RSS, "peak_vram_bytes": None},
        "precompute_val": {"seconds": seconds["precompute_val"], "peak_ram_bytes": pre_ram,
                           "peak_vram_bytes": pre_vram},
        "precompute_train": {"seconds": seconds["precompute_train"], "peak_ram_bytes": pre_ram,
                             "peak_vram_bytes": pre_vram},
        "train": {"seconds": seconds["train"],
                  "peak_ram_bytes": train_ram(project, config, per_sample, samples, train_kind == "cuda"),
                  "peak_vram_bytes": train_vram},
        "export": {"seconds": seconds["export"], "peak_ram_bytes": small, "peak_vram_bytes": None},
        "eval": {"seconds": seconds["eval"], "peak_ram_bytes": small + min(n_val * per_sample, _MAPPED_CAP),
                 "peak_vram_bytes": 4 * params + 2**30 if train_kind == "cuda" else None},
    }
