"""vision_proj: the frozen map from the teacher's token-embedding space to the student's.

The engine splices `vision_proj(mmproj embed)` into the student's input at the image slots, so
the student sees a vision token the way it sees a word. The map is the ridge least-squares fit
over the shared vocabulary (packs-contract §B.2):

    W = argmin ‖E_t Wᵀ − E_s‖² + λ‖W‖²,   λ = 1e-4 · mean(diag(E_tᵀE_t)),   solved in float64

with E_t the teacher's table [V, vis_dim] and E_s the student's [V, in_dim]. It is fitted
**streaming over vocabulary blocks**: only the Gram matrices E_tᵀE_t [vis, vis] and E_tᵀE_s
[vis, in] are kept in float64, plus one block of each table, so the extra memory is about
(vis² + vis·in + block·(vis + in))·8 bytes whatever V is (≈ 0.3 GB at the real sizes, against
the 4.7 GB of both tables in float64). A second streaming pass measures the fit (row cosines,
rel_mse). The result is `<project>/vision_proj.pt`, fitted once and reused.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from trainer_core.base.atomic import atomic_path
from trainer_core.base.errors import ModelFileError

__all__ = ["RowSource", "tensor_rows", "safetensors_rows", "TEACHER_EMBED_NAMES", "VisionProjFit",
           "fit_vision_proj", "save_vision_proj", "load_vision_proj", "RIDGE", "BLOCK_ROWS"]

RIDGE = 1e-4
BLOCK_ROWS = 8192
TEACHER_EMBED_NAMES = ("model.language_model.embed_tokens.weight", "language_model.embed_tokens.weight",
                       "model.embed_tokens.weight")


@dataclass(frozen=True)
class RowSource:
    """A table read a block of rows at a time: read(start, stop) → float64 [stop − start, width]."""

    rows: int
    width: int
    read: Callable[[int, int], np.ndarray]
    name: str


def tensor_rows(table: torch.Tensor, name: str = "table") -> RowSource:
    """Rows of an in-memory tensor (any dtype or device), widened one block at a time."""
    return RowSource(int(table.shape[0]), int(table.shape[1]),
                     lambda a, b: table[a:b].detach().to("cpu", torch.float64).numpy(), name)


def safetensors_rows(folder: str | os.PathLike, names: Sequence[str] = TEACHER_EMBED_NAMES) -> RowSource:
    """The first of `names` found in a snapshot's safetensors (sharded through
    model.safetensors.index.json, or model.safetensors), read through a memory map."""
    from safetensors import safe_open
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        found = next(((n, folder / weight_map[n]) for n in names if n in weight_map), None)
    else:
        found = None
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                keys = set(f.keys())
            found = next(((n, path) for n in names if n in keys), None)
            if found:
                break
    if found is None:
        raise ModelFileError(f"The teacher snapshot {folder} has no token-embedding table ({' or '.join(names)}); "
                             "download it again.")
    name, path = found
    handle = safe_open(str(path), framework="pt")
    table = handle.get_slice(name)
    rows, width = table.get_shape()
    return RowSource(int(rows), int(width), lambda a, b: table[a:b].to(torch.float64).numpy(), f"{path.name}:{name}")


@dataclass(frozen=True)
class VisionProjFit:
    weight: torch.Tensor          # [in_dim, vis_dim] float32: student = vision_proj(teacher)
    ridge: float
    fit_cos_mean: float
    fit_cos_p5: float
    rel_mse: float
    vocab: int


def _blocks(rows: int, block: int) -> Iterator[tuple[int, int]]:
    for start in range(0, rows, block):
        yield start, min(rows, start + block)


def fit_vision_proj(teacher: RowSource, student: RowSource, ridge: float = RIDGE, block: int = BLOCK_ROWS,
                    progress: Callable[[int, int], None] = lambda done, total: None) -> VisionProjFit:
    """The ridge fit, streaming over `block` rows of both tables at a time (see the module doc)."""
    if teacher.rows != student.rows:
        raise ModelFileError(f"The teacher's vocabulary ({teacher.rows} rows in {teacher.name}) and the student's "
                             f"({student.rows} rows in {student.name}) differ, so vision_proj cannot be fitted; "
                             "use the pig_clip student of the same tokenizer.")
    gram = np.zeros((teacher.width, teacher.width))                  # E_tᵀE_t
    cross = np.zeros((teacher.width, student.width))                 # E_tᵀE_s
    total = 2 * teacher.rows
    for a, b in _blocks(teacher.rows, block):
        t = teacher.read(a, b)
        gram += t.T @ t
        cross += t.T @ student.read(a, b)
        progress(b, total)
    lam = ridge * float(np.mean(np.diag(gram)))
    gram[np.diag_indices_from(gram)] += lam
    weight = np.linalg.solve(gram, cross).T                          # [in, vis]
    del gram, cross
    cosines, err, ref = [], 0.0, 0.0
    for a, b in _blocks(teacher.rows, block):
        pred, s = teacher.read(a, b) @ weight.T, student.read(a, b)
        norms = np.linalg.norm(pred, axis=1) * np.linalg.norm(s, axis=1)
        cosines.append(np.einsum("ij,ij->i", pred, s) / np.maximum(norms, 1e-30))
        err += float(((pred - s) ** 2).sum())
        ref += float((s ** 2).sum())
        progress(teacher.rows + b, total)
    cos = np.concatenate(cosines)
    return VisionProjFit(torch.from_numpy(weight.astype(np.float32)), ridge, float(cos.mean()),
                         float(np.percentile(cos, 5)), err / max(ref, 1e-30), teacher.rows)


def save_vision_proj(path: str | os.PathLike, fit: VisionProjFit, pack: str) -> None:
    with atomic_path(path) as tmp:
        torch.save({"weight": fit.weight, "ridge": fit.ridge, "fit_cos_mean": fit.fit_cos_mean,
                    "fit_cos_p5": fit.fit_cos_p5, "rel_mse": fit.rel_mse, "pack": pack, "vocab": fit.vocab}, tmp)


def load_vision_proj(path: str | os.PathLike, in_dim: int, vis_dim: int) -> dict[str, Any] | None:
    """The saved fit if it has the shape [in_dim, vis_dim]; None when there is none or it does not fit
    (a different student or teacher: it is fitted again)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 — a damaged file is refitted, never trusted
        return None
    weight = saved.get("weight") if isinstance(saved, dict) else None
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (in_dim, vis_dim):
        return None
    return saved
