"""The engine-only `vis_bridge.*` of a Ming adapter GGUF: a stock llama.cpp Qwen2.5-VL mmproj's rows
mapped onto the Ling vision rows the adapter was trained on (ggk 0.9.7, the engine's Ming text encoder
`MingVisionBridge`, conditioner.hpp `MingImageAdapterEmbedder`). This module is the forward the
engine runs; the Ming pack fits it (its bridge_fit.py) and its export writes it.

**When ggk uses it.** On a Ming-Image(-Layer) DiT with a Ming adapter (`cap_query`) as
`--llm-adapter`, a reference image, and a `--llm_vision` file that is *not* a Ling tower:
gk-diffuser.cpp loads a llama.cpp mmproj (`v.blk.*` + `mm.*`) under `text_encoders.llm.visual.`
(renamed to `blocks.N.attn.{q,k,v}_proj`, `merger.*`, `patch_embed.proj.{0,1}`); per the engine's
comment an HF-named tower (`attn.qkv`, one 5-D patch embed) that lands under `….visual.` is read
the same way.
`MingImageVisionRunner::detect` takes the Ling tower when there is one (pig_ming_vision); else a
Qwen2.5-VL mmproj under `….visual.` plus a bridge whose in_dim equals the mmproj's merger width
and whose out_dim equals the adapter's vis_dim (`vis_in` ne[0]). An mmproj without a matching
bridge is "unbridged": the load logs an error and every edit returns no condition.

**Where the tensors are.** In the adapter GGUF, next to `adapter.*`, *without* the `adapter.`
prefix: the adapter file is loaded under `text_encoders.llm_adapter.` and the bridge prefix is
`text_encoders.llm_adapter.vis_bridge`. Names (torch shape → ne = reversed; W = width):

    vis_bridge.inp.{weight,bias}                    [W, in_dim] / [W]     in_dim = ne[0], W = ne[1]
    vis_bridge.blocks.N.ln_self.{weight,bias}       [W]                   LayerNorm, eps 1e-5
    vis_bridge.blocks.N.self_attn.{q,k,v,o}.{weight,bias}  [W, W] / [W]
    vis_bridge.blocks.N.ln_mlp.{weight,bias}        [W]
    vis_bridge.blocks.N.mlp.0.{weight,bias}         [mlp, W] / [mlp]      mlp = blocks.0.mlp.0 ne[1]
    vis_bridge.blocks.N.mlp.2.{weight,bias}         [W, mlp] / [W]
    vis_bridge.ln_out.{weight,bias}                 [W]
    vis_bridge.out.{weight,bias}                    [out_dim, W] / [out_dim]   out_dim = ne[1]

Detection needs `inp.weight` and `out.weight`; depth = the largest block index + 1 (0 blocks is
allowed); heads = W / 64 (LLMAdapter::HEAD_DIM); it refuses W % 4 ≠ 0 or W < 64. Every Linear and
LayerNorm has a bias the loader requires. Weights may be F16/F32 (a Linear keeps a quantized
weight only when ne[0] is a multiple of its block); biases and norms are read as F32. The name
conversion the engine applies to `…llm…` names touches none of these.

**TokenBlock** (llm_adapter.hpp, no mask here): x += o(attn(q, k, v of ln_self(x))) with
softmax(q·kᵀ/√64) per head; x += mlp.2(gelu_erf(mlp.0(ln_mlp(x)))) — the exact GELU.

**Forward** (one image at a time, no padding, no mask):

    h   = inp(x) + pos2d(grid_h, grid_w, W)       x [V, in_dim], V = grid_h·grid_w
    h   = TokenBlock(h) × depth
    out = l2(out(ln_out(h)))                      l2 = x / sqrt(max(Σx², 1e-12))

x is the mmproj tower's merger output as the engine computes it: rows in raster order of the
merged grid (row-major over grid_h = H/28 rows, grid_w = W/28 columns of the preprocessed
image, the window permutation undone), the same order as the Ling rows and the `<imagePatch>`
slots. The image is preprocessed the Ming way (vision.py / template.py: ~451584 px on the 28-px
grid, CLIP mean/std), not the mmproj's own way.

**pos2d** (fixed): n = W/4, w_i = exp(−ln(10000)·i/n) in double; row (y, x) of the code =
[sin(y·w_i) | cos(y·w_i) | sin(x·w_i) | cos(x·w_i)], each block n wide, rounded to float32.

**in_dim 3584** (the engine's default and its log text) is the merger width of Qwen2.5-VL-7B
(its LLM hidden size; tower mlp 3420): the bridge expects `mmproj-Qwen2.5-VL-7B-Instruct-*.gguf`.
The 3B tower's rows are 2048 wide, 32B 5120, 72B 8192; a bridge is tied to one of them by in_dim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import nn
from torch.nn import functional as F


__all__ = ["PREFIX", "HEAD_DIM", "NORM_EPS", "STOCK_MMPROJ_DIM", "BridgeConfig", "pos2d", "TokenBlock",
           "VisBridge", "detect_bridge", "bridge_tensors"]

PREFIX = "vis_bridge."           # in the adapter GGUF (the engine: text_encoders.llm_adapter.vis_bridge)
HEAD_DIM = 64                    # LLMAdapter::HEAD_DIM: heads = width / 64
NORM_EPS = 1e-5
STOCK_MMPROJ_DIM = 3584          # Qwen2.5-VL-7B's merger width, the engine's default in_dim
L2_EPS = 1e-12                   # ggml_l2_norm's eps, as the Ming vision encoder's


def l2_rows(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """Each row over the root of max(its sum of squares, eps): the engine's ggml_l2_norm."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True).clamp_min(eps))


@dataclass(frozen=True)
class BridgeConfig:
    in_dim: int = STOCK_MMPROJ_DIM
    out_dim: int = 2048
    width: int = 1024
    depth: int = 2
    mlp_hidden: int = 4096

    @property
    def heads(self) -> int:
        return self.width // HEAD_DIM


def pos2d(grid_h: int, grid_w: int, width: int) -> torch.Tensor:
    """The engine's fixed 2-D position code [grid_h·grid_w, width] float32, rows in raster order."""
    if width % 4:
        raise ValueError(f"the bridge width must be a multiple of 4, got {width}")
    n = width // 4
    freq = torch.exp(-math.log(10000.0) * torch.arange(n, dtype=torch.float64) / n)           # [n]
    y = torch.arange(grid_h, dtype=torch.float64).repeat_interleave(grid_w)[:, None] * freq   # [V, n]
    x = torch.arange(grid_w, dtype=torch.float64).repeat(grid_h)[:, None] * freq              # [V, n]
    return torch.cat([y.sin(), y.cos(), x.sin(), x.cos()], dim=-1).to(torch.float32)          # [V, width]


class _SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:                       # x [B, V, W]
        b, v, w = x.shape
        q, k, val = (p(x).view(b, v, self.heads, w // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, val)                           # [B, heads, V, W/heads]
        return self.o(out.transpose(1, 2).reshape(b, v, w))


class TokenBlock(nn.Module):
    """LLMAdapter::TokenBlock: pre-LN self attention + exact-GELU MLP, both residual."""

    def __init__(self, width: int, heads: int, mlp_hidden: int, eps: float = NORM_EPS):
        super().__init__()
        self.ln_self = nn.LayerNorm(width, eps=eps)
        self.self_attn = _SelfAttention(width, heads)
        self.ln_mlp = nn.LayerNorm(width, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.ln_self(x))
        return x + self.mlp(self.ln_mlp(x))


class VisBridge(nn.Module):
    """The engine's MingVisionBridge; state_dict names are the GGUF names without `vis_bridge.`."""

    def __init__(self, config: BridgeConfig):
        super().__init__()
        if config.width % HEAD_DIM or config.width < HEAD_DIM:
            raise ValueError(f"the bridge width must be a positive multiple of {HEAD_DIM}, got {config.width}")
        self.config = config
        self.inp = nn.Linear(config.in_dim, config.width)
        self.blocks = nn.ModuleList(TokenBlock(config.width, config.heads, config.mlp_hidden)
                                    for _ in range(config.depth))
        self.ln_out = nn.LayerNorm(config.width, eps=NORM_EPS)
        self.out = nn.Linear(config.width, config.out_dim)

    def forward(self, x: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
        """mmproj rows [V, in_dim] (or [B, V, in_dim], every image of the same grid) → unit rows
        [V, out_dim] (or [B, V, out_dim])."""
        single = x.ndim == 2
        h = x[None] if single else x                                              # [B, V, in_dim]
        if h.shape[1] != grid_h * grid_w:
            raise ValueError(f"{h.shape[1]} rows do not fill a {grid_h}×{grid_w} grid")
        pe = pos2d(grid_h, grid_w, self.config.width).to(h.device, self.inp.weight.dtype)
        h = self.inp(h.to(self.inp.weight.dtype)) + pe                            # [B, V, W]
        for block in self.blocks:
            h = block(h)
        out = l2_rows(self.out(self.ln_out(h)), L2_EPS)                           # [B, V, out_dim]
        return out[0] if single else out


def detect_bridge(ne: Mapping[str, tuple[int, ...]], prefix: str = PREFIX) -> BridgeConfig | None:
    """MingVisionBridgeConfig::detect over {name: ne} of an adapter GGUF: the config the engine would
    build, or None when it would find no bridge."""
    inp, out = ne.get(prefix + "inp.weight"), ne.get(prefix + "out.weight")
    if inp is None or out is None:
        return None
    depth, mlp_hidden = 0, 4096
    for name, shape in ne.items():
        if not name.startswith(prefix + "blocks."):
            continue
        head = name[len(prefix) + 7:].split(".", 1)[0]
        depth = max(depth, int(head) + 1 if head.isdigit() else 1)
        if name == prefix + "blocks.0.mlp.0.weight":
            mlp_hidden = shape[1]
    width = inp[1]
    if width % 4 or width // HEAD_DIM <= 0:
        return None
    return BridgeConfig(in_dim=inp[0], out_dim=out[1], width=width, depth=depth, mlp_hidden=mlp_hidden)


def bridge_tensors(model: VisBridge) -> dict[str, torch.Tensor]:
    """The adapter-GGUF tensors of a bridge: `vis_bridge.` + state_dict name, f32 (write 2-D ones as
    F16 and 1-D ones as F32, the adapter's layout rule)."""
    return {PREFIX + name: t.detach().to(torch.float32).cpu() for name, t in model.state_dict().items()}
