"""The pre-flight plan: seconds, disk bytes, peak RAM / VRAM and placement of every stage of a run,
before it starts, and afterwards how close it came.

Two sources, named in every figure:

* **calibration** (calibration.py: `calibrate`, `gguf-trainer plan --calibrate`, the Setup tab's button): the real
  stages run, as processes, on a scratch copy of the project with a small corpus; each stage's wall time,
  peak RSS and what it wrote are measured and scaled to the project's counts (make.py): precompute as
  fixed + per-sample (from the val and train splits), training as fixed + per-step + per-validation (from
  the stage's own log and val events), the corpus and the evaluation by the samples they read.
* **estimate** (estimate.py): without a calibration, the disk from the pack's shapes (shards, checkpoints,
  the GGUF) and rough times and memory from FLOPs and the benches' throughputs, each figure saying it is
  rough (within ×2 of every demo run: tests/test_plan.py).

advice.py turns a plan into warnings that each name the setting value that fits; files.py names the plan's
files (calibration.json, plan.json: the calibrated plan a run starts under) and sets plan.json beside the
stage times the driver recorded in state.json (`planned_vs_actual`, in the status report).
"""
from __future__ import annotations

from trainer_core.plan.advice import stream_hint
from trainer_core.plan.calibration import calibrate, settings_key
from trainer_core.plan.estimate import (adapter_params, placement, sample_counts, shard_disk_estimate, student_width,
                                        teacher_bytes)
from trainer_core.plan.files import CALIBRATION_FILE, PLAN_FILE, planned_vs_actual, save_planned
from trainer_core.plan.make import hardware, make_plan

__all__ = ["make_plan", "hardware", "calibrate", "settings_key", "save_planned", "planned_vs_actual",
           "CALIBRATION_FILE", "PLAN_FILE", "placement", "shard_disk_estimate", "student_width", "sample_counts",
           "adapter_params", "teacher_bytes", "stream_hint"]
