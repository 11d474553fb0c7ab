"""bench/gpu.py runs on the CPU at its small size and ends with one JSON line carrying its figures
(a smoke test of the script, not a timing: the figures live in bench/RESULTS.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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


# the published sizes (parameters) each real-size teacher must land in: T5-XXL v1.1's encoder exactly, from
# its config by hand; the others within the rounding of their model cards (4.44B, 8.77B, "16B")
def t5_encoder_params(d: int = 4096, inner: int = 64 * 64, ff: int = 10240, layers: int = 24, vocab: int = 32128,
                      heads: int = 64) -> int:
    attention = 4 * d * inner + d                   # q, k, v, o and the layer norm
    mlp = 2 * d * ff + ff * d + d                   # gated-GELU wi_0, wi_1, wo and the layer norm
    return vocab * d + layers * (attention + mlp) + d + 32 * heads   # + final norm, relative position buckets


REAL_BOUNDS = {"llada_image": (15.5e9, 16.5e9), "qwen3vl_mageflow": (4.0e9, 4.9e9),
               "qwen3vl_qwenimage": (8.0e9, 9.0e9)}


REAL_PACKS = ("t5xxl_pixart", "llada_image", "qwen3vl_mageflow", "qwen3vl_qwenimage")
# The default run takes the path at toy widths on a T5 and a Qwen3-VL teacher (16 s a pack on 2 cores); the
# same path on the other two, and all four at the published widths, run with -m slow.
TINY_DEFAULT = ("t5xxl_pixart", "qwen3vl_mageflow")
_SLOW = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("tiny,packs", [(True, TINY_DEFAULT),
                                        pytest.param(True, tuple(p for p in REAL_PACKS if p not in TINY_DEFAULT),
                                                     marks=_SLOW),
                                        pytest.param(False, REAL_PACKS, marks=_SLOW)],
                         ids=["tiny", "tiny-rest", "published"])
def test_the_real_size_benchmark_smoke_runs_every_pack_through_the_project_paths(tiny, packs):
    """`--size real --smoke`: each pack's teacher at its published widths (one layer a stack), pig_clip's
    config, the project's corpus / precompute / train stages on the CPU, one JSON line per pack. With
    --tiny the same path at toy widths."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--size", "real",
                        "--smoke", *(["--tiny"] if tiny else []), "--prompts", "8", "--pack", *packs],
                       capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert figures["size"] == "real" and figures["smoke"] is True and figures["tiny"] is tiny
    for pack in packs:
        f = figures[pack]
        for key in ("precompute_samples_per_s", "train_steps_per_s", "train_eager_steps_per_s", "flops_per_step",
                    "mfu"):
            assert isinstance(f[key], (int, float)) and f[key] > 0, (pack, key)
        assert f["peak_memory"]["cpu_rss_gib"] > 0 and f["precompute_samples"] >= 8
        assert f["adapter"]["depth"] == 1 and f["adapter"]["batch"] == 2
        if pack == "t5xxl_pixart":
            want = t5_encoder_params(64, 4 * 16, 128, 2, 32128, 4) if tiny else t5_encoder_params()   # the config, not the smoke
            assert f["teacher_params"] == want
        elif tiny:
            assert 0 < f["teacher_params"] < 50e6, (pack, f["teacher_params"])
        else:
            low, high = REAL_BOUNDS[pack]
            assert low < f["teacher_params"] < high, (pack, f["teacher_params"])


def test_the_train_benchmark_runs_a_bridge_pack_end_to_end_and_both_loops_end_on_the_same_weights():
    """bench/train.py --pack on the Qwen3.5 bridge (the slots, the vision keys and the Klein bank), one
    short round, throughput only: the stage (A) and the bare loop (B) run the same optimizer math on the
    same batches, so the bench's own same_weights check must hold; the stage's parts are all called."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "train.py"), "--pack", "qwen35_bridge", "--steps", "12",
                        "--prompts", "100", "--batch", "4", "--rounds", "1", "--no-rss"],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert figures["pack"] == "qwen35_bridge" and figures["same_weights"] is True
    assert figures["stage_calls"]["train_step"] == 12 and figures["stage_calls"]["validate"] == 1
    assert figures["ratio"] > 0 and figures["peak_rss_mib_1x"] == 0.0
    assert "peak RSS not measured" in r.stderr
