"""The Ming-Image thinker: Ling-mini-2.0 (Bailing-MoE-V2), forward only, in plain torch.

transformers has no Bailing-MoE-V2 class, so this is a port built from the facts of
packs-contract-more §D.1 2 and checked against the engine (ming_image_te.hpp):

* **Layer.** Pre-RMSNorm; fused `query_key_value` (no bias) split into heads / kv_heads /
  kv_heads (GQA); per-head RMSNorm `q_norm`, `k_norm` *before* the rope; scale 1/sqrt(head_dim);
  softmax in float32 under a causal + right-padding key mask; `dense` (no bias). Layers below
  `first_k_dense_replace` have a dense SiLU-gated MLP, the others the MoE below.
* **MoE.** scores = sigmoid(router logits) in float32; the choice adds `expert_bias`; a group
  scores the sum of its two best choices, the `topk_group` best groups stay, the top
  `num_experts_per_tok` experts among them are taken; their weights are the *un-biased* scores,
  normalized (+1e-20; the engine does so even for top-1) and × `routed_scaling_factor`.
  `<imagePatch>` rows (the input image and the query bank) route through `image_gate` instead
  of `gate`. A shared SiLU MLP (moe_intermediate × num_shared_experts wide) is added to every
  row. Each expert runs once over the rows routed to it; pad rows skip the experts.
* **Video rope.** Positions are [3, L] (t, h, w, see `video_positions`). The first rope_dim =
  head_dim × partial_rotary_factor channels of each head rotate NEOX-style; of their rope_dim/2
  frequencies the first 24 alternate h (even) / w (odd) and the rest take t. 24 is the engine's
  constant (Ming's mrope_section [8, 12, 12] → 12 + 12), not derived from rope_dim: a head with
  fewer than 24 frequencies is all spatial.
* **Taps.** hidden_states[i] is the input of layer i; hidden_states[num_hidden_layers] is the
  final-norm output.

Weights load strictly from `mllm/` (`model.model.*`; the tower, linear_proj and the LM head are
other parts and are skipped); the config comes from `mllm/config.json`'s `llm_config`.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trainer_core.base.errors import ModelFileError

__all__ = ["LingConfig", "LingThinker", "LingMoE", "VIDEO_ROPE_SPATIAL_FREQS", "THINKER_PREFIX", "REPO",
           "read_ling_config", "video_positions", "rope_tables", "route_experts", "load_thinker",
           "safetensors_files", "read_tensors", "load_strict"]

REPO = "inclusionAI/Ming-Image-0.1-Design"
THINKER_PREFIX = "model.model."
VIDEO_ROPE_SPATIAL_FREQS = 24
GROUP_SCORE_TOP = 2                 # a group's score is the sum of its two best choices


@dataclass(frozen=True)
class LingConfig:
    """`llm_config` of mllm/config.json: every field is required there."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    partial_rotary_factor: float
    rms_norm_eps: float
    first_k_dense_replace: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    num_shared_experts: int
    vocab_size: int
    num_hidden_layers: int
    rope_theta: float

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def problems(self) -> list[str]:
        """What makes this shape unusable, one phrase each."""
        out = []
        if self.num_attention_heads % self.num_key_value_heads:
            out.append("num_attention_heads is not a multiple of num_key_value_heads")
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            out.append(f"head_dim × partial_rotary_factor ({self.head_dim * self.partial_rotary_factor}) is not an "
                       f"even width within head_dim")
        if self.num_experts % self.n_group or self.num_experts // self.n_group < GROUP_SCORE_TOP:
            out.append(f"num_experts ({self.num_experts}) does not split into n_group ({self.n_group}) groups of "
                       f"at least {GROUP_SCORE_TOP}")
        elif not 0 < self.topk_group <= self.n_group or (
                self.num_experts_per_tok > self.topk_group * (self.num_experts // self.n_group)):
            out.append("topk_group / num_experts_per_tok do not fit n_group")
        if self.first_k_dense_replace > self.num_hidden_layers:
            out.append("first_k_dense_replace exceeds num_hidden_layers")
        return out


_MAY_BE_ZERO = ("first_k_dense_replace", "num_shared_experts")


def _number(value: object, kind: type, may_be_zero: bool) -> int | float | None:
    """`value` as a positive (or zero) number of `kind`, None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if (kind is int and value != int(value)) or value < 0 or (value == 0 and not may_be_zero):
        return None
    return kind(value)


def read_ling_config(mllm: str | os.PathLike) -> LingConfig:
    """The thinker's config from `<mllm>/config.json`; one ModelFileError lists every missing or bad key."""
    path = Path(mllm) / "config.json"
    try:
        llm = json.loads(path.read_text(encoding="utf-8")).get("llm_config")
    except FileNotFoundError:
        raise ModelFileError(f"The Ming config {path} is missing; download {REPO} again.") from None
    except (OSError, ValueError, AttributeError) as e:
        raise ModelFileError(f"The Ming config {path} cannot be read ({e}); download {REPO} again.") from None
    if not isinstance(llm, dict):
        raise ModelFileError(f"The Ming config {path} has no llm_config object; download {REPO} again.")
    values, bad = {}, []
    for f in fields(LingConfig):
        v = _number(llm.get(f.name), int if f.type == "int" else float, f.name in _MAY_BE_ZERO)
        if v is None:
            bad.append(f.name)
        else:
            values[f.name] = v
    problems = [f"llm_config.{n} is missing or not a valid number" for n in bad]
    if not problems:
        problems = LingConfig(**values).problems()
    if problems:
        raise ModelFileError(f"The Ming config {path} cannot be used ({'; '.join(problems)}); download {REPO} "
                             "again.")
    return LingConfig(**values)


# ---------------------------------------------------------------- positions and rope

def video_positions(length: int, blocks: Sequence[tuple[int, int, int]], padded_length: int | None = None
                    ) -> torch.Tensor:
    """[3, padded_length] int64 (t, h, w) for a sequence of `length` rows whose image blocks are
    (start, grid_h, grid_w), raster order. Text advances all three axes; a block takes one t (the
    position after the text before it) with h = t + r − (gh−1)//2, w = t + c − (gw−1)//2; the text
    after it resumes at t + 1. Rows past `length` (padding) get 1."""
    padded_length = length if padded_length is None else padded_length
    pos = torch.ones(3, padded_length, dtype=torch.long)
    token = next_pos = 0
    for start, gh, gw in sorted(blocks):
        if start < token or start + gh * gw > length or gh < 1 or gw < 1:
            raise ValueError(f"image block {(start, gh, gw)} overlaps another or leaves the {length} rows")
        pos[:, token:start] = torch.arange(next_pos, next_pos + start - token)
        t = next_pos + start - token
        r, c = torch.arange(gh).repeat_interleave(gw), torch.arange(gw).repeat(gh)
        pos[:, start:start + gh * gw] = torch.stack([torch.full_like(r, t), t + r - (gh - 1) // 2,
                                                     t + c - (gw - 1) // 2])
        token, next_pos = start + gh * gw, t + 1
    pos[:, token:length] = torch.arange(next_pos, next_pos + length - token)
    return pos


def rope_tables(positions: torch.Tensor, config: LingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [B, L, rope_dim/2] float32, for positions [3, B, L]: frequency j takes the
    h axis (even j) or the w axis (odd j) below VIDEO_ROPE_SPATIAL_FREQS, the t axis above."""
    half = config.rope_dim // 2
    j = torch.arange(half)
    inv_freq = 1.0 / config.rope_theta ** (2 * j.double() / config.rope_dim)                  # [half]
    axis = torch.where(j < VIDEO_ROPE_SPATIAL_FREQS, torch.where(j % 2 == 0, 1, 2), 0)          # 0 t, 1 h, 2 w
    angle = positions[axis].permute(1, 2, 0).double() * inv_freq.to(positions.device)          # [B, L, half]
    return angle.cos().float(), angle.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX rotation of the first 2·half channels of x [B, heads, L, d]; cos/sin [B, 1, L, half]."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


# ---------------------------------------------------------------- modules

class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class _GatedMLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Attention(nn.Module):
    def __init__(self, c: LingConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.query_key_value = nn.Linear(c.hidden_size, (self.heads + 2 * self.kv_heads) * c.head_dim, bias=False)
        self.dense = nn.Linear(self.heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = _RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = _RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.query_key_value(x).view(b, n, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)                # [B, L, h, d]
        q = _rotate(self.q_norm(q).transpose(1, 2), cos, sin)                                  # [B, H, L, d]
        k = _rotate(self.k_norm(k).transpose(1, 2), cos, sin)                                  # [B, KV, L, d]
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.transpose(1, 2).repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(self.head_dim) + mask            # [B, H, L, L]
        out = scores.softmax(-1).to(v.dtype) @ v                                                # [B, H, L, d]
        return self.dense(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class _Router(nn.Module):
    def __init__(self, hidden: int, experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(experts, hidden))
        self.register_buffer("expert_bias", torch.zeros(experts))


def route_experts(scores: torch.Tensor, bias: torch.Tensor, c: LingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [N, k], weights [N, k] float32) from the sigmoid scores [N, E] and the per-row
    expert bias [N, E] or [E] (group-limited top-k on scores + bias, weights from the scores)."""
    n, experts = scores.shape
    choice = scores + bias
    group_score = choice.view(n, c.n_group, -1).topk(GROUP_SCORE_TOP, dim=-1).values.sum(-1)   # [N, G]
    kept = torch.zeros_like(group_score, dtype=torch.bool)
    kept.scatter_(1, group_score.topk(c.topk_group, dim=-1).indices, True)
    masked = choice.masked_fill(~kept.repeat_interleave(experts // c.n_group, dim=1), float("-inf"))
    ids = masked.topk(c.num_experts_per_tok, dim=-1).indices
    weights = scores.gather(1, ids)
    return ids, weights / (weights.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor


class LingMoE(nn.Module):
    """The sparse MLP: routed experts (text rows via `gate`, image rows via `image_gate`) + shared."""

    def __init__(self, c: LingConfig):
        super().__init__()
        self.config = c
        self.experts = nn.ModuleList(_GatedMLP(c.hidden_size, c.moe_intermediate_size) for _ in range(c.num_experts))
        self.gate = _Router(c.hidden_size, c.num_experts)
        self.image_gate = _Router(c.hidden_size, c.num_experts)
        if c.num_shared_experts > 0:
            self.shared_experts = _GatedMLP(c.hidden_size, c.moe_intermediate_size * c.num_shared_experts)

    def forward(self, x: torch.Tensor, image_rows: torch.Tensor) -> torch.Tensor:
        """x [N, H], image_rows [N] bool → [N, H]; each expert runs once on the rows routed to it."""
        x32 = x.float()
        logits = torch.where(image_rows[:, None], x32 @ self.image_gate.weight.float().T,
                             x32 @ self.gate.weight.float().T)                                  # [N, E]
        bias = torch.where(image_rows[:, None], self.image_gate.expert_bias.float(), self.gate.expert_bias.float())
        ids, weights = route_experts(torch.sigmoid(logits), bias, self.config)                # [N, k]
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)
        rows = order // ids.shape[1]
        out = torch.zeros_like(x32)
        start = 0
        for expert, count in enumerate(torch.bincount(flat, minlength=len(self.experts)).tolist()):
            if count:
                part, row = order[start:start + count], rows[start:start + count]
                y = self.experts[expert](x[row]).float() * weights.reshape(-1)[part, None]
                out.index_add_(0, row, y)
                start += count
        out = out.to(x.dtype)
        return out + self.shared_experts(x) if hasattr(self, "shared_experts") else out


class _Layer(nn.Module):
    def __init__(self, c: LingConfig, index: int):
        super().__init__()
        self.dense_mlp = index < c.first_k_dense_replace
        self.attention = _Attention(c)
        self.input_layernorm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _GatedMLP(c.hidden_size, c.intermediate_size) if self.dense_mlp else LingMoE(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                image_rows: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        if self.dense_mlp:
            return x + self.mlp(h)
        out = torch.zeros_like(h)
        out[keep] = self.mlp(h[keep], image_rows[keep])            # pad rows skip the experts
        return x + out


class LingThinker(nn.Module):
    """The Bailing-MoE-V2 stack; its state_dict names are the checkpoint's minus THINKER_PREFIX."""

    def __init__(self, config: LingConfig):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(_Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids.to(self.word_embeddings.weight.device))

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, image_rows: torch.Tensor,
                taps: Sequence[int]) -> list[torch.Tensor]:
        """embeds [B, L, H], positions [3, B, L] or [3, L], keep [B, L] (True = a real row, right
        padding), image_rows [B, L] (True = an <imagePatch> row) → hidden_states[i] [B, L, H] per
        tap i (0 … num_hidden_layers, see the module docstring)."""
        n_layers = len(self.layers)
        if any(not 0 <= t <= n_layers for t in taps):
            raise ValueError(f"taps {list(taps)} must lie in 0 … {n_layers}")
        b, n, _ = embeds.shape
        device = embeds.device
        positions = positions.to(device)
        positions = positions[:, None].expand(3, b, n) if positions.dim() == 2 else positions
        cos, sin = (t.to(embeds.dtype)[:, None] for t in rope_tables(positions, self.config))      # [B, 1, L, half]
        keep, image_rows = keep.to(device, torch.bool), image_rows.to(device, torch.bool)
        allowed = torch.ones(n, n, dtype=torch.bool, device=device).tril() & keep[:, None, :]      # [B, L, L]
        mask = torch.zeros(b, 1, n, n, device=device).masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
        wanted, captured = set(taps), {}
        x = embeds
        for i, layer in enumerate(self.layers):
            if i in wanted:
                captured[i] = x
            x = layer(x, cos, sin, mask, image_rows, keep)
        captured[n_layers] = self.norm(x)
        return [captured[t] for t in taps]


# ---------------------------------------------------------------- loading

def safetensors_files(folder: Path, what: str) -> list[Path]:
    """The shards of a safetensors checkpoint: those of model.safetensors.index.json, else the
    model*.safetensors files."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelFileError(f"The {what} index {index} cannot be read ({e}); download {REPO} again.") from None
        files = [folder / name for name in names]
    else:
        files = sorted(folder.glob("model*.safetensors"))
    missing = [f.name for f in files if not f.is_file()]
    if missing or not files:
        raise ModelFileError(f"The {what} weights in {folder} are missing ({', '.join(missing) or 'no safetensors'}); "
                             f"download {REPO} again.")
    return files


def read_tensors(files: Sequence[Path], wanted: Callable[[str], bool], cast: Callable[[str], torch.dtype],
                 rename: Callable[[str], str] = lambda k: k) -> dict[str, torch.Tensor]:
    """The tensors whose checkpoint name passes `wanted`, renamed, each cast to cast(its new name)."""
    from safetensors import SafetensorError, safe_open
    out = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    if wanted(key):
                        name = rename(key)
                        out[name] = f.get_tensor(key).to(cast(name))
        except (SafetensorError, OSError) as e:
            raise ModelFileError(f"The weights file {path} cannot be read ({e}); download {REPO} again.") from None
    return out


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], where: Path, what: str, prefix: str = ""
                ) -> nn.Module:
    """Assign every tensor of `state` to `module` (built on the meta device): a missing, unexpected
    or misshapen key raises one ModelFileError naming the first few (with `prefix`, as in the file)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{prefix}{k} {list(state[k].shape)} (expected {list(own[k].shape)})"
              for k in sorted(set(own) & set(state)) if state[k].shape != own[k].shape]

    def first(keys: list[str]) -> str:
        more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
        return ", ".join(prefix + k for k in keys[:4]) + more
    parts = [f"missing {first(missing)}" if missing else "", f"unexpected {first(unexpected)}" if unexpected else "",
             f"wrong shape {', '.join(shapes[:3])}" if shapes else ""]
    if any(parts):
        raise ModelFileError(f"The {what} weights in {where} do not match their config "
                             f"({'; '.join(p for p in parts if p)}); download {REPO} again.")
    module.load_state_dict(state, strict=True, assign=True)
    return module


def load_thinker(mllm: str | os.PathLike, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
                 ) -> LingThinker:
    """The thinker from `<mllm>/config.json` + its safetensors, in `dtype` (the expert biases stay
    float32), on `device`, in eval mode without gradients."""
    mllm = Path(mllm)
    config = read_ling_config(mllm)
    with torch.device("meta"):
        thinker = LingThinker(config)
    state = read_tensors(safetensors_files(mllm, "Ming thinker"), lambda k: k.startswith(THINKER_PREFIX),
                         lambda k: torch.float32 if k.endswith("expert_bias") else dtype,
                         lambda k: k[len(THINKER_PREFIX):])
    load_strict(thinker, state, mllm, "Ming thinker", THINKER_PREFIX)
    return thinker.to(device).eval().requires_grad_(False)
