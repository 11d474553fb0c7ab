"""The pre-flight plan: seconds, disk bytes, peak RAM / VRAM and placement of every stage of a run,
before it starts, and afterwards how close it came.

Two sources, named in every figure:

* **calibration** (`calibrate`, `gguf-trainer plan --calibrate`, the Setup tab's button): the real
  stages run, as processes, on a scratch copy of the project under `<project>/.calibration/` with a
  small corpus drawn the same way (two train shards, one val shard, 30 training steps). Each stage's
  wall time, its processes' peak RSS (each one's own VmHWM, procs.wait_peak_rss) and what it wrote
  are measured, and scaled to the project's counts: precompute as fixed + per-sample (from the val
  and train splits), training as fixed + per-step + per-validation (from the stage's own log and val
  events), the corpus and the evaluation by the samples they read. Cached in `calibration.json`
  under a key of the settings and the materials, so a changed setting asks for a new one.
* **estimate**: without a calibration, the disk from the pack's shapes (shards, checkpoints, the
  GGUF) and rough times and memory from FLOPs and the benches' throughputs (plan_estimate.py),
  each figure saying it is rough (within ×2 of every demo run: tests/test_plan.py).

`plan.json` keeps the calibrated plan a run starts under; `status.planned_vs_actual` sets it beside
the stage times the driver recorded in state.json.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.base.diskspace import free_bytes, human
from trainer_core.base.errors import TrainerError
from trainer_core.base.procs import wait_peak_rss
from trainer_core.contract.placement import card_budget_gib
from trainer_core.contract import checkpoints
from trainer_core.plan_estimate import SOURCE as ESTIMATE
from trainer_core.plan_estimate import placement, rough_stages, teacher_bytes, train_ram
from trainer_core.project import Project, last_project, remember_last_project, settings_from_dict
from trainer_core.runner import child_env
from trainer_core.stages import STAGE_NAMES, STAGES
from trainer_core.status import PLAN_FILE, student_width, shard_disk_estimate
from trainer_core.packs.lookup import resolve_material
from trainer_core.packs.estimates import teacher_need_gib

__all__ = ["calibrate", "make_plan", "settings_key", "save_planned", "CALIBRATION_FILE", "PLAN_FILE", "hardware"]

CALIBRATION_FILE, SCRATCH = "calibration.json", ".calibration"
CAL_TEXT = {"n_train": 64, "n_val": 24}
CAL_IMAGE = {"n_image": 16, "n_two": 4, "n_text": 12, "n_val_image": 8, "n_val_text": 8}
CAL_STEPS, CAL_VAL_EVERY = 30, 15
LONG_TRAIN_S = 24 * 3600


def _samples(project: Project) -> tuple[int, int]:
    """(train, val) samples the corpus settings ask for."""
    c = project.settings.corpus
    if project.pack.corpus_kind.reference_images:
        return c.n_image + c.n_two + c.n_text, c.n_val_image + c.n_val_text
    return c.n_train, c.n_val


def settings_key(project: Project) -> str:
    """What a calibration depends on: every setting but the counts it scales over, and the materials."""
    raw = read_json(project.project_json, {}) or {}
    raw = {k: v for k, v in raw.items() if k not in ("name", "auto_resume", "hf_token")}
    # how long, how often and what is kept scale the plan but do not change what is measured
    scaled = tuple(f.name for f in dataclasses.fields(project.settings.train)
                   if f.name in ("steps", "val_every", "save_every", "log_every") or f.name.startswith("hist"))
    for section, keys in (("corpus", ("n_train", "n_val", *CAL_IMAGE)), ("train", scaled),
                          ("export", ("output_dir", "copy_to"))):
        raw[section] = {k: v for k, v in (raw.get(section) or {}).items() if k not in keys}
    stamps = []
    for m in project.pack.project_materials(project):
        path = resolve_material(project, m.id)
        if path is not None and path.exists():
            stamps.append((m.id, str(path), int(path.stat().st_mtime)))
    blob = json.dumps({"settings": raw, "materials": stamps}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- calibration

def _scratch(project: Project) -> Project:
    """A copy of the project's settings under .calibration/, its paths made absolute, a small corpus."""
    root = project.root / SCRATCH
    if root.exists():
        shutil.rmtree(root)
    raw = read_json(project.project_json, {}) or {}
    raw = json.loads(json.dumps(raw))
    corpus, pre, train, export = (raw.setdefault(k, {}) for k in ("corpus", "precompute", "train", "export"))
    for key in ("extra_files", "image_folders"):
        corpus[key] = [str(project.resolve_user_path(p)) for p in getattr(project.settings.corpus, key)]
    for key in ("train_file", "val_file"):
        value = getattr(project.settings.corpus, key)
        corpus[key] = str(project.resolve_user_path(value)) if value else ""
    small = CAL_IMAGE if project.pack.corpus_kind.reference_images else CAL_TEXT
    corpus.update(small)
    n_train = sum(v for k, v in small.items() if "val" not in k)
    n_val = sum(v for k, v in small.items() if "val" in k)
    pre.update(shard_size=n_train // 2, val_shard_size=n_val)
    train.update(steps=CAL_STEPS, val_every=CAL_VAL_EVERY, save_every=CAL_VAL_EVERY, log_every=5, history=False,
                 warmup=min(int(project.settings.train.warmup), 10))
    export.update(output_dir=str(root / "out"), copy_to="", run_eval=True)
    materials = raw.setdefault("materials", {})
    for m in project.pack.project_materials(project):
        path = resolve_material(project, m.id)
        if path is not None:
            materials[m.id] = {**(materials.get(m.id) or {}), "path": str(path)}
    raw.pop("hf_token", None)
    remembered = last_project()
    scratch = Project.create(root, project.pack.id, name=project.settings.name)
    if remembered is not None:              # the scratch copy is never the "last project" the GUI reopens
        remember_last_project(remembered)
    scratch.save_settings(settings_from_dict(raw))
    return Project.open(root)


def _chain_groups() -> list[tuple[str, ...]]:
    """The stages one process runs in a run (StageSpec.chains): corpus … precompute_train, train … eval."""
    groups: list[list[str]] = [[]]
    for spec in STAGES:
        groups[-1].append(spec.name)
        if not spec.chains:
            groups.append([])
    return [tuple(g) for g in groups if g]


def _run_stages(scratch: Project, stages: tuple[str, ...]) -> tuple[dict[str, float], int]:
    """(seconds per stage, peak RSS bytes) of `stages` run by one driver, chained as a run chains them:
    each stage's started → finished span from state.json, the rest of the wall (the driver's and the
    process's start-up) counted to the first stage."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core.pipeline", "--project", str(scratch.root),
                             "--only", *stages], env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=scratch.root)
    peak = wait_peak_rss(proc)
    wall = time.monotonic() - started
    state = scratch.read_state()
    if proc.returncode != 0:
        error = state.get("error") or "no message"
        stage = state.get("stage") or stages[0]
        raise TrainerError(f"The calibration's {stage} stage failed ({error}; its log is {scratch.pipeline_log}); "
                           "the plan cannot measure this machine until the stage runs.")
    spans = {}
    for stage in stages:
        entry = state["stages"].get(stage, {})
        spans[stage] = max(0.0, float(entry.get("finished") or 0) - float(entry.get("started") or 0))
    spans[stages[0]] += max(0.0, wall - sum(spans.values()))
    return spans, peak


def _folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _train_rates(scratch: Project) -> tuple[float, float]:
    """(seconds per step, seconds per validation) from the training stage's own events."""
    logs, vals, starts = [], [], []
    for line in scratch.events_jsonl.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("stage") != "train":
            continue
        p = e.get("payload", {})
        if e.get("type") == "progress" and str(p.get("detail", "")).startswith("validating"):
            starts.append(e["time"])
        elif e.get("type") == "metric" and "val_cos" in p and starts:
            vals.append(e["time"] - starts[-1])
        elif e.get("type") == "metric" and "loss" in p and "step" in p:
            logs.append((e["time"], int(p["step"])))
    val_s = sorted(vals)[len(vals) // 2] if vals else 0.0
    if len(logs) < 2:
        return 0.0, val_s
    (t0, s0), (t1, s1) = logs[0], logs[-1]
    inside = sum(1 for t in starts if t0 < t < t1)
    return max(0.0, (t1 - t0 - inside * val_s) / max(s1 - s0, 1)), val_s


def _chained(scratch: Project) -> dict[str, bool]:
    """Per stage, whether it ran in the previous stage's process (the driver's "running" events share a pid)."""
    pids: dict[str, int] = {}
    for line in scratch.events_jsonl.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
            p = e["payload"]
        except (ValueError, KeyError):
            continue
        if e.get("type") == "status" and p.get("status") == "running" and p.get("pid") and e.get("stage"):
            pids[e["stage"]] = p["pid"]
    return {b: pids.get(a) is not None and pids.get(a) == pids.get(b) for a, b in zip(STAGE_NAMES, STAGE_NAMES[1:])}


def _vram_peaks(scratch: Project) -> dict[str, int]:
    """Each stage's peak GPU memory as its process reported it (none on a machine without CUDA)."""
    peaks: dict[str, int] = {}
    for line in scratch.events_jsonl.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
            value = e["payload"].get("peak_vram_bytes") if e.get("type") == "metric" else None
        except (ValueError, KeyError, AttributeError):
            continue
        if value:
            peaks[e.get("stage")] = max(peaks.get(e.get("stage"), 0), int(value))
    return peaks


def calibrate(project: Project, say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Run every stage on a scratch copy (see the module text); the measurements, cached. A stage that
    fails leaves the scratch copy for its log to be read (the next calibration starts it afresh)."""
    scratch = _scratch(project)
    seconds, rss = {}, {}
    for group in _chain_groups():
        say(f"calibrating {' → '.join(group)} …")
        spans, peak = _run_stages(scratch, group)
        seconds.update(spans)
        rss.update({stage: peak for stage in group})      # one process: its peak is each stage's bound
    n_train, n_val = _samples(scratch)
    step_s, val_s = _train_rates(scratch)
    shards = [p for split in ("train", "val") for p in scratch.shards_dir(split).glob(f"{split}-*.safetensors")]
    record = {
        "key": settings_key(project), "time": time.time(), "samples": {"train": n_train, "val": n_val},
        "shard_size": scratch.settings.precompute.shard_size, "seconds": seconds, "rss": rss,
        "step_s": step_s, "val_s": val_s, "steps": CAL_STEPS, "val_every": CAL_VAL_EVERY,
        "vram": _vram_peaks(scratch), "chained": _chained(scratch),
        "bytes": {"corpus": _folder_bytes(scratch.data_dir), "shards": sum(_folder_bytes(p) for p in shards),
                  "checkpoints": sum(_folder_bytes(checkpoints.weights_path(scratch, which))
                                     for which in (checkpoints.LAST, checkpoints.BEST)),
                  "export": _folder_bytes(scratch.output_dir()),
                  "fitted": sum(_folder_bytes(p) for p in scratch.root.glob("*.pt")),
                  "logs": _folder_bytes(scratch.events_jsonl) + _folder_bytes(scratch.pipeline_log)},
    }
    shutil.rmtree(scratch.root, ignore_errors=True)
    atomic_write_json(project.root / CALIBRATION_FILE, record)
    return record


# ---------------------------------------------------------------- the plan

def hardware() -> dict[str, Any]:
    """What the plan scales to: CPU count, RAM available, GPUs (nvidia-smi), no torch import."""
    import psutil

    from trainer_core.base.hardware import gpu_readings
    gpus = [{"index": int(g["index"]), "name": g.get("name"), "memory_bytes": int(float(g["memory.total"]) * 2**20)}
            for g in (gpu_readings() or []) if str(g.get("memory.total", "")).replace(".", "").isdigit()]
    memory = psutil.virtual_memory()
    return {"cpus": os.cpu_count() or 1, "ram_available_bytes": memory.available, "ram_total_bytes": memory.total,
            "gpus": gpus}


def _stage(seconds: float | None, disk: float, ram: float | None, vram: float | None, source: str) -> dict[str, Any]:
    return {"seconds": None if seconds is None else round(seconds, 1), "disk_bytes": int(disk),
            "peak_ram_bytes": None if ram is None else int(ram), "peak_vram_bytes": None if vram is None else int(vram),
            "source": source}


def _adapter_config(project: Project) -> Any:
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


def _adapter_params(project: Project) -> int:
    """Parameters of that adapter, counted by its kind from the tensors it has (no torch: the GUI process
    never imports it); 0 when it cannot be sized yet."""
    config = _adapter_config(project)
    return config.spec.parameter_count(config) if config is not None else 0


def make_plan(project: Project, hw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan in the JSON shape of `gguf-trainer plan --json` (module text)."""
    hw = hw or hardware()
    where = placement(project, hw)
    cal = read_json(project.root / CALIBRATION_FILE, None)
    calibrated = isinstance(cal, dict) and cal.get("key") == settings_key(project)
    n_train, n_val = _samples(project)
    t, e = project.settings.train, project.settings.export
    vals = t.steps // max(t.val_every, 1) + 1
    stages: dict[str, Any] = {}
    if calibrated:
        src = f"calibration on this machine ({time.strftime('%Y-%m-%d %H:%M', time.localtime(cal['time']))})"
        s, r, b, v = cal["seconds"], cal["rss"], cal["bytes"], cal.get("vram") or {}
        ct, cv = cal["samples"]["train"], cal["samples"]["val"]
        # the train split in the val split's process (a chain) pays no start-up or model loading: its
        # seconds are all per sample; apart, both splits pay the same fixed cost
        chained = bool((cal.get("chained") or {}).get("precompute_train"))
        per_sample_s = (s["precompute_train"] / max(ct, 1) if chained
                        else max(0.0, (s["precompute_train"] - s["precompute_val"]) / max(ct - cv, 1)))
        fixed = max(0.0, s["precompute_val"] - cv * per_sample_s)
        per_shard_bytes = b["shards"] / max(ct + cv, 1)
        # a bigger shard holds more rows in memory while it is built and written
        grow = max(0.0, (project.settings.precompute.shard_size - cal["shard_size"]) * per_shard_bytes * 2)
        ratio = (n_train + n_val) / max(ct + cv, 1)
        train_fixed = max(0.0, s["train"] - cal["steps"] * cal["step_s"]
                          - (cal["steps"] // cal["val_every"] + 1) * cal["val_s"])
        val_real = cal["val_s"] * n_val / max(cv, 1)
        stages["corpus"] = _stage(s["corpus"] * (ratio if project.pack.corpus_kind.reference_images else 1),
                                  b["corpus"] * ratio, r["corpus"], None, src)
        for split, n in (("val", n_val), ("train", n_train)):
            once = fixed if split == "val" or not chained else 0.0
            stages[f"precompute_{split}"] = _stage(once + n * per_sample_s, n * per_shard_bytes,
                                                   r[f"precompute_{split}"] + grow, v.get(f"precompute_{split}"), src)
        stages["precompute_val"]["disk_bytes"] += int(b["fitted"])          # vision_proj.pt and the like
        history = (t.history_keep or max(0, t.steps // max(t.history_every or t.val_every, 1))) if t.history else 0
        stages["train"] = _stage(train_fixed + t.steps * cal["step_s"] + vals * val_real,
                                 b["checkpoints"] * (1 + history / 4) + b["logs"] * t.steps / cal["steps"],
                                 r["train"], v.get("train"), src)
        stages["export"] = _stage(s["export"], b["export"] * (2 if e.copy_to else 1), r["export"], v.get("export"),
                                  src)
        # in the train process (a chain) eval is one pass over val: its own seconds, scaled; apart it also
        # paid a process start, and its pass is about a training validation
        eval_s = (s["eval"] * n_val / max(cv, 1) if (cal.get("chained") or {}).get("eval")
                  else max(0.0, s["eval"] - cal["val_s"]) + val_real)
        stages["eval"] = _stage(eval_s, 4096, r["eval"], v.get("eval"), src)
    else:
        shards = shard_disk_estimate(project)
        per = shards["per_sample"] or 0
        config = _adapter_config(project)
        params = config.spec.parameter_count(config) if config is not None else 0
        trained = params - (config.spec.frozen_count(config) if config is not None else 0)
        rough = rough_stages(project, hw, config, (n_train, n_val), where[1], per)
        disk = {"corpus": 200 * (n_train + n_val), "precompute_val": per * n_val, "precompute_train": per * n_train,
                "train": 2 * (4 * params + 8 * trained),         # last and best: f32 weights, AdamW's moments
                "export": params * 2 * (2 if e.copy_to else 1), "eval": 4096}
        for name, figures in rough.items():
            stages[name] = _stage(figures["seconds"], disk[name], figures["peak_ram_bytes"],
                                  figures["peak_vram_bytes"], ESTIMATE)
    known = [v["seconds"] for v in stages.values()]
    plan = {"stages": stages, "total_seconds": None if None in known else round(sum(known), 1),
            "total_disk_bytes": int(sum(v["disk_bytes"] for v in stages.values())),
            "peak_ram_bytes": max((v["peak_ram_bytes"] or 0 for v in stages.values()), default=0) or None,
            "peak_vram_bytes": max((v["peak_vram_bytes"] or 0 for v in stages.values()), default=0) or None,
            "placement": where[0], "calibrated": calibrated,
            "warnings": [], "key": settings_key(project)}
    plan["warnings"] = _warnings(project, plan, hw)
    return plan


def _warnings(project: Project, plan: dict[str, Any], hw: dict[str, Any]) -> list[str]:
    out = []
    free = free_bytes(project.root)
    shards = plan["stages"]["precompute_train"]["disk_bytes"] + plan["stages"]["precompute_val"]["disk_bytes"]
    other = plan["total_disk_bytes"] - shards
    n_train, n_val = _samples(project)
    if free is not None and other > free:
        out.append(f"Not enough disk: the checkpoints and the export alone take ~{human(other)} but {human(free)} is "
                   f"free at {project.root}; train a smaller adapter (train.depth={project.settings.train.depth} and "
                   f"train.width={project.settings.train.width} set its size) or free space first.")
    elif free is not None and plan["total_disk_bytes"] > free:
        per = shards / max(n_train + n_val, 1)
        out.append(f"Not enough disk: the run writes ~{human(plan['total_disk_bytes'])} but {human(free)} is free "
                   f"at {project.root}; " + _corpus_that_fits(project, free - other, 0.0, per,
                                                             "fits, or free space first", "free space first") + ".")
    weights = teacher_bytes(project)
    if weights and not project.settings.precompute.mock_teacher:
        mode = getattr(project.settings.precompute, project.pack.teacher_control, "auto")
        need_gib = teacher_need_gib(project)        # the teacher's own figure (contract/placement.py)
        need = int(need_gib * 2**30) if need_gib is not None else weights + 3 * 2**30
        budget = int(card_budget_gib(hw["gpus"][0]["memory_bytes"] / 2**30,
                                     project.settings.precompute.gpu_mem_gib) * 2**30) if hw["gpus"] else 0
        if hw["gpus"] and mode == "gpu" and need > budget:
            out.append(f"The teacher does not fit the card: teacher_mode=gpu needs ~{human(need)} on the GPU but the "
                       f"budget is {human(budget)}; set precompute.teacher_mode=offload (the weights stay in RAM "
                       f"and stream through the card) or auto.")
        ram = hw["ram_available_bytes"]
        if (not hw["gpus"] or mode == "offload") and weights > ram:
            out.append(f"The teacher does not fit in memory: its weights take ~{human(weights)} and {human(ram)} of "
                       f"RAM is available; {_stream_hint(project)}, or free memory.")
    out += _memory_warnings(project, plan, hw)
    seconds = plan["stages"]["train"]["seconds"]
    if seconds and seconds > LONG_TRAIN_S:
        per = seconds / max(project.settings.train.steps, 1)
        steps = int(LONG_TRAIN_S / per)
        out.append(f"Training takes ~{seconds / 3600:.0f} h; train.steps={steps} would take about a day "
                   f"(the schedule follows a changed count at any time).")
    pre = [plan["stages"][f"precompute_{s}"]["seconds"] for s in ("train", "val")]
    if pre[0] and sum(pre) > LONG_TRAIN_S:
        out.append(_precompute_hint(project, pre[0], pre[1] or 0.0, n_train, n_val))
    return out


def _precompute_hint(project: Project, train_s: float, val_s: float, n_train: int, n_val: int) -> str:
    """A precompute longer than a day, and the corpus that takes a day (_corpus_that_fits: the val stage's fixed
    cost, loading the models, kept)."""
    per = train_s / max(n_train, 1)
    head = f"Precompute takes ~{(train_s + val_s) / 3600:.0f} h for {n_train} train samples"
    gpu = f"at {per:.0f} s a sample on this machine, precompute on a GPU (precompute.device=cuda) or free the machine"
    return f"{head}; " + _corpus_that_fits(project, LONG_TRAIN_S, max(0.0, val_s - n_val * per), per,
                                           "would take a day", gpu) + "."


def _corpus_that_fits(project: Project, room: float, fixed: float, per: float, fits: str, otherwise: str) -> str:
    """The corpus whose samples, at `per` each (seconds or bytes) over a `fixed` cost, fit `room`: the train split
    cut, each count of its mix alike, beside the val split as set; when the val split alone fills the room, both
    cut alike; `otherwise` when not one sample of a split fits. Every count it names is at least 1 and, set, fits."""
    c = project.settings.corpus
    n_train, n_val = _samples(project)
    train_keys, val_keys = (("n_image", "n_two", "n_text"), ("n_val_image", "n_val_text")) \
        if project.pack.corpus_kind.reference_images else (("n_train",), ("n_val",))

    def cut(keys: tuple[str, ...], scale: float) -> dict[str, int]:
        return {k: max(1, int(getattr(c, k) * scale)) for k in keys if getattr(c, k)}

    def named(counts: dict[str, int]) -> str:
        return ", ".join(f"corpus.{k}={n}" for k, n in counts.items())

    if per <= 0:
        return otherwise
    left = room - fixed - n_val * per
    if left >= per:
        train = cut(train_keys, int(left / per) / max(n_train, 1))
        if fixed + (sum(train.values()) + n_val) * per <= room:
            return f"a corpus of about {sum(train.values())} train samples ({named(train)}) {fits}"
    scale = max(0.0, room - fixed) / (per * max(n_train + n_val, 1))
    train, val = cut(train_keys, scale), cut(val_keys, scale)
    if train and val and fixed + per * (sum(train.values()) + sum(val.values())) <= room:
        return (f"the {n_val} val samples alone leave no room; about {sum(train.values())} train and "
                f"{sum(val.values())} val samples ({named(train)}, {named(val)}) {fits}")
    return otherwise


def _stream_hint(project: Project) -> str:
    """How this pack's teacher leaves RAM for the card: the setting the pack places it with."""
    if project.pack.teacher_control == "teacher_mode":
        return "use a GPU with precompute.teacher_mode=offload (the weights stream through the card) or auto"
    return (f"use a GPU: precompute.{project.pack.teacher_control} spreads the teacher over the cards "
            f"(precompute.gpu_mem_gib, precompute.cpu_mem_gib bound each)")


def _memory_warnings(project: Project, plan: dict[str, Any], hw: dict[str, Any]) -> list[str]:
    """The plan's own peak RAM against this machine's: when a stage would need more than the machine has, say
    which and the setting value that fits (for the adapter's stages, the deepest train.depth whose train stage
    the estimate's rule, plan_estimate.train_ram, keeps within 90 % of the RAM)."""
    total = hw.get("ram_total_bytes")
    peak = plan.get("peak_ram_bytes")
    if not total or not peak or peak <= total:
        return []
    stage = max(plan["stages"], key=lambda name: plan["stages"][name]["peak_ram_bytes"] or 0)
    head = (f"The {stage} stage would need ~{human(peak)} of RAM (the plan's peak) but this machine has "
            f"{human(total)}")
    if stage.startswith("precompute"):
        return [head + f"; {_stream_hint(project)}, or lower precompute.teacher_batch."]
    t, config = project.settings.train, _adapter_config(project)
    if config is None:
        return [head + "; lower train.depth or train.width."]
    per, samples = shard_disk_estimate(project)["per_sample"] or 0, _samples(project)
    on_cuda = bool(hw["gpus"]) and t.device != "cpu"

    def fits(depth: int) -> bool:
        return train_ram(project, dataclasses.replace(config, depth=depth), per, samples, on_cuda) <= 0.9 * total
    low, high = 0, t.depth              # the parameters grow with the depth: the deepest that fits, by bisection
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    if low:
        return [head + f"; train.depth={low} fits (train.width={t.width}), or lower train.width."]
    return [head + "; even train.depth=1 does not fit at this width: lower train.width."]


def save_planned(project: Project, plan: dict[str, Any]) -> None:
    """Keep the plan a run starts with (planned vs actual)."""
    atomic_write_json(project.root / PLAN_FILE, {**plan, "saved": time.time()})
