"""The C heap settings of the stage processes (glibc only): freed tensor memory is kept for reuse.

torch takes every CPU tensor from malloc. glibc gives memory above its trim threshold back to the
kernel at each free, so a train step's short-lived [B, R, D] temporaries (15 MB each at the PixArt
demo geometry) are faulted in page by page again at every step. A top pad of PAD_BYTES keeps that
much of the freed heap mapped, so the next step reuses it.

Setting any of glibc's thresholds by mallopt also switches off its dynamic mmap threshold, which
otherwise rises to the size of each freed mmapped block (up to 32 MiB): with the pad alone every
block above 128 KiB — a student forward's activations, a step's temporaries — became its own mmap,
unmapped on free and faulted in again on the next call (PixArt precompute_train at the peer geometry:
0.36 M minor faults and 1.2 s instead of 0.03 M and 0.8 s). So the mmap threshold is pinned at
MMAP_THRESHOLD, glibc's own ceiling for the dynamic one. Measured on the PixArt peer geometry, 200
train steps in-process: default glibc 14.5–16.4 s (0.7–0.9 M faults), pad alone 16.2–16.4 s (1.6–2.7 M),
pad and threshold 13.2–14.6 s (0.08 M); peak RSS within 15 MiB of the default (bench/RESULTS.md).

Blocks above that ceiling are still mmapped at each allocation. A train step on the CPU whose
[B, R, D] float32 temporaries are larger (LLaDA's 256 × 2560 rows at batch 32: 84 MB each) faulted in
~200,000 pages a step; `keep_large_blocks` turns mmap off for such a process (every block comes from
the heap) and keeps up to TRIM_BYTES of freed heap mapped: 40 LLaDA steps at batch 32 took 27.4 s
with 197,000 faults a step, 18.5 s with 8,800, at a peak RSS 370 MiB higher (1692 -> 2065 MiB). The
train stage calls it only when its step's blocks exceed MMAP_THRESHOLD (stages/train.py); precompute
when a CPU student's batch at its token budget does (stages/precompute.py `large_block_batches`: the
Qwen-Image student forward at the peer geometry, 12,288 tokens × 3072 bf16 = 75 MB of MLP rows, took
3.08 s for 364 samples with them mmapped, 2.15 s from the heap).

A MALLOC_TOP_PAD_ or MALLOC_MMAP_THRESHOLD_ the user set in the environment wins (neither is set
then, nor the large-block mode); other C libraries are left alone.
"""
from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["PAD_BYTES", "MMAP_THRESHOLD", "TRIM_BYTES", "keep_heap_pad", "keep_large_blocks"]

PAD_BYTES = 256 << 20
MMAP_THRESHOLD = 32 << 20   # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_BYTES = 1 << 30
_M_TRIM_THRESHOLD = -1      # glibc malloc.h
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4


def _mallopt():
    """glibc's mallopt, or None where the settings are not ours to make."""
    if ("MALLOC_TOP_PAD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ
            or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"):
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


_pad_set = False             # keep_heap_pad ran in this process: it is a stage process (stages/base.py)


def keep_heap_pad(pad_bytes: int = PAD_BYTES, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's M_TOP_PAD and M_MMAP_THRESHOLD for this process; True when both were set."""
    global _pad_set
    mallopt = _mallopt()
    if mallopt is None:
        return False
    threshold_set = mallopt(_M_MMAP_THRESHOLD, min(mmap_threshold, 2**31 - 1)) == 1
    _pad_set = mallopt(_M_TOP_PAD, min(pad_bytes, 2**31 - 1)) == 1 and threshold_set
    return _pad_set


def needs_large_blocks(block_bytes: int) -> bool:
    """Whether a step whose largest temporaries take `block_bytes` each would be mmapped at every step."""
    return block_bytes > MMAP_THRESHOLD


def keep_large_blocks(trim_bytes: int = TRIM_BYTES) -> bool:
    """Take every block from the heap (no mmap) and give freed heap back to the kernel only above
    `trim_bytes`; True when both were set. Only in a process that took the heap pad first (a stage's
    own): one that runs a stage in-process (the test suite, a bench) keeps its own heap, which would
    otherwise hold up to `trim_bytes` of freed memory for the rest of its life."""
    mallopt = _mallopt()
    if mallopt is None or not _pad_set:
        return False
    no_mmap = mallopt(_M_MMAP_MAX, 0) == 1
    return mallopt(_M_TRIM_THRESHOLD, min(trim_bytes, 2**31 - 1)) == 1 and no_mmap
