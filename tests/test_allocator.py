"""The stage processes' heap settings (base/allocator.py): the top pad with the pinned mmap threshold,
and the large-block mode the train stage takes on the CPU when a step's tensors are above glibc's
mmap ceiling. Each setting is tried in a fresh interpreter, so this process keeps its own heap."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from trainer_core.base.allocator import MMAP_THRESHOLD, needs_large_blocks
from trainer_core.contract.kinds import AdapterConfig
from trainer_core.stages.precompute import large_block_batches
from trainer_core.stages.train import large_block_step

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# allocate, touch and free a 64 MiB tensor 20 times (glibc settles its heap over the first few),
# then 10 times more: the minor page faults of those
_PROBE = """
import json, resource, sys, torch
from trainer_core.base import allocator
mode = sys.argv[1]
ok = {"none": lambda: True, "pad": allocator.keep_heap_pad,
      "large": lambda: allocator.keep_heap_pad() and allocator.keep_large_blocks(),
      "large_alone": allocator.keep_large_blocks}[mode]()
for _ in range(20):
    torch.empty(16 << 20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.empty(16 << 20).fill_(1.0)
print(json.dumps({"set": ok, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _probe(mode: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_threshold_is_glibc_s_ceiling():
    assert not needs_large_blocks(MMAP_THRESHOLD) and needs_large_blocks(MMAP_THRESHOLD + 1)


def test_only_a_cpu_resampler_step_above_the_ceiling_takes_the_large_block_heap():
    llada = AdapterConfig(kind="resampler", in_dim=1024, out_dim=2560, width=128, depth=2, num_queries=256)
    token = AdapterConfig(kind="token_aligned_vision", in_dim=1024, out_dim=2560, width=128, depth=2)

    def trainer(config, batch, device="cpu"):
        return SimpleNamespace(config=config, device=torch.device(device), t=SimpleNamespace(batch_size=batch))
    assert large_block_step(trainer(llada, 32))          # 32 × 256 × 2560 × 4 B = 84 MB
    assert not large_block_step(trainer(llada, 8))       # 21 MB: the pinned threshold keeps it in the heap
    assert not large_block_step(trainer(llada, 32, "meta"))
    assert not large_block_step(trainer(token, 64))


def test_only_a_cpu_student_whose_batches_pass_the_ceiling_takes_the_large_block_heap_in_precompute():
    student = SimpleNamespace(config=SimpleNamespace(hidden_size=1024, intermediate_size=3072))

    def budgets(tokens):
        return SimpleNamespace(student_tok_budget=tokens)
    cpu = torch.device("cpu")
    assert large_block_batches(student, budgets(12288), cpu)        # 12288 × 3072 × 2 B = 75 MB of gate rows
    assert not large_block_batches(student, budgets(4096), cpu)     # 25 MB
    assert not large_block_batches(student, budgets(12288), torch.device("cuda"))   # the batch lives on the GPU
    wide = SimpleNamespace(config=SimpleNamespace(hidden_size=4096, intermediate_size=1024))
    assert large_block_batches(wide, budgets(4096), cpu)            # 4096 × 4096 × 4 B of float32 norm rows


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's; other C libraries are left alone")
def test_the_large_block_mode_keeps_a_64_mib_block_mapped_across_steps():
    pad, large = _probe("pad"), _probe("large")
    assert pad["set"] and large["set"]
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert pad["faults"] >= 10 * pages          # mmapped and faulted in again each time
    assert large["faults"] < pages // 4         # reused from the heap


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's; other C libraries are left alone")
def test_a_process_that_did_not_take_the_heap_pad_keeps_its_own_heap():
    alone = _probe("large_alone")       # a stage run in-process: the test suite, a bench
    assert alone["set"] is False
    assert alone["faults"] >= 10 * (64 << 20) // os.sysconf("SC_PAGE_SIZE")   # glibc's own mmap, each time


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's; other C libraries are left alone")
def test_a_malloc_setting_in_the_environment_wins():
    assert _probe("large", MALLOC_TOP_PAD_="0")["set"] is False
    assert _probe("pad", MALLOC_MMAP_THRESHOLD_="131072")["set"] is False
