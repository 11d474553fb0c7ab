"""A stock llama.cpp Qwen2.5-VL mmproj (`mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf`) as a torch tower: the
rows the engine feeds the adapter's `vis_bridge` when `--llm_vision` is such a file (vis_bridge.py).

* **Names.** llama.cpp writes the Qwen2.5-VL tower under its mmproj names; the gguf package's own
  name table (`gguf.tensor_mapping`, MODEL_ARCH.MMPROJ) maps transformers' `visual.*` names onto
  them (`visual.blocks.N.attn.q` → `v.blk.N.attn_q`, `visual.merger.ln_q` → `v.post_ln`,
  `visual.merger.mlp.0` → `mm.0`, …). Its converter splits the fused qkv into attn_q/k/v and the
  Conv3d patch embedding [C, 3, 2, 14, 14] into its two temporal halves, `v.patch_embd.weight` and
  `v.patch_embd.weight.1`; we join both back.
* **Config** from shapes (hidden, mlp, merger width, depth) and KVs: `clip.vision.attention.head_count`,
  the full-attention layers from `clip.vision.wa_layer_indexes` or `clip.vision.n_wa_pattern` (every
  n-th layer), `clip.vision.window_size` (112 when absent). `clip.projector_type` must be
  `qwen2.5vl_merger`.
* **Forward** transformers' `Qwen2_5_VisionTransformerPretrainedModel` with the engine's tanh GELU
  in the merger (as vision.py), over patches preprocessed the Ming way (template.py): the merger's
  rows [V, out_hidden] in raster order of the merged grid, not normalized (the bridge's input).

`write_mmproj` writes a tower in the same layout (the demo's and the tests' stock file).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.ming_image.vision import GELU_MODES, build_tower, merged_rows

__all__ = ["PROJECTOR", "mmproj_names", "read_mmproj", "StockVision", "write_mmproj"]

PROJECTOR = "qwen2.5vl_merger"
_HELP = ("pick a llama.cpp Qwen2.5-VL mmproj (e.g. mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf) as the stock_mmproj "
         "material, or export without a vis_bridge (export.vis_bridge=false)")


def mmproj_names(state_names: list[str], depth: int) -> dict[str, list[str]]:
    """{transformers tower name: [mmproj names it is stored under]} (qkv → q, k, v; the patch embed
    → its two temporal halves)."""
    from gguf.constants import MODEL_ARCH
    from gguf.tensor_mapping import get_tensor_name_map
    table = get_tensor_name_map(MODEL_ARCH.MMPROJ, max(depth, 3))          # mm.{bid} counts too: mm.0, mm.2

    def one(name: str) -> str:
        found = table.get_name("visual." + name, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise KeyError(name)
        return found

    out: dict[str, list[str]] = {}
    for name in state_names:
        if ".attn.qkv." in name:
            out[name] = [one(name.replace(".attn.qkv.", f".attn.{p}.")) for p in "qkv"]
        elif name == "patch_embed.proj.weight":
            first = one(name)
            out[name] = [first, first + ".1"]
        else:
            out[name] = [one(name)]
    return out


def _kv(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    values = [field.parts[i] for i in field.data]
    if field.types and field.types[0].name == "STRING":
        return bytes(values[0]).decode("utf-8")
    flat = [v.tolist()[0] if hasattr(v, "tolist") else v for v in values]
    return flat if field.types[0].name == "ARRAY" else flat[0]


def read_mmproj(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(the tower's vision_config, {mmproj name: float32 array in torch layout}) of a Qwen2.5-VL mmproj;
    ModelFileError naming the file and what is wrong otherwise."""
    import gguf
    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except FileNotFoundError:
        raise ModelFileError(f"The stock mmproj {path} does not exist; {_HELP}.") from None
    except (OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"The stock mmproj {path} is not a readable GGUF ({' '.join(str(e).split())}); "
                             f"{_HELP}.") from None
    projector = _kv(reader, "clip.projector_type")
    if projector != PROJECTOR:
        raise ModelFileError(f"{path} is a {projector or 'non-mmproj'} file, not a Qwen2.5-VL mmproj "
                             f"(clip.projector_type {PROJECTOR}); {_HELP}.")
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        tensors[t.name] = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
    try:
        hidden = tensors["v.patch_embd.weight"].shape[0]
        depth = 1 + max(int(n.split(".")[2]) for n in tensors if n.startswith("v.blk."))
        heads = int(_kv(reader, "clip.vision.attention.head_count"))
        config = {"depth": depth, "hidden_size": hidden, "num_heads": heads,
                  "intermediate_size": tensors["v.blk.0.ffn_up.weight"].shape[0],
                  "out_hidden_size": tensors["mm.2.weight"].shape[0],
                  "patch_size": tensors["v.patch_embd.weight"].shape[-1], "spatial_merge_size": 2,
                  "temporal_patch_size": 2, "in_channels": 3, "hidden_act": "silu",
                  "window_size": int(_kv(reader, "clip.vision.window_size") or 112)}
    except (KeyError, ValueError, TypeError):
        raise ModelFileError(f"{path} lacks the Qwen2.5-VL tower's tensors or its head count; {_HELP}.") from None
    wa = _kv(reader, "clip.vision.wa_layer_indexes")
    n_wa = _kv(reader, "clip.vision.n_wa_pattern")
    if wa is not None:
        config["fullatt_block_indexes"] = [int(i) for i in (wa if isinstance(wa, list) else [wa])]
    elif n_wa:
        config["fullatt_block_indexes"] = [i for i in range(depth) if (i + 1) % int(n_wa) == 0]
    else:
        config["fullatt_block_indexes"] = list(range(depth))              # no window layers named: all full
    return config, tensors


class StockVision(nn.Module):
    """The mmproj's tower (transformers' Qwen2.5-VL vision model, the engine's tanh GELU in the merger)."""

    def __init__(self, vision_config: Mapping[str, Any], dtype: torch.dtype = torch.float32):
        super().__init__()
        self.vision = build_tower(vision_config, dtype)
        if isinstance(self.vision.merger.mlp[1], nn.GELU):
            self.vision.merger.mlp[1] = nn.GELU(approximate=GELU_MODES["tanh"])
        self.out_hidden = int(self.vision.config.out_hidden_size)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32) -> "StockVision":
        config, tensors = read_mmproj(path)
        model = cls(config, dtype)
        state = model.vision.state_dict()
        names = mmproj_names(list(state), config["depth"])
        missing = [n for stored in names.values() for n in stored if n not in tensors]
        if missing:
            raise ModelFileError(f"{path} lacks {len(missing)} tensor(s) of the Qwen2.5-VL tower (first: "
                                 f"{missing[0]}); {_HELP}.")
        with torch.no_grad():
            for name, stored in names.items():
                parts = [torch.from_numpy(tensors[n]) for n in stored]
                value = (torch.stack(parts, dim=2) if name == "patch_embed.proj.weight"
                         else torch.cat(parts) if len(parts) > 1 else parts[0])
                if tuple(value.shape) != tuple(state[name].shape):
                    raise ModelFileError(f"{path} stores {stored[0]} as {list(value.shape)} where the tower built "
                                         f"from its config needs {list(state[name].shape)}; {_HELP}.")
                state[name].copy_(value)
        return model.to(device).eval().requires_grad_(False)

    @torch.inference_mode()
    def encode(self, pixel_patches: Any, grid_thw: Any) -> torch.Tensor:
        """Patch rows (template.patchify) + grid_thw → the merger's rows [V, out_hidden] float32."""
        param = next(self.vision.parameters())
        grid = torch.as_tensor(grid_thw, dtype=torch.long).reshape(-1, 3)
        out = self.vision(hidden_states=torch.as_tensor(pixel_patches).to(param.device, param.dtype),
                          grid_thw=grid.to(param.device))
        return merged_rows(out).float()


def write_mmproj(path: str | os.PathLike, tower: nn.Module, n_wa_pattern: int, dtype: str = "f16") -> Path:
    """A transformers Qwen2.5-VL vision tower as a llama.cpp mmproj (2-D weights in `dtype`, the rest
    f32), with the KVs read_mmproj needs."""
    import gguf
    path = Path(path)
    cfg = tower.config
    state = tower.state_dict()
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("clip.projector_type", PROJECTOR)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.block_count", cfg.depth)
    writer.add_uint32("clip.vision.embedding_length", cfg.hidden_size)
    writer.add_uint32("clip.vision.feed_forward_length", cfg.intermediate_size)
    writer.add_uint32("clip.vision.attention.head_count", cfg.num_heads)
    writer.add_uint32("clip.vision.patch_size", cfg.patch_size)
    writer.add_uint32("clip.vision.projection_dim", cfg.out_hidden_size)
    writer.add_uint32("clip.vision.n_wa_pattern", n_wa_pattern)
    writer.add_uint32("clip.vision.window_size", cfg.window_size)
    for name, stored in mmproj_names(list(state), cfg.depth).items():
        value = state[name].detach().float()
        parts = (value.unbind(2) if name == "patch_embed.proj.weight"
                 else value.chunk(3) if len(stored) == 3 else (value,))
        for gguf_name, part in zip(stored, parts):
            array = part.contiguous().numpy()
            writer.add_tensor(gguf_name, array.astype(np.float16 if dtype == "f16" and array.ndim >= 2
                                                      else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
