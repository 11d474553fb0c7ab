"""The bridge's frozen seed table: the teacher's input embeddings reduced by PCA, stored f16.

Fitted once per project into `<project>/seed_table.pt` ({table, rank, vocab, variance_kept, pack}):
centre the table's columns, eigendecompose EᵀE / N (accumulated in float64 over row chunks, so a
248k × 4096 table never sits in memory in float64), keep the `rank` leading eigenvectors, project,
divide by the global RMS and round to f16 — the adapter copies it into its frozen `seed_embed` and
exports it bit-exact. Without a teacher table (the mock teacher, nothing downloaded) the table is
random (seed 11): the pipeline runs, the adapter is not usable.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from trainer_core.base.errors import TrainerError

__all__ = ["fit_seed_table", "random_seed_table", "load_seed_table", "require_seed_table", "save_seed_table",
           "ensure_seed_table", "load_seed_into"]

_CHUNK = 16384


def fit_seed_table(table: torch.Tensor, rank: int) -> tuple[torch.Tensor, float]:
    """(the f16 table [rows, rank], the fraction of the variance kept) of an embedding table."""
    rows, dim = table.shape
    if rank > dim:
        raise TrainerError(f"train.seed_rank {rank} exceeds the teacher's embedding width {dim}; lower it.")
    total = torch.zeros(dim, dtype=torch.float64)
    gram = torch.zeros(dim, dim, dtype=torch.float64)
    for start in range(0, rows, _CHUNK):
        chunk = table[start:start + _CHUNK].to(torch.float64)
        total += chunk.sum(0)
        gram += chunk.T @ chunk
    mean = total / rows
    cov = gram / rows - torch.outer(mean, mean)
    values, vectors = torch.linalg.eigh(cov)                       # ascending
    keep = vectors[:, -rank:].flip(1)                              # the `rank` largest, descending
    kept = float(values[-rank:].clamp_min(0).sum() / values.clamp_min(0).sum().clamp_min(1e-300))
    out = torch.empty(rows, rank, dtype=torch.float64)
    for start in range(0, rows, _CHUNK):
        out[start:start + _CHUNK] = (table[start:start + _CHUNK].to(torch.float64) - mean) @ keep
    rms = math.sqrt(float((out * out).mean())) or 1.0
    return (out / rms).to(torch.float16), kept


def random_seed_table(vocab: int, rank: int) -> torch.Tensor:
    """The mock run's table (no teacher embeddings to fit): never usable."""
    return torch.randn(vocab, rank, generator=torch.Generator().manual_seed(11)).to(torch.float16)


def save_seed_table(path: Path, table: torch.Tensor, kept: float, pack: str) -> None:
    from trainer_core.base.atomic import atomic_path
    record = {"table": table, "rank": int(table.shape[1]), "vocab": int(table.shape[0]),
              "variance_kept": kept, "pack": pack}
    with atomic_path(path, needs=table.numel() * 2 + 4096) as tmp:
        torch.save(record, tmp)


def load_seed_table(path: Path, vocab: int, rank: int, pack: str) -> tuple[dict[str, Any] | None, str]:
    """(the saved table, "") when it has this shape; (None, why) when it must be fitted (again): none
    yet, a damaged file, or another shape (train.seed_rank or the teacher changed — the shards stay
    valid, they hold token ids; the adapter trained on the old table starts over)."""
    if not path.is_file():
        return None, ""
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
        shape = tuple(record["table"].shape)
    except Exception as e:  # noqa: BLE001 — a damaged file is fitted again
        return None, f"{path.name} was damaged ({type(e).__name__})"
    if shape != (vocab, rank) or record.get("pack") != pack:
        return None, f"{path.name} holds a {list(shape)} table, this project needs [{vocab}, {rank}]"
    return record, ""


def require_seed_table(path: Path, vocab: int, rank: int, pack: str) -> torch.Tensor:
    """The table the train stage loads into the adapter (precompute fitted it)."""
    record, why = load_seed_table(path, vocab, rank, pack)
    if record is None:
        raise TrainerError(f"The seed table is not ready ({why or f'{path} does not exist'}); run precompute "
                           "(it fits the table before the first shard).")
    return record["table"]


def ensure_seed_table(path: Path, vocab: int, rank: int, pack: str, teacher: Any, report: Any, repo: str) -> None:
    """Reuse the table at `path` when it has this shape, else fit it from teacher.embed_table() (random
    when the teacher has none: the mock) and save it; every outcome is one log line. The seeded-slot
    packs (the Qwen3.5 bridge, Ming) call it once per precompute stage, before the first shard."""
    import time
    record, why = load_seed_table(path, vocab, rank, pack)
    if record is not None:
        report("log", level="info", message=f"seed table reused from {path.name} "
                                            f"({record['variance_kept']:.3f} of the variance kept)")
        return
    table = teacher.embed_table()
    started = time.monotonic()
    if table is None:
        fitted, kept = random_seed_table(vocab, rank), 0.0
    else:
        if table.shape[0] != vocab:
            from trainer_core.base.errors import ModelFileError
            raise ModelFileError(f"The teacher's embedding table has {table.shape[0]} rows but its config says "
                                 f"vocab_size {vocab}; download {repo} again.")
        fitted, kept = fit_seed_table(table, rank)
    save_seed_table(path, fitted, kept, pack)
    report("log", level="info", message=(f"{why}: " if why else "") + f"seed table fitted in "
           f"{time.monotonic() - started:.1f} s ({vocab} × {rank}, {kept:.3f} of the variance kept"
           f"{'; random: no teacher table' if table is None else ''}); saved to {path.name}")


def load_seed_into(path: Path, model: Any, pack: str) -> None:
    """The table precompute fitted, into a freshly built adapter's frozen seed_embed."""
    c = model.config
    table = require_seed_table(path, c.seed_vocab, c.seed_rank, pack)
    with torch.no_grad():
        model.seed_embed.weight.copy_(table.float())
