"""A training batch and the two ways rows come out of a shard: a copy-on-write memory map of one
tensor (`mmap_tensor`) and the padded gather of chosen samples' rows (`gather`). Each adapter kind's
shard reader (its `rows` and `collate`, contract/kinds/) builds its Batch from these; the stream
(contract/stream.py) decides which samples go together.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["Batch", "mmap_tensor", "gather", "BIG"]


@dataclass
class Batch:
    h: torch.Tensor                    # [B, L, in] student final-norm rows, zero-padded
    mask: torch.Tensor                 # [B, L] bool: real student tokens
    target: torch.Tensor               # [B, R, out] teacher rows (zeros past a sample's rows)
    tmask: torch.Tensor                # [B, R] bool: supervised rows
    seed_ids: torch.Tensor | None      # [B, window] seeded packs
    seed_len: torch.Tensor | None      # [B]
    vis: torch.Tensor | None = None        # [B, L, vis_dim] token-aligned: raw vision rows at the slots, else 0
    vision: torch.Tensor | None = None     # [B, L] bool: image-slot rows
    sup_start: torch.Tensor | None = None  # [B] where the engine's slice starts (64 edit / 34 t2i)
    weight: torch.Tensor | None = None     # [B, L] layerwise: row weights (real 1, a sample's pads 1 together)
    pad: torch.Tensor | None = None        # [B, L] bool layerwise: the pad rows (expanded from the stored one)
    bridge: Any = None                     # bridge kinds: bridge.BridgeParts (seed_ids = the slots' teacher ids)

    @property
    def size(self) -> int:
        return self.h.shape[0]

    def to(self, device: torch.device) -> "Batch":
        """The batch on `device`, its rows in float32 (rows kept in the shards' bf16 travel
        at half the bytes and are widened there; bf16 → f32 is exact, so either way gives
        the same numbers)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        vis = move(self.vis)
        return Batch(move(self.h).float(), move(self.mask), move(self.target).float(), move(self.tmask),
                     move(self.seed_ids), move(self.seed_len), None if vis is None else vis.float(),
                     move(self.vision), move(self.sup_start), move(self.weight), move(self.pad),
                     None if self.bridge is None else self.bridge.to(device))

    def parts(self) -> tuple[torch.Tensor | None, ...]:
        """Every field in order (for slicing a batch into micro-batches)."""
        return (self.h, self.mask, self.target, self.tmask, self.seed_ids, self.seed_len, self.vis, self.vision,
                self.sup_start, self.weight, self.pad, self.bridge)

    @property
    def rows_weight(self) -> torch.Tensor:
        """How much this batch counts in a step: its rows' weights, else its supervised rows."""
        return self.weight.sum() if self.weight is not None else self.tmask.sum()


def mmap_tensor(path: Path, name: str) -> torch.Tensor:
    """One tensor of a safetensors file as a copy-on-write memory map (nothing is read until
    rows are indexed), so a batch is gathered with one indexing operation."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    info = header[name]
    start, end = info["data_offsets"]
    dtype = _NP_DTYPES[info["dtype"]]
    shape = tuple(info["shape"])
    if end == start:
        return torch.zeros(shape, dtype=_TORCH_DTYPES[info["dtype"]])
    arr = np.memmap(path, dtype=dtype, mode="c", offset=8 + n + start, shape=shape)
    return torch.from_numpy(arr).view(_TORCH_DTYPES[info["dtype"]])


_NP_DTYPES = {"BF16": np.int16, "F16": np.float16, "F32": np.float32}
_TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}




def gather(packed: torch.Tensor, off: torch.Tensor, lens: torch.Tensor, width: int,
            keep_dtype: bool = False, pin: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows off[b]..off[b]+lens[b] of `packed` for each sample b, as a zero-padded
    [B, width, dim] tensor (f32, or the shard's dtype with keep_dtype; in page-locked memory
    with pin) and its [B, width] mask.

    Small batches are gathered with one indexing operation (a per-sample loop costs more in
    calls than in bytes there); big ones with one slice copy per sample, which reads and
    writes each byte once instead of through an intermediate (2–2.5x faster at the
    reference size)."""
    B, dim = len(lens), packed.shape[1]
    dtype = packed.dtype if keep_dtype else torch.float32
    mask = torch.arange(width) < lens[:, None]
    if B * width * dim >= BIG:
        out = torch.empty(B, width, dim, dtype=dtype, pin_memory=pin)
        for b, (o, n) in enumerate(zip(off.tolist(), lens.tolist())):
            out[b, :n].copy_(packed[o:o + n])
            out[b, n:].zero_()
        return out, mask
    total = int(lens.sum())
    # position of each gathered row inside its own sample: 0..lens[b]-1
    starts = torch.cumsum(lens, 0) - lens
    within = torch.arange(total) - torch.repeat_interleave(starts, lens)
    sample = torch.repeat_interleave(torch.arange(B), lens)
    src = torch.repeat_interleave(off, lens) + within
    dest = sample * width + within
    out = torch.zeros(B * width, dim, dtype=dtype, pin_memory=pin)
    out[dest] = packed[src].to(dtype)
    return out.view(B, width, dim), mask


BIG = 1 << 20     # elements of a padded batch from which gather copies sample by sample
