"""The companion `pig_ming_vision-<quant>.gguf`: the Ling vision tower + linear_proj as ggk reads it
with `--llm_vision` (packs-contract-more §D.1, "1. Materials" and "5. Adapter kind").

* **Tensors.** The mllm's `vision.*` + `linear_proj.*` tensors, names verbatim, sorted. The 5-D
  Conv3d `vision.patch_embed.proj.weight` [hidden, 3, 2, 14, 14] is BF16 with its 5-D shape
  (ne [14, 14, 2, 3, hidden]); every 1-D tensor F32; every other one Q8_0 when the quant is
  "q8_0" and its last torch dim (ne[0]) is a multiple of 32, else F16.
* **How ggk 0.9.7 reads it.** gk-diffuser.cpp loads the file under `text_encoders.llm.` (not
  `.visual.`: it has no `v.blk.*` / `mm.*`, so it is no llama.cpp mmproj), its name conversion
  leaves these names alone. ggml holds 4 dims at most: the engine's own GGUF reader
  (gguf_reader_ext.h) folds a 5-D tensor's extra dims into the last, [14, 14, 2, 3·hidden], which
  is the shape its Conv3d declares (F16; BF16 is converted on load). A Linear keeps a Q8_0 weight
  only when its ne[0] is a multiple of 32, which is why the rule above asks for it. Tensors it
  does not use are only logged.
* **What ggk requires** (`detect_vision`, ming_image_te.hpp): a `vision.*blocks.N` tensor,
  `vision.merger.ln_q.weight` (hidden = ne[0]), `vision.merger.mlp.2.weight` (out = ne[1]),
  `vision.patch_embed.proj.weight` (patch = ne[0]), `vision.blocks.0.mlp.gate_proj.weight`
  (intermediate = ne[1]), `linear_proj.0.weight` with ne[0] = out and `linear_proj.2.weight` with
  ne[1] = the adapter's vis_dim; anything short of that and the file is not a Ling tower. It then
  hard-codes 16 heads, window 112, full attention in blocks {7, 15, 23, 31}, merge 2, temporal 2,
  3 channels, and its loader wants every tensor of every block at the shape the config implies.
  `check_vision_gguf` checks all of it.
* **Written** atomically (temp + fsync + rename), one tensor in memory at a time; skipped when the
  file is newer than the newest `mllm/model-*.safetensors`.
"""
from __future__ import annotations

import math
import os
import re
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from trainer_core.base.atomic import atomic_path
from trainer_core.base.errors import ModelFileError
from trainer_core.packs.ming_image.vision import VisionTensors, mllm_folder, vision_tensors

__all__ = ["QUANTS", "PATCH_EMBED", "KV_NAME", "KV_SOURCE", "KV_QUANT", "ENGINE_HEADS", "ENGINE_WINDOW",
           "ENGINE_FULLATT", "vision_gguf_name", "tensor_type", "VisionExport", "export_vision_gguf",
           "VisionGGUFConfig", "vision_gguf_problems", "check_vision_gguf"]

QUANTS = ("f16", "q8_0")
PATCH_EMBED = "vision.patch_embed.proj.weight"
KV_NAME, KV_SOURCE, KV_QUANT = "general.name", "ming_vision.source", "ming_vision.quant"
ARCH = "pig"
# what ggk hard-codes for a Ling tower (detect_vision), whatever the file or vision_config says
ENGINE_HEADS, ENGINE_WINDOW, ENGINE_FULLATT = 16, 112, (7, 15, 23, 31)
_HEADER_ROOM = 1 << 16          # the GGUF header, KVs and tensor index, generously


def vision_gguf_name(quant: str = "f16", base: str = "pig_ming") -> str:
    """`<base>_vision-<quant>.gguf`: pig_ming_vision-f16.gguf for the pack's default name."""
    return f"{base}_vision-{quant}.gguf"


def tensor_type(name: str, shape: tuple[int, ...], quant: str) -> str:
    """The GGML type a tensor of that torch shape is stored as (BF16, F32, Q8_0 or F16)."""
    if name == PATCH_EMBED:
        return "BF16"
    if len(shape) == 1:
        return "F32"
    return "Q8_0" if quant == "q8_0" and shape[-1] % 32 == 0 else "F16"


def _nbytes(ggml_type: str, shape: tuple[int, ...]) -> int:
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]]
    return math.prod(shape) * size // block


def _encode(tensor: torch.Tensor, ggml_type: str) -> np.ndarray:
    """The bytes of one tensor as `ggml_type`, torch order, ready for write_tensor_data."""
    import gguf
    t = tensor.detach().cpu()
    if ggml_type == "BF16":                       # bf16 on disk stays bit-exact; f32 rounds to nearest even
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    values = t.to(torch.float32).numpy()
    if ggml_type == "F32":
        return np.ascontiguousarray(values)
    if ggml_type == "F16":
        return np.ascontiguousarray(values.astype(np.float16))
    return gguf.quants.quantize(np.ascontiguousarray(values), gguf.GGMLQuantizationType[ggml_type])


@dataclass(frozen=True)
class VisionExport:
    path: Path
    skipped: bool          # the file was newer than the snapshot's weights and was kept as it was
    tensors: int
    bytes: int             # size of the file


def _newest_weights(folder: Path) -> float:
    times = [p.stat().st_mtime for p in folder.glob("model-*.safetensors")]
    times += [p.stat().st_mtime for p in folder.glob("model.safetensors")]
    return max(times, default=0.0)


def export_vision_gguf(snapshot: str | os.PathLike, path: str | os.PathLike, quant: str = "f16",
                       source: str | None = None, force: bool = False,
                       progress: Callable[[int, int], None] | None = None) -> VisionExport:
    """Write the vision GGUF of a Ming snapshot (root or its mllm/ folder) to `path`.

    `source` is written as ming_vision.source (the snapshot's repo id; its folder when not given).
    Without `force`, a `path` newer than the newest mllm/model-*.safetensors is kept (skipped=True).
    `progress(done_bytes, total_bytes)` is called after each tensor. A disk that is full or read-only
    ends in one sentence (DiskFullError / FolderError) and leaves no file behind."""
    if quant not in QUANTS:
        raise ValueError(f"vision quant must be one of {', '.join(QUANTS)}, not {quant!r}")
    path = Path(path)
    folder = mllm_folder(snapshot)
    if not force and path.is_file() and path.stat().st_mtime > _newest_weights(folder):
        try:
            return VisionExport(path, True, len(check_vision_gguf(path).names), path.stat().st_size)
        except ModelFileError:
            pass                                            # damaged or incomplete: write it again
    found = vision_tensors(folder)
    planned = {n: (tuple(reversed(s)), tensor_type(n, s, quant)) for n, s in found.shapes.items()}
    problems = vision_gguf_problems(planned)
    if problems:
        raise ModelFileError(f"{found.source} does not hold a vision tower ggk can run ({problems[0]}); download "
                             "the Ming snapshot's mllm/ folder again.")
    plan = [(n, found.shapes[n], tensor_type(n, found.shapes[n], quant)) for n in found.names]
    total = sum(_nbytes(t, s) for _, s, t in plan)
    kvs = [(KV_NAME, path.name.removesuffix(".gguf")), (KV_SOURCE, source or str(folder.parent)), (KV_QUANT, quant)]
    with atomic_path(path, needs=total + _HEADER_ROOM) as tmp:
        _write(tmp, plan, kvs, found, progress)
        written = check_vision_gguf(tmp)                    # read back before the rename
        if written.names != [n for n, _, _ in plan]:
            raise ModelFileError(f"the GGUF written to {tmp} does not hold the snapshot's vision tensors in order")
    return VisionExport(path, False, len(plan), path.stat().st_size)


def _write(tmp: Path, plan: list[tuple[str, tuple[int, ...], str]], kvs: list[tuple[str, str]],
           found: VisionTensors, progress: Callable[[int, int], None] | None) -> None:
    """Header, KVs and tensor index first, then the tensors one by one from their shards."""
    import gguf
    from safetensors import safe_open
    writer = gguf.GGUFWriter(tmp, arch=ARCH)
    with ExitStack() as shards:
        shards.callback(writer.close)
        for key, value in kvs:
            writer.add_string(key, value)
        for name, shape, ggml_type in plan:       # the dtype argument is ignored when raw_dtype is given
            writer.add_tensor_info(name, shape, np.dtype(np.float16), _nbytes(ggml_type, shape),
                                   raw_dtype=gguf.GGMLQuantizationType[ggml_type])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        # The tensor data as write_tensor_data lays it out (each tensor at the alignment, padded to it),
        # written through the file object: numpy's tofile, which the writer uses, reports a full disk as
        # an OSError without errno ("N requested and M written"), so it would not read as one.
        fout = writer.fout[0]
        handles: dict[Path, Any] = {}
        done, total = 0, sum(_nbytes(t, s) for _, s, t in plan)
        for name, shape, ggml_type in plan:
            shard = found.shard_of[name]
            if shard not in handles:
                handles[shard] = shards.enter_context(safe_open(str(shard), framework="pt"))
            data = np.ascontiguousarray(_encode(handles[shard].get_tensor(name), ggml_type))
            if data.nbytes != _nbytes(ggml_type, shape):
                raise RuntimeError(f"{name}: {data.nbytes} bytes encoded as {ggml_type}, "
                                   f"{_nbytes(ggml_type, shape)} planned")
            writer.write_padding(fout, fout.tell())
            fout.write(data.data)
            writer.write_padding(fout, data.nbytes)
            done += data.nbytes
            del data
            if progress is not None:
                progress(done, total)
        fout.flush()


# ------------------------------------------------------------------ reading back


@dataclass(frozen=True)
class VisionGGUFConfig:
    """What ggk reads from a vision GGUF (sizes from shapes, the rest hard-coded by the engine)."""

    layers: int
    hidden: int
    intermediate: int
    out_hidden: int
    vis_dim: int
    patch_size: int
    names: list[str]
    heads: int = ENGINE_HEADS
    window: int = ENGINE_WINDOW
    fullatt: tuple[int, ...] = ENGINE_FULLATT


_BLOCK = re.compile(r"blocks\.(\d+)")


def _engine_sizes(tensors: Mapping[str, tuple[tuple[int, ...], str]]) -> tuple[list[str], dict[str, int]]:
    """detect_vision's reading: (what is missing, the sizes it takes from the shapes)."""
    layers = 0
    for name in tensors:
        if name.startswith("vision."):
            m = _BLOCK.search(name)     # the engine: atoi of the item after the first "blocks."
            if m:
                layers = max(layers, int(m.group(1)) + 1)
    required = ("vision.merger.ln_q.weight", "vision.merger.mlp.2.weight", PATCH_EMBED,
                "vision.blocks.0.mlp.gate_proj.weight", "linear_proj.0.weight", "linear_proj.2.weight")
    missing = ([] if layers else ["vision.blocks.N.* (no tower blocks)"]) + [n for n in required if n not in tensors]
    if missing:
        return missing, {}
    ne = {n: tensors[n][0] for n in required}
    return [], {"layers": layers, "hidden": ne["vision.merger.ln_q.weight"][0],
                "intermediate": ne["vision.blocks.0.mlp.gate_proj.weight"][1],
                "out_hidden": ne["vision.merger.mlp.2.weight"][1], "patch_size": ne[PATCH_EMBED][0],
                "proj_in": ne["linear_proj.0.weight"][0], "vis_dim": ne["linear_proj.2.weight"][1]}


def _expected_ne(s: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Every tensor the engine's MingVisionModel declares, at its ggml ne (the patch embed folded to 4-D)."""
    h, i, o, v, p, m = s["hidden"], s["intermediate"], s["out_hidden"], s["vis_dim"], s["patch_size"], 4 * s["hidden"]
    out: dict[str, tuple[int, ...]] = {PATCH_EMBED: (p, p, 2, 3 * h), "vision.merger.ln_q.weight": (h,),
                                       "vision.merger.mlp.0.weight": (m, m), "vision.merger.mlp.0.bias": (m,),
                                       "vision.merger.mlp.2.weight": (m, o), "vision.merger.mlp.2.bias": (o,),
                                       "linear_proj.0.weight": (o, v), "linear_proj.0.bias": (v,),
                                       "linear_proj.2.weight": (v, v), "linear_proj.2.bias": (v,)}
    for b in range(s["layers"]):
        k = f"vision.blocks.{b}."
        out.update({k + "norm1.weight": (h,), k + "norm2.weight": (h,),
                    k + "attn.qkv.weight": (h, 3 * h), k + "attn.qkv.bias": (3 * h,),
                    k + "attn.proj.weight": (h, h), k + "attn.proj.bias": (h,),
                    k + "mlp.gate_proj.weight": (h, i), k + "mlp.gate_proj.bias": (i,),
                    k + "mlp.up_proj.weight": (h, i), k + "mlp.up_proj.bias": (i,),
                    k + "mlp.down_proj.weight": (i, h), k + "mlp.down_proj.bias": (h,)})
    return out


def _folded(ne: tuple[int, ...]) -> tuple[int, ...]:
    """ne as the engine holds it: dims past the 4th multiplied into the 4th."""
    return ne if len(ne) <= 4 else (*ne[:3], math.prod(ne[3:]))


def vision_gguf_problems(tensors: Mapping[str, tuple[tuple[int, ...], str]], vis_dim: int | None = None) -> list[str]:
    """Why ggk would not run these tensors ({name: (ne, ggml type)}) as a Ling vision tower, one phrase
    each; empty when it would. `vis_dim` is the adapter's (vis_in ne[0]); None checks the file alone."""
    missing, s = _engine_sizes(tensors)
    if missing:
        return [f"it lacks {', '.join(missing)}"]
    problems = []
    if s["proj_in"] != s["out_hidden"]:
        problems.append(f"linear_proj.0.weight takes {s['proj_in']} values but the tower gives {s['out_hidden']}")
    if vis_dim is not None and s["vis_dim"] != vis_dim:
        problems.append(f"linear_proj.2.weight gives {s['vis_dim']}-d rows but the adapter takes {vis_dim}")
    if s["hidden"] % ENGINE_HEADS:
        problems.append(f"the tower is {s['hidden']} wide, which ggk's {ENGINE_HEADS} heads do not divide")
    expected = _expected_ne(s)
    absent = [n for n in expected if n not in tensors]
    if absent:
        problems.append(f"it lacks {len(absent)} tensor(s) of the tower (first: {absent[0]})")
    wrong = [n for n, ne in expected.items() if n in tensors and _folded(tensors[n][0]) != ne]
    if wrong:
        n = wrong[0]
        problems.append(f"{n} has ne {list(tensors[n][0])} where ggk expects {list(expected[n])}")
    return problems


def check_vision_gguf(path: str | os.PathLike, vis_dim: int | None = None) -> VisionGGUFConfig:
    """The config ggk reads from a vision GGUF, or ModelFileError naming the first thing that stops it."""
    from trainer_core.contract.gguf_read import GGUFHeader
    header = GGUFHeader(Path(path))
    tensors = {name: (ne, _type_name(raw)) for name, ne, raw, _ in header.index}
    problems = vision_gguf_problems(tensors, vis_dim)
    if problems:
        raise ModelFileError(f"{path} is not a vision GGUF ggk can use with --llm_vision: {problems[0]}; export it "
                             "again from the Ming snapshot.")
    _, s = _engine_sizes(tensors)
    return VisionGGUFConfig(s["layers"], s["hidden"], s["intermediate"], s["out_hidden"], s["vis_dim"],
                            s["patch_size"], [name for name, *_ in header.index])


def _type_name(raw: int) -> str:
    import gguf
    try:
        return gguf.GGMLQuantizationType(raw).name
    except ValueError:
        return f"type {raw}"
