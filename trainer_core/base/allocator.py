"""The C heap's top pad for the stage processes (glibc only): freed tensor memory is kept for reuse.

torch takes every CPU tensor from malloc. glibc gives memory above its trim threshold back to the
kernel at each free, so a train step's short-lived [B, R, D] temporaries (15 MB each at the PixArt
demo geometry) are faulted in page by page again at every step: 23,000 minor faults and ~30 ms of a
~45 ms loss step (bench/RESULTS.md, "Allocator"). A top pad of PAD_BYTES keeps that much of the
freed heap mapped, so the next step reuses it. Peak RSS does not grow — the pad holds pages that
were resident at the peak anyway; only the RSS after a peak stays up to PAD_BYTES higher.

A MALLOC_TOP_PAD_ the user set in the environment wins; other C libraries are left alone.
"""
from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["PAD_BYTES", "keep_heap_pad"]

PAD_BYTES = 256 << 20
_M_TOP_PAD = -2          # glibc malloc.h


def keep_heap_pad(pad_bytes: int = PAD_BYTES) -> bool:
    """Set glibc's M_TOP_PAD for this process; True when it was set."""
    if "MALLOC_TOP_PAD_" in os.environ or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(_M_TOP_PAD, min(pad_bytes, 2**31 - 1)) == 1
