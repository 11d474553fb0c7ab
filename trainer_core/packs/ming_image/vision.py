"""The Ming-Image vision encoder: the mllm's Qwen2.5-VL tower + linear_proj + an L2 norm per row
(packs-contract-more §D.1, "2. Teacher", vision path step 6; engine ming_image_te.hpp
`MingVisionModel` / `project_image`).

    rows = l2(linear_proj.2(gelu(linear_proj.0(tower(patches, grid_thw).pooler_output))))   # [n, H]

* **Weights.** The `vision.*` and `linear_proj.{0,2}.*` tensors of `mllm/model-*.safetensors`, found
  through `model.safetensors.index.json` (only the shards that hold them are opened); the names
  are the module's own state_dict names, so the load is strict both ways: a vision tensor the
  tower built from `mllm/config.json`'s `vision_config` lacks, or one the files lack, is a
  ModelFileError naming the file. `vision.rotary_pos_emb.inv_freq` is a buffer recomputed from
  the config and is ignored where a checkpoint carries it.
* **GELU.** The Ming reference (and transformers' merger) use the exact GELU; ggk 0.9.7 computes
  both the merger's and linear_proj's GELU with `ggml_gelu`, the tanh approximation
  (gk_compute.c `gk_act_gelu`). The engine is what the adapter meets at inference, so
  `gelu="tanh"` (the default) swaps the merger's GELU too; `gelu="exact"` reproduces the reference.
* **L2 norm** as the engine's `ggml_l2_norm(x, 1e-12)`: x / sqrt(max(Σx², eps)) (for any row with
  ‖x‖ > 1e-6 this is F.normalize).
* **Input.** Rows of 3·2·14·14 values in Qwen2-VL's merge-window-major order and `grid_thw`
  [(1, h/14, w/14), …]; the output rows come in raster order of the merged grid (h/28, w/28), one
  per `<imagePatch>` slot. The image preprocessing (smart_resize, patchify) is template.py's.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.vis_bridge import L2_EPS, l2_rows

__all__ = ["VISION_PREFIX", "PROJ_PREFIX", "PROJ_NAMES", "RECOMPUTED", "L2_EPS", "GELU_MODES", "mllm_folder",
           "read_vision_config", "VisionTensors", "vision_tensors", "l2_rows", "tokens_per_image", "MingVision",
           "build_tower", "merged_rows"]

VISION_PREFIX, PROJ_PREFIX = "vision.", "linear_proj."
PROJ_NAMES = ("linear_proj.0.weight", "linear_proj.0.bias", "linear_proj.2.weight", "linear_proj.2.bias")
RECOMPUTED = frozenset({"vision.rotary_pos_emb.inv_freq"})   # a buffer from the config, never a weight
GELU_MODES = {"tanh": "tanh", "exact": "none"}             # ours → torch's `approximate`
INDEX = "model.safetensors.index.json"
_DROPPED_CONFIG_KEYS = ("_attn_implementation", "attn_implementation", "torch_dtype", "dtype", "architectures")


def mllm_folder(path: str | os.PathLike) -> Path:
    """The snapshot's `mllm/` folder, given either the snapshot root or that folder itself."""
    path = Path(path)
    return path / "mllm" if (path / "mllm" / "config.json").is_file() else path


def read_vision_config(mllm_dir: str | os.PathLike) -> dict[str, Any]:
    """`vision_config` of mllm/config.json as a dict (ModelFileError when it cannot be read)."""
    path = mllm_folder(mllm_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path} does not exist; download the Ming snapshot's mllm/ folder.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path} cannot be read as JSON ({e}); download the Ming snapshot's mllm/ folder "
                             "again.") from None
    vision = config.get("vision_config") if isinstance(config, dict) else None
    if not isinstance(vision, dict):
        raise ModelFileError(f"{path} has no vision_config; it is not a Ming-Image mllm config, so download "
                             "inclusionAI/Ming-Image-0.1-Design's mllm/ folder again.")
    return vision


class VisionTensors:
    """Where each `vision.*` / `linear_proj.*` tensor of an mllm folder lives, and its shape, read from
    the index and the safetensors headers only (no tensor data)."""

    def __init__(self, folder: Path, shard_of: dict[str, Path], shapes: dict[str, tuple[int, ...]],
                 dtypes: dict[str, str], source: Path):
        self.folder, self.shard_of, self.shapes, self.dtypes = folder, shard_of, shapes, dtypes
        self.source = source            # the file a user would re-download: the index, or the one shard

    @property
    def names(self) -> list[str]:
        return sorted(self.shard_of)

    def shards(self) -> dict[Path, list[str]]:
        """shard → its names (sorted), shards in name order."""
        out: dict[Path, list[str]] = {}
        for name in self.names:
            out.setdefault(self.shard_of[name], []).append(name)
        return dict(sorted(out.items()))


def _wanted(name: str) -> bool:
    return (name.startswith(VISION_PREFIX) or name.startswith(PROJ_PREFIX)) and name not in RECOMPUTED


def vision_tensors(mllm_dir: str | os.PathLike) -> VisionTensors:
    """The vision + projection tensors of `mllm_dir` (sharded through model.safetensors.index.json, or
    the model-*.safetensors / model.safetensors files when there is no index)."""
    from safetensors import safe_open
    folder = mllm_folder(mllm_dir)
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelFileError(f"{index} cannot be read ({e}); download the Ming snapshot's mllm/ folder "
                                 "again.") from None
        shard_of = {n: folder / f for n, f in weight_map.items() if _wanted(n)}
        source = index
    else:
        files = sorted(folder.glob("model-*.safetensors")) or sorted(folder.glob("model.safetensors"))
        if not files:
            raise ModelFileError(f"{folder} holds no model-*.safetensors; download the Ming snapshot's mllm/ "
                                 "folder.")
        shard_of = {}
        for path in files:
            with _open(path, safe_open) as f:
                shard_of.update({n: path for n in f.keys() if _wanted(n)})
        source = files[0] if len(files) == 1 else folder
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for shard in sorted(set(shard_of.values())):
        with _open(shard, safe_open) as f:
            keys = set(f.keys())
            for name in (n for n, s in shard_of.items() if s == shard):
                if name not in keys:
                    raise ModelFileError(f"{index} places {name} in {shard.name}, which does not hold it; "
                                         "download the Ming snapshot's mllm/ folder again.")
                piece = f.get_slice(name)
                shapes[name] = tuple(int(d) for d in piece.get_shape())
                dtypes[name] = str(piece.get_dtype())
    return VisionTensors(folder, shard_of, shapes, dtypes, source)


def _open(path: Path, safe_open: Any) -> Any:
    try:
        return safe_open(str(path), framework="pt")
    except FileNotFoundError:
        raise ModelFileError(f"{path} does not exist; download the Ming snapshot's mllm/ folder again.") from None
    except Exception as e:  # noqa: BLE001 — safetensors raises its own error types on a damaged header
        raise ModelFileError(f"{path} cannot be read as safetensors ({' '.join(str(e).split())}); download it "
                             "again.") from None


def tokens_per_image(grid_thw: Any, merge: int = 2) -> list[int]:
    """Merged rows per image of a grid_thw [(t, h, w), …]."""
    grid = torch.as_tensor(grid_thw, dtype=torch.long).reshape(-1, 3)
    return [int(t * h * w) // (merge * merge) for t, h, w in grid.tolist()]


def build_tower(vision_config: Mapping[str, Any], dtype: torch.dtype) -> nn.Module:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: pay for the random init
        from contextlib import nullcontext as no_init_weights
    kwargs = {k: v for k, v in vision_config.items() if k not in _DROPPED_CONFIG_KEYS}
    try:
        config = Qwen2_5_VLVisionConfig(**kwargs)
    except (TypeError, ValueError) as e:
        why = " ".join(str(e).split())
        raise ModelFileError(f"the vision_config of mllm/config.json does not make a Qwen2.5-VL vision tower ({why}); "
                             "download the Ming snapshot's mllm/ folder again.") from None
    with no_init_weights():
        return Qwen2_5_VisionTransformerPretrainedModel._from_config(config, attn_implementation="sdpa", dtype=dtype)


class MingVision(nn.Module):
    """`vision` (transformers' Qwen2.5-VL tower) + `linear_proj` (Linear, GELU, Linear): the module's
    state_dict names are the checkpoint's, verbatim."""

    def __init__(self, vision_config: Mapping[str, Any], hidden: int, gelu: str = "tanh",
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if gelu not in GELU_MODES:
            raise ValueError(f"gelu must be one of {sorted(GELU_MODES)}, not {gelu!r}")
        self.gelu = gelu
        self.vision = build_tower(vision_config, dtype)
        merger_act = self.vision.merger.mlp[1]
        if isinstance(merger_act, nn.GELU):
            self.vision.merger.mlp[1] = nn.GELU(approximate=GELU_MODES[gelu])
        cfg = self.vision.config
        self.patch_values = int(cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2)
        self.merge = int(cfg.spatial_merge_size)
        self.out_hidden, self.hidden = int(cfg.out_hidden_size), int(hidden)
        self.linear_proj = nn.Sequential(nn.Linear(self.out_hidden, hidden, dtype=dtype),
                                         nn.GELU(approximate=GELU_MODES[gelu]),
                                         nn.Linear(hidden, hidden, dtype=dtype))

    @classmethod
    def load(cls, mllm_dir: str | os.PathLike, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32, gelu: str = "tanh") -> "MingVision":
        """The encoder of a Ming snapshot (root or its mllm/ folder), weights strictly from its files,
        in `dtype` on `device`, eval mode, no gradients."""
        found = vision_tensors(mllm_dir)
        vision_config = read_vision_config(found.folder)
        if PROJ_NAMES[0] not in found.shapes:
            raise _missing(found, [PROJ_NAMES[0]])
        model = cls(vision_config, found.shapes[PROJ_NAMES[0]][0], gelu=gelu, dtype=dtype)
        state = model.state_dict()
        missing = sorted(set(state) - set(found.shard_of))
        if missing:
            raise _missing(found, missing)
        unexpected = sorted(set(found.shard_of) - set(state))
        if unexpected:
            raise ModelFileError(
                f"{found.source} holds {len(unexpected)} vision tensor(s) the Qwen2.5-VL tower of mllm/config.json "
                f"does not have (first: {unexpected[0]}); the config and the weights disagree, so download the "
                "Ming snapshot's mllm/ folder again.")
        for name, param in state.items():
            if tuple(param.shape) != found.shapes[name]:
                raise ModelFileError(
                    f"{found.shard_of[name]} stores {name} as {list(found.shapes[name])} but mllm/config.json's "
                    f"vision_config makes it {list(param.shape)}; download the Ming snapshot's mllm/ folder again.")
        from safetensors import safe_open
        with torch.no_grad():
            for shard, names in found.shards().items():          # one tensor in memory at a time
                with _open(shard, safe_open) as f:
                    for name in names:
                        state[name].copy_(f.get_tensor(name))
        return model.to(device).eval().requires_grad_(False)

    def forward(self, pixel_patches: Any, grid_thw: Any) -> torch.Tensor:
        """[Σ t·h·w, 3·2·14·14] patch rows of a batch of images + their grid_thw [(t, h, w), …] →
        unit rows [Σ t·h·w / 4, H] float32 on the model's device, the images one after another."""
        param = self.linear_proj[0].weight
        grid = torch.as_tensor(grid_thw, dtype=torch.long).reshape(-1, 3)
        x = torch.as_tensor(pixel_patches)
        n_patches = int(grid.prod(-1).sum())
        if x.ndim != 2 or x.shape[1] != self.patch_values or x.shape[0] != n_patches:
            raise ValueError(f"pixel_patches must be [{n_patches}, {self.patch_values}] for grid_thw "
                             f"{grid.tolist()}, got {list(x.shape)}")
        if bool((grid[:, 1:] % self.merge).any()):
            raise ValueError(f"every grid height and width must be a multiple of {self.merge}: {grid.tolist()}")
        out = self.vision(hidden_states=x.to(param.device, param.dtype), grid_thw=grid.to(param.device))
        merged = merged_rows(out)                                                  # [n, out_hidden]
        return l2_rows(self.linear_proj(merged).float())                            # [n, H]

    @torch.inference_mode()
    def encode(self, pixel_patches: Any, grid_thw: Any) -> torch.Tensor:
        return self.forward(pixel_patches, grid_thw)

    def encode_each(self, pixel_patches: Any, grid_thw: Any) -> list[torch.Tensor]:
        """encode, split per image."""
        return list(self.encode(pixel_patches, grid_thw).split(tokens_per_image(grid_thw, self.merge)))


def merged_rows(out: Any) -> torch.Tensor:
    """The merger's rows from whatever the tower returned: transformers 5 gives a ModelOutput with
    `pooler_output`, 4.x the tensor itself."""
    if isinstance(out, torch.Tensor):
        return out
    pooled = getattr(out, "pooler_output", None)
    return pooled if pooled is not None else out[1]


def _missing(found: VisionTensors, names: Sequence[str]) -> ModelFileError:
    return ModelFileError(f"{found.source} lacks {len(names)} vision tensor(s) the Ming encoder needs (first: "
                          f"{names[0]}); download the Ming snapshot's mllm/ folder again.")
