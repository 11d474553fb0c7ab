"""The calibration: the real stages run, as processes, on a scratch copy of the project under
`<project>/.calibration/` with a small corpus drawn the same way (two train shards, one val shard, 30 training
steps), chained as a run chains them. Each stage's wall time, its processes' peak RSS (each one's own VmHWM,
procs.wait_peak_rss) and what it wrote are measured, with the training's rates from its own events (seconds a
step, a validation) and each stage's peak GPU memory as it reported it; make_plan scales them to the project's
counts. Cached in calibration.json under `settings_key`, so a changed setting asks for a new one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.base.errors import TrainerError
from trainer_core.base.procs import wait_peak_rss
from trainer_core.contract import checkpoints
from trainer_core.plan.estimate import sample_counts
from trainer_core.plan.files import CALIBRATION_FILE
from trainer_core.project import Project, last_project, remember_last_project, settings_from_dict
from trainer_core.runner import child_env
from trainer_core.stages import STAGE_NAMES, STAGES
from trainer_core.contract.corpus_kinds import IMAGE, TEXT
from trainer_core.packs.lookup import resolve_material

__all__ = ["calibrate", "settings_key", "SCRATCH", "CAL_STEPS", "CAL_VAL_EVERY"]

SCRATCH = ".calibration"
# the counts any corpus kind scales over (a calibration runs its kind's small corpus: CorpusKind.calibration)
_COUNTS = tuple(k for kind in (TEXT, IMAGE) for k in (*kind.train_counts, *kind.val_counts))
CAL_STEPS, CAL_VAL_EVERY = 30, 15


def settings_key(project: Project) -> str:
    """What a calibration depends on: every setting but the counts it scales over, and the materials."""
    raw = read_json(project.project_json, {}) or {}
    raw = {k: v for k, v in raw.items() if k not in ("name", "auto_resume", "hf_token")}
    # how long, how often and what is kept scale the plan but do not change what is measured
    scaled = tuple(f.name for f in dataclasses.fields(project.settings.train)
                   if f.name in ("steps", "val_every", "save_every", "log_every") or f.name.startswith("hist"))
    for section, keys in (("corpus", _COUNTS), ("train", scaled),
                          ("export", ("output_dir", "copy_to"))):
        raw[section] = {k: v for k, v in (raw.get(section) or {}).items() if k not in keys}
    stamps = []
    for m in project.pack.project_materials(project):
        path = resolve_material(project, m.id)
        if path is not None and path.exists():
            stamps.append((m.id, str(path), int(path.stat().st_mtime)))
    blob = json.dumps({"settings": raw, "materials": stamps}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]



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
    small = dict(project.pack.corpus_kind.calibration)
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
    n_train, n_val = sample_counts(scratch)
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

