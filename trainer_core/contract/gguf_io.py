"""Adapter GGUF files as the ggk engine reads them (engine-contract §0.2–§0.4): write, read, check.

Layout: GGUF v3, tensors named "adapter." + the state_dict name in state_dict order, ne =
reversed torch shape (the torch row-major bytes as they are), F32 for every 1-D tensor, for
LayerNorm tensors and for the query banks / `vision_proj.weight`, F16 for every other 2-D tensor.
The engine reads no adapter KV: it infers the variant and every dimension from tensor names and
shapes, so the reader here does the same and treats KVs as provenance only. What is particular to a
kind (its structural KVs, a vocabulary the engine tokenizes with, its second head's fold, its F32
tensors) the kind says (contract/kinds/); the KV keys every adapter carries are the KV_* constants
below.

`write_gguf` is the one GGUF write sequence (header, KVs, tensors into a temp file, fsync,
rename): the adapter export, the SigVQ export and the demo's student files all go through it.
"""
from __future__ import annotations

import math
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch
from torch import nn

from trainer_core.contract.adapter_layout import PREFIX, LayoutProblem
from trainer_core.contract.kinds import (AdapterConfig, build_adapter, detect_layout, expected_ne, gguf_dtype)
from trainer_core.base.atomic import atomic_path
from trainer_core.base.errors import ModelFileError
from trainer_core.contract.gguf_read import (GGUFHeader, GGUFTensor, dequantize, open_gguf, read_gguf_kvs,
                                             read_gguf_string_array, read_gguf_tensors)

__all__ = [
    "PREFIX", "TRAINER", "Provenance", "fold_standardization", "gguf_dtype", "write_gguf", "write_adapter_gguf",
    "read_adapter_gguf", "read_gguf_tensors", "read_gguf_kvs", "read_gguf_string_array", "detect_layout",
    "layout_of", "LayoutProblem",
    "AdapterFile", "open_gguf", "dequantize", "GGUFTensor",
    "KV_NAME", "KV_IN_DIM", "KV_OUT_DIM", "KV_WIDTH", "KV_DEPTH", "KV_HEADS",
    "KV_TRAINED_STEPS", "KV_PLANNED_STEPS", "KV_CHECKPOINT", "KV_SNAPSHOT", "KV_VAL_COS", "KV_BEST_VAL_COS",
    "KV_PACK", "KV_TRAINER",
]

TRAINER = "gguf-trainer"

# The KVs every adapter GGUF carries (provenance: the engine reads none of them). A kind's own KVs are
# its structural_kvs; the pack's (adapter.teacher, …) are the pack's facts and live in its export_kvs.
KV_NAME = "general.name"
KV_IN_DIM, KV_OUT_DIM = "adapter.in_dim", "adapter.out_dim"
KV_WIDTH, KV_DEPTH, KV_HEADS = "adapter.width", "adapter.depth", "adapter.heads"
KV_TRAINED_STEPS, KV_PLANNED_STEPS = "adapter.trained_steps", "adapter.planned_steps"
KV_CHECKPOINT, KV_SNAPSHOT = "adapter.checkpoint", "adapter.snapshot"
KV_VAL_COS, KV_BEST_VAL_COS = "adapter.val_cos", "adapter.best_val_cos"
KV_PACK, KV_TRAINER = "adapter.pack", "adapter.trainer"
STUDENT_MARKER = "model.layers.0.self_attn.q_proj.weight"  # how ggk's front end recognises a student GGUF


@dataclass(frozen=True)
class Provenance:
    """Where an exported adapter came from; written as adapter.* KVs, read by nobody but us."""

    trained_steps: int
    planned_steps: int
    checkpoint: str               # "best", "last" or "step<N>"
    snapshot: bool = False
    val_cos: float | None = None  # only when the checkpoint was validated at its own step
    best_val_cos: float | None = None


def fold_standardization(state: Mapping[str, torch.Tensor], mu: torch.Tensor, sigma: torch.Tensor,
                         bank_mu: torch.Tensor | None = None, bank_sigma: torch.Tensor | None = None,
                         bank_head: str | None = None) -> dict[str, torch.Tensor]:
    """W' = diag(σ_f)·W, b' = σ_f ⊙ b + μ on out_proj, in f32: the adapter then emits teacher-scale rows.
    A skip path (layerwise) is scaled by σ_f alone, W' = diag(σ_f)·W, b' = σ_f ⊙ b: the two heads are
    summed, so μ is added once. A kind's second head (`bank_head`, its AdapterKind.bank_head: a bank's
    or a caption bank's) folds its own statistics, given exactly when the adapter has one; (μ, σ) are
    then the first head's."""
    out = {k: v.detach().to(torch.float32).clone() for k, v in state.items()}
    sigma = _fold_head(out, "out_proj", mu, sigma)
    if "skip.weight" in out:
        out["skip.weight"] = out["skip.weight"] * sigma[:, None]
        out["skip.bias"] = out["skip.bias"] * sigma
    has_bank = bank_head is not None and f"{bank_head}.weight" in out
    if has_bank != (bank_mu is not None and bank_sigma is not None):
        raise ValueError(f"fold: the bank head's statistics must be given exactly when the adapter has "
                         f"{bank_head or 'a second head'}")
    if bank_head is not None and bank_mu is not None and bank_sigma is not None:
        _fold_head(out, bank_head, bank_mu, bank_sigma)
    return out


def _fold_head(state: dict[str, torch.Tensor], head: str, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """state[head] ← (diag(σ)·W, σ ⊙ b + μ) in place; returns σ as a flat f32 vector."""
    sigma = sigma.to(torch.float32).reshape(-1)
    mu = mu.to(torch.float32).reshape(-1)
    w, b = state[f"{head}.weight"], state[f"{head}.bias"]          # [out, W], [out]
    if w.shape[0] != sigma.numel() or mu.numel() != sigma.numel():
        raise ValueError(f"fold: {head} has {w.shape[0]} rows but σ has {sigma.numel()} and μ {mu.numel()}")
    state[f"{head}.weight"] = w * sigma[:, None]
    state[f"{head}.bias"] = b * sigma + mu
    return sigma


def _kv_items(config: AdapterConfig, name: str, pack: str, provenance: Provenance,
              pack_kvs: Mapping[str, Any], arrays: Mapping[str, list[str]]) -> list[tuple[str, Any, str]]:
    """(key, value, type) in the contract's order; type ∈ u32, str, bool, f32, i32s (an INT32 array),
    strs (a STRING array)."""
    before_width, after_heads = config.spec.structural_kvs(config)
    items: list[tuple[str, Any, str]] = [
        (KV_NAME, name, "str"),
        (KV_IN_DIM, config.in_dim, "u32"),
        (KV_OUT_DIM, config.out_dim, "u32"),
        *before_width,
        (KV_WIDTH, config.width, "u32"), (KV_DEPTH, config.depth, "u32"), (KV_HEADS, config.heads, "u32"),
        *after_heads,
    ]
    p = provenance
    items += [(KV_TRAINED_STEPS, p.trained_steps, "u32"),
              (KV_PLANNED_STEPS, p.planned_steps, "u32"),
              (KV_CHECKPOINT, p.checkpoint, "str"),
              (KV_SNAPSHOT, p.snapshot, "bool")]
    if p.val_cos is not None and math.isfinite(p.val_cos):
        items.append((KV_VAL_COS, float(p.val_cos), "f32"))
    if p.best_val_cos is not None and math.isfinite(p.best_val_cos) and p.best_val_cos > -1:
        items.append((KV_BEST_VAL_COS, float(p.best_val_cos), "f32"))
    items += [(KV_PACK, pack, "str"), (KV_TRAINER, TRAINER, "str")]
    taken = {k for k, _, _ in items}
    for key, value in pack_kvs.items():
        if key in taken:
            continue
        kind = ("bool" if isinstance(value, bool) else "u32" if isinstance(value, int)
                else "f32" if isinstance(value, float) else "str")
        items.append((key, value, kind))
    items += [(key, list(values), "strs") for key, values in arrays.items() if key not in taken and len(values)]
    items += [item for item in config.spec.array_kvs(config, arrays) if item[0] not in taken]
    return items


def write_gguf(path: str | os.PathLike, arch: str, tensors: Iterable[tuple[Any, ...]],
               kvs: Iterable[tuple[str, Any, str]] = (), check: Callable[[Path], None] | None = None,
               needs: int = 0) -> Path:
    """Write a GGUF atomically: header, `kvs`, `tensors` into a temp file beside `path`, then
    `check(temp path)` (a read-back; raise to keep the old file), fsync and rename.

    `tensors` yields (name, array) or (name, array, raw GGMLQuantizationType) with arrays in
    torch order; it may be a generator (reading a source the caller keeps open around the
    call): it is consumed inside the call. `kvs` are (key, value, type) with type one of u32,
    str, bool, f32, i32s (a list of ints, an INT32 array), strs (a list of str, a STRING array),
    written in that order after general.architecture. `needs` (bytes, when the caller knows them)
    is checked against the free space before anything is written.
    """
    import gguf

    path = Path(path)
    with atomic_path(path, needs=needs) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=arch)
        adders = {"u32": writer.add_uint32, "str": writer.add_string, "bool": writer.add_bool,
                  "f32": writer.add_float32, "i32s": lambda key, value: writer.add_array(key, [int(v) for v in value]),
                  "strs": lambda key, value: writer.add_array(key, [str(v) for v in value])}
        for key, value, kind in kvs:
            adders[kind](key, value)
        for name, array, *raw in tensors:
            writer.add_tensor(name, array, raw_dtype=raw[0] if raw else None)
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
        except OSError as e:
            # the gguf package writes tensors with numpy's tofile, whose short write on a full disk is an
            # OSError without an errno ("N requested and M written"): say it as the full disk it is
            if e.errno is None and "requested and" in str(e):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
            raise
        if check is not None:
            check(tmp)  # read back before the rename
    return path


def write_adapter_gguf(path: str | os.PathLike, model: nn.Module | Mapping[str, torch.Tensor],
                       config: AdapterConfig, *, name: str, pack: str, provenance: Provenance,
                       pack_kvs: Mapping[str, Any] | None = None, mu: torch.Tensor | None = None,
                       sigma: torch.Tensor | None = None, bank_mu: torch.Tensor | None = None,
                       bank_sigma: torch.Tensor | None = None,
                       arrays: Mapping[str, list[str]] | None = None,
                       extra: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write the adapter GGUF atomically and verify it by reading it back before the rename.

    `mu`/`sigma` (σ already floored) fold the standardization into out_proj; they are
    required for kinds trained on standardized targets and refused for the others;
    `bank_mu`/`bank_sigma` fold the kind's second head (AdapterKind.bank_head), exactly when it has one.
    `arrays` are string-array KVs written after all the others (a vocabulary the engine tokenizes a
    template with, followed by the kind's array_kvs); `extra` are tensors written after the adapter's
    under their own names (a tokenizer.json as bytes). The kind refuses (check_export) a file the
    engine could not use without them.
    """
    state = model.state_dict() if isinstance(model, nn.Module) else dict(model)
    arrays, extra = dict(arrays or {}), dict(extra or {})
    kind = config.spec
    bank_head = kind.bank_head(config)
    if kind.standardized != (mu is not None and sigma is not None):
        raise ValueError(f"{config.kind}: fold statistics must be given exactly when the kind is "
                         f"trained on standardized targets")
    if (bank_head is not None) != (bank_mu is not None and bank_sigma is not None):
        raise ValueError(f"{config.kind}: the bank head's fold statistics must be given exactly when the "
                         f"adapter has a bank")
    kind.check_export(config, path, arrays, extra)
    state = (fold_standardization(state, mu, sigma, bank_mu, bank_sigma, bank_head) if mu is not None
             else {k: v.detach().to(torch.float32) for k, v in state.items()})

    def tensors() -> Iterable[tuple[str, np.ndarray]]:
        for tensor_name, tensor in state.items():      # torch converts (the same rounding) ~5x faster than numpy
            dtype = torch.float32 if gguf_dtype(tensor_name, tensor.ndim) == "f32" else torch.float16
            yield PREFIX + tensor_name, tensor.detach().cpu().to(dtype).contiguous().numpy()
        for tensor_name, array in extra.items():
            yield tensor_name, np.ascontiguousarray(array)
    needs = sum(t.numel() * (4 if gguf_dtype(n, t.ndim) == "f32" else 2) for n, t in state.items())
    needs += sum(int(a.nbytes) for a in extra.values())
    needs += sum(8 + len(str(v).encode()) for values in arrays.values() for v in values)
    kvs = _kv_items(config, name, pack, provenance, pack_kvs or {}, arrays)
    return write_gguf(path, "pig", tensors(), kvs, check=lambda tmp: _verify(tmp, state, config, kvs, extra),
                      needs=needs)


def _verify(tmp: str | os.PathLike, state: Mapping[str, torch.Tensor], config: AdapterConfig,
            kvs: list[tuple[str, Any, str]], extra: Mapping[str, np.ndarray] | None = None) -> None:
    header = GGUFHeader(Path(tmp))
    tensors = header.tensors()
    names = [n for n in tensors]
    if names != [PREFIX + n for n in state] + list(extra or {}):
        raise ModelFileError(f"the GGUF written to {tmp} does not hold the adapter's tensors in order")
    found, problems = layout_of(tensors)
    fatal = [p for p in problems if p.fatal]
    if fatal or found != config:
        why = fatal[0].message if fatal else f"it reads back as {found}, not {config}"
        raise ModelFileError(f"the GGUF written to {tmp} would be misread by the engine: {why}")
    lost = [key for key, value, kind in kvs if kind == "strs" and header.array_length(key) != len(value)]
    if lost:
        raise ModelFileError(f"the GGUF written to {tmp} does not hold the {lost[0]} array it was given")


# ------------------------------------------------------------------ reading


def layout_of(tensors: Mapping[str, GGUFTensor]) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """detect_layout on the tensors of a read file (with the layer_map values when there is one)."""
    lm = tensors.get(PREFIX + "layer_map")
    values = lm.to_torch().numpy() if lm is not None and lm.dtype in ("F32", "F16") else None
    return detect_layout({n: (t.shape_ne, t.dtype) for n, t in tensors.items()}, values)


@dataclass
class AdapterFile:
    path: Path
    config: AdapterConfig
    model: nn.Module
    kvs: dict[str, Any]
    problems: list[LayoutProblem]


def read_adapter_gguf(path: str | os.PathLike, device: str | torch.device = "cpu") -> AdapterFile:
    """Rebuild the torch adapter (f32) from a GGUF alone, as the engine would see it (tensors the
    engine ignores, reported among the problems, are left out)."""
    path = Path(path)
    header = GGUFHeader(path)
    tensors = header.tensors()
    config, problems = layout_of(tensors)
    fatal = [p for p in problems if p.fatal]
    if config is None or fatal:
        raise ModelFileError(f"{path} is not an adapter the engine would run as intended: "
                             f"{(fatal or problems)[0].message}.")
    model = build_adapter(config, init=False)                  # load_state_dict(strict) fills every weight
    used = expected_ne(config)
    state = {name[len(PREFIX):]: t.to_torch() for name, t in tensors.items() if name[len(PREFIX):] in used}
    if "layer_map" in state:         # a stored [n, 1] counts as n entries, as in the engine
        state["layer_map"] = state["layer_map"].reshape(-1)
    model.load_state_dict(state, strict=True)
    model.to(device).eval()
    return AdapterFile(path, config, model, header.summary(), problems)
