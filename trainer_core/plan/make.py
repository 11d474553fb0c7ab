"""make_plan: the plan in the JSON shape of `gguf-trainer plan --json` — per stage seconds, disk bytes, peak
RAM / VRAM and their source, the totals, the placement and the warnings — from the calibration when one
matches the settings (calibration.py's measurements, scaled to the project's counts), else from the rough
estimate (estimate.py)."""
from __future__ import annotations

import os
import time
from typing import Any

from trainer_core.base.atomic import read_json
from trainer_core.plan.advice import plan_warnings
from trainer_core.plan.calibration import settings_key
from trainer_core.plan.estimate import SOURCE as ESTIMATE
from trainer_core.plan.estimate import adapter_config, placement, rough_stages, sample_counts, shard_disk_estimate
from trainer_core.plan.files import CALIBRATION_FILE
from trainer_core.project import Project

__all__ = ["make_plan", "hardware"]


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


def make_plan(project: Project, hw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan in the JSON shape of `gguf-trainer plan --json` (module text)."""
    hw = hw or hardware()
    where = placement(project, hw)
    cal = read_json(project.root / CALIBRATION_FILE, None)
    calibrated = isinstance(cal, dict) and cal.get("key") == settings_key(project)
    n_train, n_val = sample_counts(project)
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
        config = adapter_config(project)
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
    plan["warnings"] = plan_warnings(project, plan, hw)
    return plan

