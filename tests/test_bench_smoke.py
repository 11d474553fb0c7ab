"""bench/gpu.py runs on the CPU at its small size and ends with one JSON line carrying its figures
(a smoke test of the script, not a timing: the figures live in bench/RESULTS.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO


def test_the_gpu_benchmark_runs_on_the_cpu_at_its_small_size():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--steps", "10",
                        "--warmup", "1", "--no-compile", "--no-precompute"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert figures["device"] == "cpu" and figures["size"] == "small"
    for key in ("train_steps_per_s", "train_eager_steps_per_s", "step_steps_per_s", "flops_per_step",
                "floor_steps_per_s", "mfu"):
        assert isinstance(figures[key], (int, float)) and figures[key] > 0, key
