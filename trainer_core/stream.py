"""The training stream: batches read from shards in an order that is a pure function of
(seed, epoch, shard, row), and validation batches in file order — neither holds more than
one batch of rows in memory (rows are sliced out of the memory-mapped shards).

Order: each epoch draws a permutation of the shard files with default_rng([seed, epoch]) and,
inside shard file f, a permutation of its rows with default_rng([seed, epoch, f]); a batch is
the next `batch_size` rows of that permutation (the last batch of a shard may be short). The
position {epoch, shard_i, batch_i} of the next batch is all a checkpoint needs to resume on
exactly the batches an uninterrupted run would have seen.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .shards import Shard

__all__ = ["Batch", "StreamPosition", "ShardStream", "val_batches", "collate"]


@dataclass
class Batch:
    h: torch.Tensor                    # [B, L, in] student final-norm rows, zero-padded
    mask: torch.Tensor                 # [B, L] bool: real student tokens
    target: torch.Tensor               # [B, R, out] teacher rows (zeros past a sample's rows)
    tmask: torch.Tensor                # [B, R] bool: supervised rows
    seed_ids: torch.Tensor | None      # [B, window] seeded packs
    seed_len: torch.Tensor | None      # [B]

    @property
    def size(self) -> int:
        return self.h.shape[0]

    def to(self, device: torch.device) -> "Batch":
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(move(self.h), move(self.mask), move(self.target), move(self.tmask),
                     move(self.seed_ids), move(self.seed_len))


class _ShardRows:
    """Row offsets of one shard, and the rows of chosen samples."""

    def __init__(self, path: Path):
        self.shard = Shard(path)
        self.len = self.shard["len"].long()
        self.t_len = self.shard["t_len"].long()
        self.q_off = torch.cumsum(self.len, 0) - self.len
        self.t_off = torch.cumsum(self.t_len, 0) - self.t_len
        self.seeded = "seed_ids" in self.shard.keys
        self.seed_ids = self.shard["seed_ids"].long() if self.seeded else None
        self._q = self.shard._file.get_slice("q_pack")
        self._t = self.shard._file.get_slice("t_pack")

    def __len__(self) -> int:
        return len(self.len)

    def collate(self, rows: list[int]) -> Batch:
        return collate(self, rows)


def collate(src: _ShardRows, rows: list[int]) -> Batch:
    L = int(max(src.len[r] for r in rows))
    R = int(max(src.t_len[r] for r in rows)) if not src.seeded else src.seed_ids.shape[1]
    first = src._q[0:1]
    h = torch.zeros(len(rows), L, first.shape[1], dtype=torch.float32)
    mask = torch.zeros(len(rows), L, dtype=torch.bool)
    out_dim = src._t[0:1].shape[1]
    target = torch.zeros(len(rows), R, out_dim, dtype=torch.float32)
    tmask = torch.zeros(len(rows), R, dtype=torch.bool)
    for b, r in enumerate(rows):
        n, q0 = int(src.len[r]), int(src.q_off[r])
        h[b, :n] = src._q[q0:q0 + n].float()
        mask[b, :n] = True
        m, t0 = int(src.t_len[r]), int(src.t_off[r])
        target[b, :m] = src._t[t0:t0 + m].float()
        tmask[b, :m] = True
    seed_ids = src.seed_ids[rows] if src.seeded else None
    seed_len = src.t_len[rows] if src.seeded else None
    return Batch(h, mask, target, tmask, seed_ids, seed_len)


@dataclass
class StreamPosition:
    epoch: int = 0
    shard_i: int = 0     # index into the epoch's shard permutation
    batch_i: int = 0     # batch index inside that shard's row permutation

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class ShardStream:
    """Endless training batches in the seeded order, resumable from a StreamPosition."""

    def __init__(self, files: list[Path], batch_size: int, seed: int, position: StreamPosition | None = None):
        if not files:
            raise ValueError("the training stream needs at least one shard")
        self.files, self.batch_size, self.seed = list(files), batch_size, seed
        self.position = position or StreamPosition()
        self._open: tuple[int, _ShardRows] | None = None

    def shard_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.files))

    def row_order(self, epoch: int, file_index: int, n_rows: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch, file_index]).permutation(n_rows)

    def _rows(self, file_index: int) -> _ShardRows:
        if self._open is None or self._open[0] != file_index:
            self._open = (file_index, _ShardRows(self.files[file_index]))
        return self._open[1]

    def next(self) -> Batch:
        p = self.position
        file_index = int(self.shard_order(p.epoch)[p.shard_i])
        src = self._rows(file_index)
        order = self.row_order(p.epoch, file_index, len(src))
        rows = order[p.batch_i * self.batch_size:(p.batch_i + 1) * self.batch_size].tolist()
        batch = src.collate(rows)
        p.batch_i += 1
        if p.batch_i * self.batch_size >= len(src):
            p.batch_i, p.shard_i = 0, p.shard_i + 1
            if p.shard_i >= len(self.files):
                p.shard_i, p.epoch = 0, p.epoch + 1
        return batch


def val_batches(files: list[Path], batch_size: int) -> Iterator[Batch]:
    """Every val shard in file order, in its stored order, `batch_size` samples at a time;
    batches never span shards, and only one shard is open at a time."""
    for path in files:
        src = _ShardRows(path)
        for start in range(0, len(src), batch_size):
            yield src.collate(list(range(start, min(start + batch_size, len(src)))))
