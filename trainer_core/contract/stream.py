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

import json
import queue
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from trainer_core.contract.bridge import BANK_PREFIX, BridgeParts, bank_length
from trainer_core.contract.shards import Shard

__all__ = ["Batch", "StreamPosition", "ShardStream", "val_batches", "collate"]


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


def _mmap_tensor(path: Path, name: str) -> torch.Tensor:
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


class _ShardRows:
    """Row offsets of one shard, and the rows of chosen samples."""

    def __init__(self, path: Path):
        self.shard = Shard(path)      # validates the file and its metadata
        self.len = self.shard["len"].long()
        self.t_len = self.shard["t_len"].long()
        self.q_off = torch.cumsum(self.len, 0) - self.len
        self.t_off = torch.cumsum(self.t_len, 0) - self.t_len
        self.seeded = "seed_ids" in self.shard.keys
        self.seed_ids = self.shard["seed_ids"].long() if self.seeded else None
        self._q = _mmap_tensor(path, "q_pack")
        self._t = _mmap_tensor(path, "t_pack")
        self.layerwise = "n_real" in self.shard.keys       # one stored pad row per sample, expanded
        if self.layerwise:
            self.n_real = self.shard["n_real"].long()
            self.pad_multiple = int(self.shard["pad_multiple"][0])
        self.bridge = "slot_ids" in self.shard.keys       # qwen35_bridge, ming_image (bridge.py)
        if self.bridge:
            self._init_bridge()
        self.token_aligned = "v_pack" in self.shard.keys and not self.bridge
        if self.token_aligned:      # image blocks: sample, first slot, length; offsets into v_pack
            self.sparse = int(self.shard["t_sparse"][0]) == 1          # no teacher rows under the slots
            self.consumed_only = self.shard.meta.get("supervise") == "consumed_text"
            self._v = _mmap_tensor(path, "v_pack")
            self.sup_start = self.shard["sup_start"].long()
            self.blocks = self._vision_blocks()

    def _vision_blocks(self) -> list[list[tuple[int, int, int]]]:
        """Per sample its images' (first slot, rows, offset into v_pack)."""
        vis_sample, vis_len = self.shard["vis_sample"].long(), self.shard["vis_len"].long()
        offsets = (torch.cumsum(vis_len, 0) - vis_len).tolist()
        blocks: list[list[tuple[int, int, int]]] = [[] for _ in range(len(self.len))]
        for s, start, n, off in zip(vis_sample.tolist(), self.shard["vis_start"].tolist(), vis_len.tolist(), offsets):
            blocks[s].append((start, n, off))
        return blocks

    def _init_bridge(self) -> None:
        path = self.shard.path
        self.slot_ids = self.shard["slot_ids"].long()
        self._v = _mmap_tensor(path, "v_pack")
        self.blocks = self._vision_blocks()
        keys = self.shard.keys
        # which samples have a bank target: the Klein samples (qwen35_bridge); every sample without the key (Ming)
        self.klein = self.shard["klein"].long() if "klein" in keys else torch.ones(len(self.len), dtype=torch.long)
        self.n_bank = int(self.shard["bank_slots"][0]) if "bank_slots" in keys else 0
        self.aligned = "bank_body" in keys          # the bank rows carry the student's rows (the Klein bank)
        if self.n_bank:
            self._b = _mmap_tensor(path, "b_pack")
            rows = self.shard["bank_rows"].long()
            self.b_off = torch.cumsum(rows, 0) - rows
            self.bank_real = self.shard["bank_real"].long()
            self.bank_body = self.shard["bank_body"].long() if self.aligned else None

    def __len__(self) -> int:
        return len(self.len)

    def collate(self, rows: list[int], keep_dtype: bool = False, pin: bool = False) -> Batch:
        return collate(self, rows, keep_dtype, pin)


def _gather(packed: torch.Tensor, off: torch.Tensor, lens: torch.Tensor, width: int,
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
    if B * width * dim >= _BIG:
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


_BIG = 1 << 20     # elements of a padded batch from which _gather copies sample by sample


def _collate_layerwise(src: _ShardRows, idx: torch.Tensor, keep_dtype: bool, pin: bool) -> Batch:
    """Each sample's rows as the engine hands them to the adapter: its n_real rows, then its one stored
    pad row repeated up to the next multiple of pad_multiple (none when n_real is one already). Real
    rows weigh 1 and the pads of a sample 1/n_pad each, so a sample's pads count as one row."""
    n_real, off, m = src.n_real[idx], src.q_off[idx], src.pad_multiple
    rows = (n_real + m - 1) // m * m                                                # [B] ceil to m
    B, L = len(idx), int(rows.max())
    within = torch.arange(L)[None, :]                                               # [1, L]
    keep = within < rows[:, None]                                                   # [B, L]
    pad = keep & (within >= n_real[:, None])
    n_pad = (rows - n_real).clamp_min(1)
    weight = torch.where(pad, 1.0 / n_pad[:, None].float(), keep.float())
    src_row = off[:, None] + torch.minimum(within, n_real[:, None])                # the stored pad at n_real
    flat_src, flat_dest = src_row[keep], (torch.arange(B)[:, None] * L + within)[keep]

    def gather(packed: torch.Tensor) -> torch.Tensor:
        dtype = packed.dtype if keep_dtype else torch.float32
        out = torch.zeros(B * L, packed.shape[1], dtype=dtype, pin_memory=pin)
        out[flat_dest] = packed[flat_src].to(dtype)
        return out.view(B, L, -1)
    return Batch(gather(src._q), keep, gather(src._t), keep, None, None, weight=weight, pad=pad)


def collate_bridge(src: _ShardRows, idx: torch.Tensor, keep_dtype: bool = False, pin: bool = False) -> Batch:
    """The samples `idx` of a bridge shard as a Batch with `bridge` parts (contract/bridge.py): the slots'
    ids and targets, the raw vision rows under their slots and as keys, and for the samples with a bank
    target their bank rows — a Klein sample's n80 rows (the stored pad row repeated) and bank_hidden (row
    3 + i = the student's row i); a Ming sample's n_cap caption rows, no bank_hidden."""
    lens, slots = src.len[idx], src.t_len[idx]
    B, P = len(idx), int(slots.max())
    h, mask = _gather(src._q, src.q_off[idx], lens, int(lens.max()), keep_dtype, pin)
    target, tmask = _gather(src._t, src.t_off[idx], slots, P, keep_dtype, pin)
    seed_ids = torch.zeros(B, P, dtype=torch.long)
    vdtype = src._v.dtype if keep_dtype else torch.float32
    n_vis = [sum(n for _, n, _ in src.blocks[i]) for i in idx.tolist()]
    V = max(n_vis, default=0)
    vis_slot = torch.zeros(B, P, src._v.shape[1], dtype=vdtype, pin_memory=pin)
    vis_kv = torch.zeros(B, V, src._v.shape[1], dtype=vdtype, pin_memory=pin)
    vis_keep = torch.arange(V)[None, :] < torch.tensor(n_vis, dtype=torch.long)[:, None]
    for b, i in enumerate(idx.tolist()):
        o, n = int(src.t_off[i]), int(src.t_len[i])
        seed_ids[b, :n] = src.slot_ids[o:o + n]
        at = 0
        for start, count, off in src.blocks[i]:
            rows = src._v[off:off + count].to(vdtype)
            vis_slot[b, start:start + count] = rows
            vis_kv[b, at:at + count] = rows
            at += count
    klein = src.klein[idx].bool()
    parts = BridgeParts(vis_slot, vis_kv, vis_keep, klein)
    if src.n_bank and bool(klein.any()):
        members = idx[klein].tolist()
        rows_of = [b for b in range(B) if bool(klein[b])]
        K, NB = len(members), src.n_bank
        bdtype = src._b.dtype if keep_dtype else torch.float32
        bank_target = torch.zeros(K, NB, src._b.shape[1], dtype=bdtype, pin_memory=pin)
        bank_hidden = torch.zeros(K, NB, h.shape[2], dtype=h.dtype, pin_memory=pin) if src.aligned else None
        bank_mask = torch.zeros(K, NB, dtype=torch.bool)
        for k, (i, b) in enumerate(zip(members, rows_of)):
            off, real = int(src.b_off[i]), int(src.bank_real[i])
            n80 = bank_length(real, NB) if src.aligned else real
            bank_target[k, :real] = src._b[off:off + real].to(bdtype)
            if n80 > real:                                   # the one stored pad row, repeated
                bank_target[k, real:n80] = src._b[off + real].to(bdtype)
            bank_mask[k, :n80] = True
            if bank_hidden is not None:
                body = int(src.bank_body[i])
                bank_hidden[k, BANK_PREFIX:BANK_PREFIX + body] = h[b, :body]
        parts.bank_hidden, parts.bank_target, parts.bank_mask = bank_hidden, bank_target, bank_mask
    return Batch(h, mask, target, tmask, seed_ids, slots, bridge=parts)


def collate(src: _ShardRows, rows: list[int], keep_dtype: bool = False, pin: bool = False) -> Batch:
    idx = torch.as_tensor(rows, dtype=torch.long)
    if src.layerwise:
        return _collate_layerwise(src, idx, keep_dtype, pin)
    if src.bridge:
        return collate_bridge(src, idx, keep_dtype, pin)
    lens, t_lens = src.len[idx], src.t_len[idx]
    L = int(lens.max())
    R = int(t_lens.max()) if not src.seeded else src.seed_ids.shape[1]
    h, mask = _gather(src._q, src.q_off[idx], lens, L, keep_dtype, pin)
    target, tmask = _gather(src._t, src.t_off[idx], t_lens, R, keep_dtype, pin)
    seed_ids = src.seed_ids[idx] if src.seeded else None
    seed_len = t_lens if src.seeded else None
    if not src.token_aligned:
        return Batch(h, mask, target, tmask, seed_ids, seed_len)
    dtype = src._v.dtype if keep_dtype else torch.float32
    vis = torch.zeros(len(rows), L, src._v.shape[1], dtype=dtype, pin_memory=pin)       # [B, L, vis]
    vision = torch.zeros(len(rows), L, dtype=torch.bool)
    for b, row in enumerate(rows):
        for start, n, off in src.blocks[row]:
            vis[b, start:start + n].copy_(src._v[off:off + n])
            vision[b, start:start + n] = True
    sup_start = src.sup_start[idx]
    if src.sparse:            # the stored rows are those off the slots, in order: scatter them back
        full = torch.zeros(len(rows), L, target.shape[2], dtype=target.dtype, pin_memory=pin)
        full[mask & ~vision] = target[tmask]
        target = full
    if src.consumed_only:     # the rows the DiT reads: from sup_start on, not under a slot
        tmask = mask & ~vision & (torch.arange(L)[None, :] >= sup_start[:, None])
    return Batch(h, mask, target, tmask, seed_ids, seed_len, vis, vision, sup_start)


@dataclass
class StreamPosition:
    epoch: int = 0
    shard_i: int = 0     # index into the epoch's shard permutation
    batch_i: int = 0     # batch index inside that shard's row permutation

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class ShardStream:
    """Endless training batches in the seeded order, resumable from a StreamPosition.

    For a GPU: keep_dtype leaves the rows in the shards' bf16 (Batch.to widens them on the
    device), pin collates into page-locked memory, and prefetch > 0 collates that many
    batches ahead in a background thread. `position` is always that of the next batch
    next() returns, whatever the thread has read ahead; assigning it restarts the thread."""

    def __init__(self, files: list[Path], batch_size: int, seed: int, position: StreamPosition | None = None,
                 *, keep_dtype: bool = False, pin: bool = False, prefetch: int = 0):
        if not files:
            raise ValueError("the training stream needs at least one shard")
        self.files, self.batch_size, self.seed = list(files), batch_size, seed
        self.keep_dtype, self.pin, self.prefetch = keep_dtype, pin, prefetch
        self._position = position or StreamPosition()
        self._open: tuple[int, _ShardRows] | None = None
        self._ahead: _Prefetch | None = None

    @property
    def position(self) -> StreamPosition:
        return self._position

    @position.setter
    def position(self, value: StreamPosition) -> None:
        self.close()
        self._position = value

    def shard_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.files))

    def row_order(self, epoch: int, file_index: int, n_rows: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch, file_index]).permutation(n_rows)

    def _rows(self, file_index: int) -> _ShardRows:
        if self._open is None or self._open[0] != file_index:
            self._open = (file_index, _ShardRows(self.files[file_index]))
        return self._open[1]

    def _read(self, p: StreamPosition) -> Batch:
        """The batch at p; advances p to the next one."""
        file_index = int(self.shard_order(p.epoch)[p.shard_i])
        src = self._rows(file_index)
        order = self.row_order(p.epoch, file_index, len(src))
        rows = order[p.batch_i * self.batch_size:(p.batch_i + 1) * self.batch_size].tolist()
        batch = src.collate(rows, self.keep_dtype, self.pin)
        p.batch_i += 1
        if p.batch_i * self.batch_size >= len(src):
            p.batch_i, p.shard_i = 0, p.shard_i + 1
            if p.shard_i >= len(self.files):
                p.shard_i, p.epoch = 0, p.epoch + 1
        return batch

    def _produce(self) -> Iterator[tuple[Batch, StreamPosition]]:
        p = replace(self._position)
        while True:
            batch = self._read(p)
            yield batch, replace(p)

    def next(self) -> Batch:
        if self.prefetch <= 0:
            return self._read(self._position)
        if self._ahead is None:
            self._ahead = _Prefetch(self._produce(), self.prefetch)
        batch, self._position = self._ahead.next()
        return batch

    def close(self) -> None:
        """Stop the read-ahead thread (the next next() starts one at `position`)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None


class _Prefetch:
    """Items of an iterator produced up to `depth` ahead by a daemon thread; an exception in
    the producer is raised by next() in the consumer."""

    _END = object()

    def __init__(self, items: Iterator[Any], depth: int):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(items,), name="gguf-trainer-prefetch", daemon=True)
        self._thread.start()

    def _run(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if not self._put((True, item)):
                    return
            self._put((True, self._END))
        except BaseException as e:  # noqa: BLE001 — handed to the consumer
            self._put((False, e))

    def _put(self, entry: tuple[bool, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> Any:
        ok, item = self._queue.get()
        if not ok:
            raise item
        if item is self._END:
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self.next()
                except StopIteration:
                    return
        finally:
            self.close()


def val_batches(files: list[Path], batch_size: int, *, keep_dtype: bool = False, pin: bool = False,
                prefetch: int = 0) -> Iterator[Batch]:
    """Every val shard in file order, in its stored order, `batch_size` samples at a time;
    batches never span shards, and only one shard is open at a time. keep_dtype, pin and
    prefetch as for ShardStream."""
    def batches() -> Iterator[Batch]:
        for path in files:
            src = _ShardRows(path)
            for start in range(0, len(src), batch_size):
                yield src.collate(list(range(start, min(start + batch_size, len(src)))), keep_dtype, pin)
    if prefetch <= 0:
        yield from batches()
    else:
        yield from _Prefetch(batches(), prefetch)
