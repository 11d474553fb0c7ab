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

import queue
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.batch import Batch, mmap_tensor
from trainer_core.contract.kinds import get_kind
from trainer_core.contract.shards import Shard, shard_rebuild_command

__all__ = ["Batch", "StreamPosition", "ShardStream", "ShardRows", "ROW_KEYS", "val_batches", "collate"]

ROW_KEYS = ("len", "t_len", "q_pack", "t_pack")      # what the reader takes from every shard, whatever its kind


class ShardRows:
    """One shard's row offsets and memory-mapped packs, read by the adapter kind it was written for (the
    shard's own metadata names it: `kind`); `collate` gathers chosen samples into that kind's Batch. A
    shard without a tensor the kind's reader needs (ROW_KEYS, the kind's `shard_keys`) is refused before
    anything is read."""

    def __init__(self, path: Path):
        self.shard = Shard(path)      # validates the file and its metadata
        kind = self.shard.meta.get("kind")
        try:
            self.kind = get_kind(kind)
        except ValueError:
            raise ModelFileError(f"{path} does not say which adapter kind it was written for (its metadata has "
                                 f"kind {kind!r}); run precompute again.") from None
        self.require(*ROW_KEYS, *self.kind.shard_keys)
        self.len = self.shard["len"].long()
        self.t_len = self.shard["t_len"].long()
        self.q_off = torch.cumsum(self.len, 0) - self.len
        self.t_off = torch.cumsum(self.t_len, 0) - self.t_len
        self._q = mmap_tensor(path, "q_pack")
        self._t = mmap_tensor(path, "t_pack")
        self.kind.rows(self)

    def require(self, *keys: str) -> None:
        """ModelFileError naming the shard, the tensors it lacks and the command that computes it again."""
        missing = [k for k in keys if k not in self.shard.keys]
        if missing:
            names = ", ".join(f"`{k}`" for k in missing)
            rebuild = shard_rebuild_command(self.shard.path, self.shard.meta.get("split"))
            raise ModelFileError(f"The shard {self.shard.path} has no {names} tensor{'s' if len(missing) > 1 else ''}, "
                                 f"which a {self.kind.title} adapter reads from its shards; run {rebuild} to compute "
                                 f"it again.")

    def vision_blocks(self) -> list[list[tuple[int, int, int]]]:
        """Per sample its images' (first slot, rows, offset into v_pack)."""
        vis_sample, vis_len = self.shard["vis_sample"].long(), self.shard["vis_len"].long()
        offsets = (torch.cumsum(vis_len, 0) - vis_len).tolist()
        blocks: list[list[tuple[int, int, int]]] = [[] for _ in range(len(self.len))]
        for s, start, n, off in zip(vis_sample.tolist(), self.shard["vis_start"].tolist(), vis_len.tolist(), offsets):
            blocks[s].append((start, n, off))
        return blocks

    def __len__(self) -> int:
        return len(self.len)

    def collate(self, rows: list[int], keep_dtype: bool = False, pin: bool = False) -> Batch:
        return collate(self, rows, keep_dtype, pin)


def collate(src: ShardRows, rows: list[int], keep_dtype: bool = False, pin: bool = False) -> Batch:
    """The samples `rows` of a shard as its kind's Batch."""
    return src.kind.collate(src, torch.as_tensor(rows, dtype=torch.long), keep_dtype, pin)


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
        self._open: tuple[int, ShardRows] | None = None
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

    def _rows(self, file_index: int) -> ShardRows:
        if self._open is None or self._open[0] != file_index:
            self._open = (file_index, ShardRows(self.files[file_index]))
        return self._open[1]

    def _read(self, p: StreamPosition) -> Batch:
        """The batch at p; advances p to the next one."""
        file_index = int(self.shard_order(p.epoch)[p.shard_i])
        src = self._rows(file_index)
        if p.batch_i * self.batch_size >= len(src):     # resumed under a larger batch: this shard is done
            p.batch_i, p.shard_i = 0, p.shard_i + 1
            if p.shard_i >= len(self.files):
                p.shard_i, p.epoch = 0, p.epoch + 1
            return self._read(p)
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
            src = ShardRows(path)
            for start in range(0, len(src), batch_size):
                yield src.collate(list(range(start, min(start + batch_size, len(src)))), keep_dtype, pin)
    if prefetch <= 0:
        yield from batches()
    else:
        yield from _Prefetch(batches(), prefetch)
