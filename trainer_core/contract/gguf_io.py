"""Adapter GGUF files as the ggk engine reads them (engine-contract §0.2–§0.4): write, read, check.

Layout: GGUF v3, tensors named "adapter." + the state_dict name in state_dict order, ne =
reversed torch shape (the torch row-major bytes as they are), F32 for every 1-D tensor, for
LayerNorm tensors and for `query` / `vision_proj.weight`, F16 for every other 2-D tensor. The
engine reads no KV: it infers the variant and every dimension from tensor names and shapes,
so the reader here does the same and treats KVs as provenance only. The KV keys are the KV_*
constants below; whoever reads a KV back (evaluate, inspect) names it through them.

`write_gguf` is the one GGUF write sequence (header, KVs, tensors into a temp file, fsync,
rename): the adapter export, the SigVQ export and the demo's student files all go through it.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch
from torch import nn

from trainer_core.contract.adapter import AdapterConfig, build_adapter
from trainer_core.base.atomic import atomic_path
from trainer_core.base.errors import ModelFileError

__all__ = [
    "PREFIX", "TRAINER", "Provenance", "fold_standardization", "gguf_dtype", "write_gguf", "write_adapter_gguf",
    "read_adapter_gguf", "read_gguf_tensors", "read_gguf_kvs", "detect_layout", "LayoutProblem",
    "AdapterFile", "open_gguf", "dequantize", "GGUFTensor",
    "KV_NAME", "KV_IN_DIM", "KV_OUT_DIM", "KV_VIS_DIM", "KV_WIDTH", "KV_DEPTH", "KV_HEADS", "KV_NUM_QUERIES",
    "KV_TRAINED_STEPS", "KV_PLANNED_STEPS", "KV_CHECKPOINT", "KV_SNAPSHOT", "KV_VAL_COS", "KV_BEST_VAL_COS",
    "KV_PACK", "KV_TRAINER",
]

PREFIX = "adapter."
TRAINER = "gguf-trainer"

# The KVs every adapter GGUF carries (provenance: the engine reads none of them). The pack's own
# KVs (adapter.teacher, …) are the pack's facts and live in its export_kvs.
KV_NAME = "general.name"
KV_IN_DIM, KV_OUT_DIM, KV_VIS_DIM = "adapter.in_dim", "adapter.out_dim", "adapter.vis_dim"
KV_WIDTH, KV_DEPTH, KV_HEADS = "adapter.width", "adapter.depth", "adapter.heads"
KV_NUM_QUERIES = "adapter.num_queries"
KV_TRAINED_STEPS, KV_PLANNED_STEPS = "adapter.trained_steps", "adapter.planned_steps"
KV_CHECKPOINT, KV_SNAPSHOT = "adapter.checkpoint", "adapter.snapshot"
KV_VAL_COS, KV_BEST_VAL_COS = "adapter.val_cos", "adapter.best_val_cos"
KV_PACK, KV_TRAINER = "adapter.pack", "adapter.trainer"
F32_2D = frozenset({"query", "vision_proj.weight"})
FOREIGN_MARKERS = ("cap_query", "slot_query", "bank_query", "layer_map")  # other kinds' runners
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


def gguf_dtype(name: str, ndim: int) -> str:
    """'f32' or 'f16' for a state_dict tensor (engine-contract §0.3, `_keep_f32`)."""
    if ndim == 1 or name in F32_2D or name.startswith("ln_") or ".ln_" in name:
        return "f32"
    return "f16"


def fold_standardization(state: Mapping[str, torch.Tensor], mu: torch.Tensor, sigma: torch.Tensor
                         ) -> dict[str, torch.Tensor]:
    """W' = diag(σ_f)·W, b' = σ_f ⊙ b + μ on out_proj, in f32: the adapter then emits teacher-scale rows."""
    out = {k: v.detach().to(torch.float32).clone() for k, v in state.items()}
    sigma = sigma.to(torch.float32).reshape(-1)
    mu = mu.to(torch.float32).reshape(-1)
    w, b = out["out_proj.weight"], out["out_proj.bias"]          # [out, W], [out]
    if w.shape[0] != sigma.numel() or mu.numel() != sigma.numel():
        raise ValueError(f"fold: out_proj has {w.shape[0]} rows but σ has {sigma.numel()} and μ {mu.numel()}")
    out["out_proj.weight"] = w * sigma[:, None]
    out["out_proj.bias"] = b * sigma + mu
    return out


def _kv_items(config: AdapterConfig, name: str, pack: str, provenance: Provenance,
              pack_kvs: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(key, value, type) in the contract's order; type ∈ u32, str, bool, f32."""
    items: list[tuple[str, Any, str]] = [
        (KV_NAME, name, "str"),
        (KV_IN_DIM, config.in_dim, "u32"),
        (KV_OUT_DIM, config.out_dim, "u32"),
    ]
    if config.token_aligned and config.vis_dim:
        items.append((KV_VIS_DIM, config.vis_dim, "u32"))
    items += [(KV_WIDTH, config.width, "u32"), (KV_DEPTH, config.depth, "u32"),
              (KV_HEADS, config.heads, "u32")]
    if not config.token_aligned:
        items.append((KV_NUM_QUERIES, config.num_queries, "u32"))
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
    return items


def write_gguf(path: str | os.PathLike, arch: str, tensors: Iterable[tuple[Any, ...]],
               kvs: Iterable[tuple[str, Any, str]] = (), check: Callable[[Path], None] | None = None) -> Path:
    """Write a GGUF atomically: header, `kvs`, `tensors` into a temp file beside `path`, then
    `check(temp path)` (a read-back; raise to keep the old file), fsync and rename.

    `tensors` yields (name, array) or (name, array, raw GGMLQuantizationType) with arrays in
    torch order; it may be a generator (reading a source the caller keeps open around the
    call): it is consumed inside the call. `kvs` are (key, value, type) with type one
    of u32, str, bool, f32, written in that order after general.architecture.
    """
    import gguf

    path = Path(path)
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=arch)
        adders = {"u32": writer.add_uint32, "str": writer.add_string, "bool": writer.add_bool,
                  "f32": writer.add_float32}
        for key, value, kind in kvs:
            adders[kind](key, value)
        for name, array, *raw in tensors:
            writer.add_tensor(name, array, raw_dtype=raw[0] if raw else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        if check is not None:
            check(tmp)  # read back before the rename
    return path


def write_adapter_gguf(path: str | os.PathLike, model: nn.Module | Mapping[str, torch.Tensor],
                       config: AdapterConfig, *, name: str, pack: str, provenance: Provenance,
                       pack_kvs: Mapping[str, Any] | None = None, mu: torch.Tensor | None = None,
                       sigma: torch.Tensor | None = None) -> Path:
    """Write the adapter GGUF atomically and verify it by reading it back before the rename.

    `mu`/`sigma` (σ already floored) fold the standardization into out_proj; they are
    required for kinds trained on standardized targets and refused for the others.
    """
    state = model.state_dict() if isinstance(model, nn.Module) else dict(model)
    if config.standardized != (mu is not None and sigma is not None):
        raise ValueError(f"{config.kind}: fold statistics must be given exactly when the kind is "
                         f"trained on standardized targets")
    state = (fold_standardization(state, mu, sigma) if mu is not None
             else {k: v.detach().to(torch.float32) for k, v in state.items()})

    def tensors() -> Iterable[tuple[str, np.ndarray]]:
        for tensor_name, tensor in state.items():
            array = tensor.cpu().numpy()
            dtype = np.float32 if gguf_dtype(tensor_name, array.ndim) == "f32" else np.float16
            yield PREFIX + tensor_name, np.ascontiguousarray(array.astype(dtype))
    return write_gguf(path, "pig", tensors(), _kv_items(config, name, pack, provenance, pack_kvs or {}),
                      check=lambda tmp: _verify(tmp, state, config))


def _verify(tmp: str | os.PathLike, state: Mapping[str, torch.Tensor], config: AdapterConfig) -> None:
    tensors = read_gguf_tensors(tmp)
    names = [n[len(PREFIX):] for n in tensors]
    if names != list(state):
        raise ModelFileError(f"the GGUF written to {tmp} does not hold the adapter's tensors in order")
    found, problems = detect_layout({n: (t.shape_ne, t.dtype) for n, t in tensors.items()})
    fatal = [p for p in problems if p.fatal]
    if fatal or found != config:
        why = fatal[0].message if fatal else f"it reads back as {found}, not {config}"
        raise ModelFileError(f"the GGUF written to {tmp} would be misread by the engine: {why}")


# ------------------------------------------------------------------ reading

@dataclass
class GGUFTensor:
    path: Path
    name: str
    shape_ne: tuple[int, ...]   # GGUF order: fastest axis first
    dtype: str                  # "F32", "F16", "Q8_0", …
    data: np.ndarray            # numpy in torch order (reversed ne), dequantized only on demand

    def to_torch(self) -> torch.Tensor:
        return torch.from_numpy(dequantize(self.path, self.name, self.dtype, self.data, self.shape_ne))


def dequantize(path: Path, name: str, dtype: str, data: np.ndarray, shape_ne: tuple[int, ...]) -> np.ndarray:
    """One tensor as float32 in torch order (ne reversed), copied out of the memory map."""
    import gguf
    try:
        if dtype in ("F32", "F16"):
            values = np.asarray(data, dtype=np.float32)
        else:  # BF16, Q8_0, Q4_K, …: the gguf package's reference dequantizers
            values = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[dtype])
    except NotImplementedError:
        raise ModelFileError(f"{path} stores {name} as {dtype}, which the gguf package cannot "
                             f"dequantize; convert the file to f16, bf16 or q8_0.") from None
    return np.ascontiguousarray(values, dtype=np.float32).reshape(tuple(reversed(shape_ne))).copy()


def open_gguf(path: str | os.PathLike):
    """A gguf.GGUFReader over the file, or ModelFileError saying why it cannot be one."""
    import gguf
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise ModelFileError(f"{path} does not exist; check the path.") from None
    except OSError as e:
        raise ModelFileError(f"{path} cannot be read ({e.strerror}); check its permissions.") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF').")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # the package raises ValueError, IndexError, … on short or bad data
        raise ModelFileError(f"{path} is truncated or damaged and cannot be read as GGUF "
                             f"({' '.join(str(e).split())}); download or export it again.") from None
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelFileError(f"{path} is truncated (the data of {t.name} runs past the end of "
                                 f"the file); download or export it again.")
    return reader


def read_gguf_tensors(path: str | os.PathLike) -> dict[str, GGUFTensor]:
    reader = open_gguf(path)
    out = {}
    for t in reader.tensors:
        out[t.name] = GGUFTensor(Path(path), t.name, tuple(int(x) for x in t.shape), t.tensor_type.name, t.data)
    return out


def read_gguf_kvs(path: str | os.PathLike) -> dict[str, Any]:
    """Every KV except the GGUF bookkeeping ones, as Python values."""
    import gguf
    reader = open_gguf(path)
    out: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        kind = fld.types[0] if fld.types else None
        if kind == gguf.GGUFValueType.STRING:
            out[key] = bytes(fld.parts[fld.data[0]]).decode("utf-8", "replace")
        elif kind == gguf.GGUFValueType.ARRAY:
            out[key] = f"[array of {len(fld.data)}]"
        else:
            value = fld.parts[fld.data[0]][0]
            out[key] = bool(value) if kind == gguf.GGUFValueType.BOOL else value.item()
    return out


@dataclass(frozen=True)
class LayoutProblem:
    message: str
    fatal: bool = True   # False: the engine runs it, but it is not what gguf-trainer writes


_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_RESAMPLER_BLOCK = ("ln_self", "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "ln_q",
                    "ln_kv", "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ln_mlp")
_TOKEN_BLOCK = ("ln_self", "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "ln_mlp")


def _expected(config: AdapterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the variant → its GGUF ne."""
    c, W = config, config.width
    ne: dict[str, tuple[int, ...]] = {}

    def linear(name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        ne[f"{name}.weight"] = (n_in, n_out)
        if bias:
            ne[f"{name}.bias"] = (n_out,)

    def norm(name: str) -> None:
        ne[f"{name}.weight"] = (W,)
        ne[f"{name}.bias"] = (W,)

    if c.token_aligned:
        if c.vis_dim:
            ne["vision_proj.weight"] = (c.vis_dim, c.in_dim)
        linear("in_proj", c.in_dim, W)
        if c.vis_dim and c.has_vis_in:
            ne["vis_in.weight"] = (c.vis_dim, W)
    else:
        ne["query"] = (W, c.num_queries)
        if c.kind == "seeded_resampler":
            ne["t5_embed.weight"] = (W, c.seed_vocab)
        linear("in_proj", c.in_dim, W)
    parts = _TOKEN_BLOCK if c.token_aligned else _RESAMPLER_BLOCK
    for i in range(c.depth):
        for part in parts:
            if part.startswith("ln_"):
                norm(f"blocks.{i}.{part}")
            else:
                linear(f"blocks.{i}.{part}", W, W)
        linear(f"blocks.{i}.mlp.0", W, c.mlp)
        linear(f"blocks.{i}.mlp.2", c.mlp, W)
    norm("ln_out")
    linear("out_proj", W, c.out_dim)
    if c.token_aligned and c.has_skip:
        linear("skip", c.in_dim, c.out_dim)
    return ne


def detect_layout(tensors: Mapping[str, tuple[tuple[int, ...], str]]
                  ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """Infer the adapter from tensor names and shapes as the engine does; list what is wrong.

    `tensors` maps GGUF names ("adapter.query", …) to (ne, dtype name). Fatal problems are
    the ones the engine would misread or refuse; the others are departures from what
    gguf-trainer writes (a tensor in another dtype).
    """
    problems: list[LayoutProblem] = []
    names = {n[len(PREFIX):]: v for n, v in tensors.items() if n.startswith(PREFIX)}
    for other in sorted(set(tensors) - {PREFIX + n for n in names}):
        problems.append(LayoutProblem(f"tensor {other} is outside the adapter. namespace the engine loads"))
    if not names:
        return None, [LayoutProblem("no adapter.* tensors: this is not an adapter GGUF")]
    for marker in FOREIGN_MARKERS:
        if marker in names:
            problems.append(LayoutProblem(f"adapter.{marker} belongs to another adapter kind; the engine "
                                          f"would run this file with a different runner"))
    has_query = "query" in names
    for name in ("skip.weight", "vision_proj.weight", "vis_in.weight"):
        if has_query and name in names:
            problems.append(LayoutProblem(
                f"adapter.query makes the engine run this file as a resampler, but adapter.{name} "
                f"belongs to token-aligned adapters and would be ignored"))
    if not has_query and ("t5_embed.weight" in names or "t5_embed_a.weight" in names):
        problems.append(LayoutProblem("adapter.t5_embed.weight without adapter.query: the engine runs a "
                                      "token-aligned adapter and ignores the seed table"))
    if "t5_embed_a.weight" in names:
        problems.append(LayoutProblem("adapter.t5_embed_a.weight is the factorized seed gguf-trainer "
                                      "does not read; export a full adapter.t5_embed.weight instead"))
    if any(p.fatal for p in problems):
        return None, problems

    def ne(name: str) -> tuple[int, ...] | None:
        v = names.get(name)
        return tuple(v[0]) if v else None

    in_proj, out_proj = ne("in_proj.weight"), ne("out_proj.weight")
    for required in ("in_proj.weight", "out_proj.weight", "blocks.0.mlp.0.weight"):
        if ne(required) is None or len(ne(required)) != 2:
            return None, problems + [LayoutProblem(f"adapter.{required} (2-D) is missing; the engine "
                                                   f"cannot size the adapter without it")]
    depth = 1 + max((int(m.group(1)) for n in names if (m := _BLOCK.match(n))), default=-1)
    width = in_proj[1]
    if width % 64:
        return None, problems + [LayoutProblem(f"adapter.in_proj.weight gives width {width}, which is not "
                                               f"a multiple of the engine's head_dim 64")]
    common = dict(in_dim=in_proj[0], out_dim=out_proj[1], width=width, depth=depth,
                  mlp_hidden=ne("blocks.0.mlp.0.weight")[1])
    try:
        if has_query:
            query = ne("query")
            seed = ne("t5_embed.weight")
            config = AdapterConfig(kind="seeded_resampler" if seed else "resampler",
                                   num_queries=query[1] if len(query) == 2 else 0,
                                   seed_vocab=seed[1] if seed and len(seed) == 2 else 0, **common)
        else:
            vp, vi = ne("vision_proj.weight"), ne("vis_in.weight")
            vis_dim = (vp or vi or (0,))[0]
            if vp and vi and vp[0] != vi[0]:
                return None, problems + [LayoutProblem(
                    f"adapter.vision_proj.weight ({vp[0]}) and adapter.vis_in.weight ({vi[0]}) disagree on "
                    f"the vision width; the engine takes whichever it reads last")]
            if vi and not vp:
                problems.append(LayoutProblem("adapter.vis_in.weight without adapter.vision_proj.weight: the "
                                              "engine cannot run reference images through this adapter",
                                              fatal=False))
            config = AdapterConfig(kind="token_aligned_vision", vis_dim=vis_dim, has_vis_in=vi is not None,
                                   has_skip=ne("skip.weight") is not None, **common)
    except ValueError as e:
        return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]

    expected = _expected(config)
    for name, want in expected.items():
        got = names.get(name)
        if got is None:
            problems.append(LayoutProblem(f"adapter.{name} is missing (expected ne {list(want)})"))
        elif tuple(got[0]) != want:
            problems.append(LayoutProblem(f"adapter.{name} has ne {list(got[0])} but the rest of the file "
                                          f"implies {list(want)}"))
        else:
            want_dtype = gguf_dtype(name, len(want)).upper()
            if got[1] != want_dtype:
                problems.append(LayoutProblem(f"adapter.{name} is {got[1]}; gguf-trainer writes {want_dtype}",
                                              fatal=got[1] not in ("F32", "F16")))
    for name in names:
        if name not in expected:
            problems.append(LayoutProblem(f"adapter.{name} is not part of a {config.kind} adapter; the "
                                          f"engine would ignore it"))
    if any(p.fatal for p in problems):
        return None, problems
    return config, problems


@dataclass
class AdapterFile:
    path: Path
    config: AdapterConfig
    model: nn.Module
    kvs: dict[str, Any]
    problems: list[LayoutProblem]


def read_adapter_gguf(path: str | os.PathLike, device: str | torch.device = "cpu") -> AdapterFile:
    """Rebuild the torch adapter (f32) from a GGUF alone, as the engine would see it."""
    path = Path(path)
    tensors = read_gguf_tensors(path)
    config, problems = detect_layout({n: (t.shape_ne, t.dtype) for n, t in tensors.items()})
    fatal = [p for p in problems if p.fatal]
    if config is None or fatal:
        raise ModelFileError(f"{path} is not an adapter the engine would run as intended: "
                             f"{(fatal or problems)[0].message}.")
    model = build_adapter(config)
    state = {name[len(PREFIX):]: t.to_torch() for name, t in tensors.items()}
    model.load_state_dict(state, strict=True)
    model.to(device).eval()
    return AdapterFile(path, config, model, read_gguf_kvs(path), problems)
