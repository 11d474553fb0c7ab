"""An independent numpy reading of every adapter GGUF the engine runs (engine-contract §0–§4, packs-contract-more
§D.1–D.3), batch 1, no mask, float64 — what the conformance suite holds `gguf-trainer infer` to.

Written from the contract, not from trainer_core: the tensors come straight from gguf.GGUFReader (F16/F32 as
stored, torch order = reversed ne), every size from a tensor shape; the runner is picked from the tensors as the
engine picks it (`engine_forward`): `cap_query` Ming, `slot_query` the Qwen3.5 bridge, `query` a resampler
(seeded with `t5_embed` when the file has it), else token-aligned (with `layer_map` the layerwise variant):

    token-aligned  x = in_proj(h); per block: x += o(attn(ln_self(x))) (bidirectional); x += mlp.2(gelu_erf(mlp.0(
                   ln_mlp(x)))); out = out_proj(ln_out(x)) (+ skip(h) when the file has skip)
    resampler      q = query (+ t5_embed[t5_ids]); per block: self-attention, cross-attention to in_proj(h), MLP
                   (resampler_blocks); out = out_proj(ln_out(q))

The bridge:

    kv     = [in_proj(h) ; vis_in(v_1 … v_V)]                   (vis_in, vis_q, seed_proj, bank_in: no bias)
    q_slot = slot_query[0:P] + seed_proj(seed_embed[id]) + vis_q(vis_slot)
    q_bank = bank_query (+ bank_in(bank_hidden) on FLUX.3 when bank_in exists)
    q      = [q_bank ; q_slot]; per block: q += o(attn(ln_self(q))); q += cross(ln_q(q), ln_kv(kv));
             q += mlp.2(gelu_erf(mlp.0(ln_mlp(q))))
    bank   = out_bank(ln_out(q)[:n_bank]); slots = out_proj(ln_out(q)[n_bank:])

The bank exists only when both bank_query and out_bank.weight do. head_dim 64, scale 1/8, LayerNorm
eps 1e-5. FLUX.3's bank input: row 3 + i = student row i, zeros elsewhere; the DiT receives the first
min(n_bank, ceil80(3 + n_body + 5)) rows of a prompt-aligned bank, all of a caption bank.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

LN_EPS = 1e-5
HEAD_DIM = 64
PREFIX = "adapter."


def gguf_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """name (without "adapter.") → float64 array in torch order, straight from gguf.GGUFReader."""
    import gguf
    reader = gguf.GGUFReader(str(path), "r")
    out = {}
    for t in reader.tensors:
        assert t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16), t.name
        shape = tuple(int(n) for n in reversed(list(t.shape)))
        out[t.name[len(PREFIX):] if t.name.startswith(PREFIX) else t.name] = (
            np.asarray(t.data, dtype=np.float64).reshape(shape).copy())
    return out


def _linear(w: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    y = x @ w[f"{name}.weight"].T
    return y + w[f"{name}.bias"] if f"{name}.bias" in w else y


def _layer_norm(w: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * w[f"{name}.weight"] + w[f"{name}.bias"]


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _attention(w: dict[str, np.ndarray], name: str, x: np.ndarray, kv: np.ndarray) -> np.ndarray:
    heads = x.shape[1] // HEAD_DIM
    q = _linear(w, f"{name}.q", x).reshape(len(x), heads, HEAD_DIM).transpose(1, 0, 2)     # [H, Lq, 64]
    k = _linear(w, f"{name}.k", kv).reshape(len(kv), heads, HEAD_DIM).transpose(1, 0, 2)   # [H, Lk, 64]
    v = _linear(w, f"{name}.v", kv).reshape(len(kv), heads, HEAD_DIM).transpose(1, 0, 2)
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(HEAD_DIM)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return _linear(w, f"{name}.o", (p @ v).transpose(1, 0, 2).reshape(len(x), -1))


def has_bank(w: dict[str, np.ndarray]) -> bool:
    return "bank_query" in w and "out_bank.weight" in w


def engine_bank_hidden(w: dict[str, np.ndarray], h: np.ndarray) -> np.ndarray:
    """FLUX.3's bank input for the student rows h of the raw prompt: row 3 + i = h[i], zeros elsewhere."""
    n_bank = w["bank_query"].shape[0]
    out = np.zeros((n_bank, h.shape[1]))
    for i, row in enumerate(h):
        if 3 + i < n_bank:
            out[3 + i] = row
    return out


def engine_bank_rows(w: dict[str, np.ndarray], n_body: int) -> int:
    """The bank rows FLUX.3's DiT receives."""
    n_bank = w["bank_query"].shape[0]
    if "bank_in.weight" not in w:
        return n_bank
    n_real = 3 + n_body + 5
    return min(n_bank, math.ceil(n_real / 80) * 80)


def bridge_forward(w: dict[str, np.ndarray], h: np.ndarray, seed_ids: list[int], vis: np.ndarray | None = None,
                   vis_pos: list[tuple[int, int]] = (), bank_hidden: np.ndarray | None = None
                   ) -> tuple[np.ndarray | None, np.ndarray]:
    """(bank rows [n_bank, bank_dim] or None, slot rows [P, out_dim]) with the file's tensors `w`.
    `vis` holds every reference's raw rows in image order; `vis_pos` the (first slot, count) of each run."""
    h = np.asarray(h, dtype=np.float64)
    P = len(seed_ids)
    kv = _linear(w, "in_proj", h)
    q = w["slot_query"][:P] + _linear(w, "seed_proj", w["seed_embed.weight"][np.asarray(seed_ids)])
    if vis is not None:
        vis = np.asarray(vis, dtype=np.float64)
        kv = np.concatenate([kv, _linear(w, "vis_in", vis)])
        vis_slot = np.zeros((P, vis.shape[1]))
        row = 0
        for start, count in vis_pos:
            vis_slot[start:start + count] = vis[row:row + count]
            row += count
        q = q + _linear(w, "vis_q", vis_slot)
    n_bank = w["bank_query"].shape[0] if has_bank(w) else 0
    if n_bank:
        bank = w["bank_query"].copy()
        if bank_hidden is not None:
            bank = bank + _linear(w, "bank_in", bank_hidden)
        q = np.concatenate([bank, q])
    q = resampler_blocks(w, q, kv)
    return (_linear(w, "out_bank", q[:n_bank]) if n_bank else None), _linear(w, "out_proj", q[n_bank:])


def resampler_blocks(w: dict[str, np.ndarray], q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """The file's resampler blocks over the queries q (self-attention, cross-attention to kv, erf-GELU
    MLP, each pre-LN with a residual), then ln_out."""
    depth = 1 + max(int(m.group(1)) for n in w if (m := re.match(r"^blocks\.(\d+)\.", n)))
    for i in range(depth):
        b = f"blocks.{i}"
        x = _layer_norm(w, f"{b}.ln_self", q)
        q = q + _attention(w, f"{b}.self_attn", x, x)
        q = q + _attention(w, f"{b}.cross_attn", _layer_norm(w, f"{b}.ln_q", q), _layer_norm(w, f"{b}.ln_kv", kv))
        y = _linear(w, f"{b}.mlp.0", _layer_norm(w, f"{b}.ln_mlp", q))
        q = q + _linear(w, f"{b}.mlp.2", 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0))))
    return _layer_norm(w, "ln_out", q)


def token_aligned_forward(w: dict[str, np.ndarray], h: np.ndarray) -> np.ndarray:
    """[L, in_dim] student rows → [L, out_dim] (the layerwise stack too) with the file's tensors `w`."""
    h = np.asarray(h, dtype=np.float64)
    depth = 1 + max(int(m.group(1)) for n in w if (m := re.match(r"^blocks\.(\d+)\.", n)))
    x = _linear(w, "in_proj", h)
    for i in range(depth):
        b = f"blocks.{i}"
        y = _layer_norm(w, f"{b}.ln_self", x)
        x = x + _attention(w, f"{b}.self_attn", y, y)
        y = _linear(w, f"{b}.mlp.0", _layer_norm(w, f"{b}.ln_mlp", x))
        x = x + _linear(w, f"{b}.mlp.2", 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0))))
    out = _linear(w, "out_proj", _layer_norm(w, "ln_out", x))
    return out + _linear(w, "skip", h) if "skip.weight" in w else out


def resampler_forward(w: dict[str, np.ndarray], h: np.ndarray, t5_ids: list[int] | None = None) -> np.ndarray:
    """[NQ, out_dim]: the learned queries (seeded with t5_embed[t5_ids] when the file has a seed table) read the
    student rows."""
    q = w["query"].copy()
    if "t5_embed.weight" in w:
        q = q + w["t5_embed.weight"][np.asarray(t5_ids)]
    return _linear(w, "out_proj", resampler_blocks(w, q, _linear(w, "in_proj", np.asarray(h, np.float64))))


def engine_forward(w: dict[str, np.ndarray], h: np.ndarray, seed_ids: list[int] | None = None,
                   t5_ids: list[int] | None = None, bank: bool = False) -> np.ndarray:
    """The rows the engine's runner for this file gives a text prompt (no image): picked from the tensors as the
    engine picks it; `bank` asks a bridge for its bank head (FLUX.3's, fed the prompt-aligned rows)."""
    if "cap_query" in w:
        return ming_forward(w, h, seed_ids)
    if "slot_query" in w:
        bank_rows, slots = bridge_forward(w, h, seed_ids, bank_hidden=engine_bank_hidden(w, h) if bank else None)
        return bank_rows if bank else slots
    if "query" in w:
        return resampler_forward(w, h, t5_ids)
    return token_aligned_forward(w, h)


def ming_forward(w, h, seed_ids, vis=None, image_start=-1):
    """The engine's MingAdapter::forward, batch 1, no masks, float64: [pad(cap) ; dir] [n_cap + P, out_dim]."""
    P = len(seed_ids)
    kv = _linear(w, "in_proj", np.asarray(h, np.float64))
    q_slot = w["slot_query"][:P] + _linear(w, "seed_proj", w["seed_embed.weight"][np.asarray(seed_ids)])
    if vis is not None:
        vis = np.asarray(vis, np.float64)
        kv = np.concatenate([kv, _linear(w, "vis_in", vis)])
        vis_slot = np.zeros((P, vis.shape[1]))
        vis_slot[image_start:image_start + len(vis)] = vis
        q_slot = q_slot + _linear(w, "vis_q", vis_slot)
    q = resampler_blocks(w, np.concatenate([w["cap_query"], q_slot]), kv)
    n_cap = w["cap_query"].shape[0]
    cap = _linear(w, "out_cap", q[:n_cap])
    out_dim = w["out_proj.weight"].shape[0]
    cap = np.concatenate([cap, np.zeros((n_cap, out_dim - cap.shape[1]))], 1)
    return np.concatenate([cap, _linear(w, "out_proj", q[n_cap:])])
