"""The adapter networks, exactly as the ggk engine runs them (engine-contract §0.1–§4): pure torch
modules with no knowledge of which kind uses them: each takes its sizes and options as arguments, and
the kind that uses it (contract/kinds/) builds it from its config's fields:

    Resampler     learned queries cross-attend to the student states (seeded: each query plus the
                  embedding of its slot's id)
    TokenAligned  position i → position i, a skip path, and the vision bridge (frozen vision_proj for
                  the engine, trained vis_in)
    Layerwise     position i → the teacher's stack of tapped layers at row i (n_taps × layer_dim), a skip
                  path; `layer_map` (the tap numbers, f32) is how the engine tells it apart
    Bridge        [a fixed bank ; one seeded slot per teacher template token] read the student, two heads

Building blocks: separate q/k/v/o linears with bias, head_dim 64, LayerNorm eps 1e-5,
exact (erf) GELU, pre-LN blocks; state_dict names and registration order are the GGUF's
tensor names and order. The engine runs batch 1 with no mask; the key mask here only hides
batch padding, which is equivalent on real rows.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from trainer_core.contract.kinds.base import HEAD_DIM

__all__ = [
    "HEAD_DIM", "LN_EPS", "Attention", "ResamplerBlock", "TokenBlock", "Resampler", "TokenAligned", "Layerwise",
    "Bridge", "run_block", "count_parameters", "weights_left_uninitialized",
]

LN_EPS = 1e-5

def _mlp(width: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))  # mlp.0, mlp.2


class Attention(nn.Module):
    """Multi-head attention with separate q/k/v/o linears (bias), head_dim 64, no positions."""

    def __init__(self, width: int):
        super().__init__()
        self.heads = width // HEAD_DIM
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor, kv: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, Lq, W = x.shape
        Lk = kv.shape[1]
        q = self.q(x).view(B, Lq, self.heads, HEAD_DIM).transpose(1, 2)    # [B, H, Lq, 64]
        k = self.k(kv).view(B, Lk, self.heads, HEAD_DIM).transpose(1, 2)   # [B, H, Lk, 64]
        v = self.v(kv).view(B, Lk, self.heads, HEAD_DIM).transpose(1, 2)
        mask = None if key_mask is None else key_mask[:, None, None, :]    # [B, 1, 1, Lk], True = attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)      # scale 1/sqrt(64)
        return self.o(out.transpose(1, 2).reshape(B, Lq, W))


class ResamplerBlock(nn.Module):
    """q += self_attn(ln_self(q)); q += cross_attn(ln_q(q), ln_kv(kv)); q += mlp(ln_mlp(q))."""

    def __init__(self, width: int, mlp_hidden: int):
        super().__init__()
        self.ln_self = nn.LayerNorm(width, eps=LN_EPS)
        self.self_attn = Attention(width)
        self.ln_q = nn.LayerNorm(width, eps=LN_EPS)
        self.ln_kv = nn.LayerNorm(width, eps=LN_EPS)
        self.cross_attn = Attention(width)
        self.ln_mlp = nn.LayerNorm(width, eps=LN_EPS)
        self.mlp = _mlp(width, mlp_hidden)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, key_mask: torch.Tensor | None,
                self_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.ln_self(q)
        q = q + self.self_attn(x, x, self_mask)             # queries see each other (all but batch padding)
        q = q + self.cross_attn(self.ln_q(q), self.ln_kv(kv), key_mask)
        return q + self.mlp(self.ln_mlp(q))


class TokenBlock(nn.Module):
    """x += self_attn(ln_self(x)) (bidirectional); x += mlp(ln_mlp(x))."""

    def __init__(self, width: int, mlp_hidden: int):
        super().__init__()
        self.ln_self = nn.LayerNorm(width, eps=LN_EPS)
        self.self_attn = Attention(width)
        self.ln_mlp = nn.LayerNorm(width, eps=LN_EPS)
        self.mlp = _mlp(width, mlp_hidden)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        h = self.ln_self(x)
        x = x + self.self_attn(h, h, key_mask)
        return x + self.mlp(self.ln_mlp(x))


def run_block(model: nn.Module, block: nn.Module, *args: Any) -> torch.Tensor:
    """block(*args), under activation checkpointing while the model trains with `checkpointing` set
    (train.grad_checkpoint): the block's activations are recomputed in the backward pass instead of
    kept, the same numbers for less memory."""
    if getattr(model, "checkpointing", False) and model.training and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint
        return checkpoint(block, *args, use_reentrant=False)
    return block(*args)


class Resampler(nn.Module):
    """Learned queries (seeded with T5 ids when `seed_vocab` > 0) read the student states: [B, NQ, out]."""

    def __init__(self, in_dim: int, out_dim: int, width: int, depth: int, mlp_hidden: int, num_queries: int,
                 seed_vocab: int = 0):
        super().__init__()
        self.seed_vocab = seed_vocab
        self.query = nn.Parameter(torch.randn(num_queries, width) * 0.02)      # [NQ, W]
        if seed_vocab:                                                          # seeded: t5_embed[id] per query
            self.t5_embed = nn.Embedding(seed_vocab, width)
            nn.init.normal_(self.t5_embed.weight, std=0.02)
        self.in_proj = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(ResamplerBlock(width, mlp_hidden) for _ in range(depth))
        self.ln_out = nn.LayerNorm(width, eps=LN_EPS)
        self.out_proj = nn.Linear(width, out_dim)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None,
                seed_ids: torch.Tensor | None = None) -> torch.Tensor:
        kv = self.in_proj(h)                                          # [B, L, W]
        q = self.query.unsqueeze(0).expand(h.shape[0], -1, -1)        # [B, NQ, W]
        if self.seed_vocab:
            if seed_ids is None:
                raise ValueError("a seeded resampler needs seed_ids [B, num_queries]")
            q = q + self.t5_embed(seed_ids)                           # query_i + t5_embed[id_i]
        for block in self.blocks:
            q = run_block(self, block, q, kv, mask)
        return self.out_proj(self.ln_out(q))                          # [B, NQ, out]


class TokenAligned(nn.Module):
    """Position i of the student → position i of the teacher, plus the vision bridge: [B, L, out].
    `vis_dim` 0: no vision; `vis_in` / `skip`: whether those parts exist (the engine allows them off)."""

    def __init__(self, in_dim: int, out_dim: int, width: int, depth: int, mlp_hidden: int, *, vis_dim: int = 0,
                 vis_in: bool = True, skip: bool = True):
        super().__init__()
        if vis_dim:
            # applied by the engine to every mmproj embed before the student; fitted, never trained
            self.vision_proj = nn.Linear(vis_dim, in_dim, bias=False)
            self.vision_proj.weight.requires_grad_(False)
        self.in_proj = nn.Linear(in_dim, width)
        if vis_dim and vis_in:
            self.vis_in = nn.Linear(vis_dim, width, bias=False)
        self.blocks = nn.ModuleList(TokenBlock(width, mlp_hidden) for _ in range(depth))
        self.ln_out = nn.LayerNorm(width, eps=LN_EPS)
        self.out_proj = nn.Linear(width, out_dim)
        nn.init.zeros_(self.out_proj.weight)   # at step 0 the output is exactly skip(h)
        nn.init.zeros_(self.out_proj.bias)
        if skip:
            self.skip = nn.Linear(in_dim, out_dim)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None,
                vis: torch.Tensor | None = None, rows_only: bool | None = None) -> torch.Tensor:
        """[B, L, out]. With a padding mask the row-wise layers (in_proj, vis_in, out_proj, skip: all but
        the blocks) can run on the real rows alone and the pad rows come out as zeros (`rows_only`; None =
        on the CPU, where a padded batch of a vision pack is half pads and these layers are most of a
        step; on a GPU the padded matmuls cost less than the host sync the row selection needs). The real
        rows are the same either way: no real row attends to a pad row."""
        if rows_only is None:
            rows_only = h.device.type == "cpu"
        if rows_only and mask is not None and not bool(mask.all()):
            return self._real_rows(h, mask, vis)
        x = self.in_proj(h)                                           # [B, L, W]
        if vis is not None and hasattr(self, "vis_in"):
            x = x + self.vis_in(vis)             # raw mmproj rows at vision positions, zeros elsewhere
        for block in self.blocks:
            x = run_block(self, block, x, mask)
        out = self.out_proj(self.ln_out(x))                           # [B, L, out]
        if hasattr(self, "skip"):
            out = out + self.skip(h)
        return out

    def _real_rows(self, h: torch.Tensor, mask: torch.Tensor, vis: torch.Tensor | None) -> torch.Tensor:
        B, L = mask.shape
        rows = mask.reshape(-1).nonzero().squeeze(1)                  # [N] flat indices of the real rows
        h_rows = h.reshape(B * L, -1).index_select(0, rows)           # [N, in]
        x_rows = self.in_proj(h_rows)                                 # [N, W]
        if vis is not None and hasattr(self, "vis_in"):
            x_rows = x_rows + self.vis_in(vis.reshape(B * L, -1).index_select(0, rows))
        x = x_rows.new_zeros(B * L, x_rows.shape[-1]).index_copy(0, rows, x_rows).view(B, L, -1)
        for block in self.blocks:
            x = run_block(self, block, x, mask)
        out_rows = self.out_proj(self.ln_out(x.reshape(B * L, -1).index_select(0, rows)))    # [N, out]
        if hasattr(self, "skip"):
            out_rows = out_rows + self.skip(h_rows)
        return out_rows.new_zeros(B * L, out_rows.shape[-1]).index_copy(0, rows, out_rows).view(B, L, -1)


class Layerwise(nn.Module):
    """Position i of the student → the teacher's stacked taps at row i: [B, L, n_taps · layer_dim].

    out = out_proj(ln_out(TokenBlocks(in_proj(h)))) + skip(h), the blocks bidirectional over every
    row the engine hands over (real rows and pads). `layer_map` holds the tap numbers as float32:
    the engine never reads the values, only the count (and the tensor's presence)."""

    def __init__(self, in_dim: int, out_dim: int, width: int, depth: int, mlp_hidden: int, taps: tuple[int, ...]):
        super().__init__()
        self.register_buffer("layer_map", torch.tensor(taps, dtype=torch.float32))     # first in the state_dict
        self.in_proj = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(TokenBlock(width, mlp_hidden) for _ in range(depth))
        self.ln_out = nn.LayerNorm(width, eps=LN_EPS)
        self.out_proj = nn.Linear(width, out_dim)
        nn.init.zeros_(self.out_proj.weight)   # at step 0 the output is exactly skip(h)
        nn.init.zeros_(self.out_proj.bias)
        self.skip = nn.Linear(in_dim, out_dim)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.in_proj(h)                                           # [B, L, W]
        for block in self.blocks:
            x = run_block(self, block, x, mask)
        return self.out_proj(self.ln_out(x)) + self.skip(h)           # [B, L, n_taps · layer_dim]


class Bridge(nn.Module):
    """The Qwen3.5 bridge: [fixed bank ; one seeded slot per Qwen3.5 template token] read the student.

    Slot i's query is slot_query[i] + seed_proj(seed_embed[id_i]) + vis_q(v_i) (v_i the raw vision
    embed under an image slot, zeros elsewhere); bank row j's is bank_query[j], plus bank_in of the
    student's row under it when the bank is prompt-aligned and the caller hands `bank_hidden` (the
    engine does so only for FLUX.3, never on MOSS). Keys/values are [in_proj(h) ; vis_in(every raw
    vision embed)]. Both banks run jointly through the resampler blocks, one ln_out, then one head
    each: returns (bank rows [B, n_bank, bank_dim] or None, slot rows [B, P, out_dim]).
    `seed_embed` is the frozen PCA of the teacher's embedding table (precompute fits it).

    Ming-Image's adapter (its own kind) is the same trunk with the caption bank: `cap_query` (its
    256 rows) and `out_cap` (→ cap_dim) in place of bank_query and out_bank, never prompt-aligned; the
    slots are one per Ling prompt token and out_proj gives the DiT's direct rows.

    Sizes: `max_slots` slot queries, a seed table of `seed_vocab` × `seed_rank`, `vis_dim`-wide raw vision
    rows, a bank of `n_bank` rows (0: none) with a `bank_dim`-wide head, prompt-aligned with `bank_align`;
    `bank_names` are the bank's query tensor and head (by kind)."""

    def __init__(self, in_dim: int, out_dim: int, width: int, depth: int, mlp_hidden: int, *, max_slots: int,
                 seed_vocab: int, seed_rank: int, vis_dim: int, n_bank: int = 0, bank_dim: int = 0,
                 bank_align: bool = False, bank_names: tuple[str, str] = ("bank_query", "out_bank")):
        super().__init__()
        self.max_slots, self.n_bank = max_slots, n_bank
        self._bank_query, self._bank_head = bank_names      # (its query tensor, its head), by kind
        if n_bank:
            setattr(self, self._bank_query, nn.Parameter(torch.randn(n_bank, width) * 0.02))
        self.slot_query = nn.Parameter(torch.randn(max_slots, width) * 0.02)
        if n_bank and bank_align:
            self.bank_in = nn.Linear(in_dim, width, bias=False)
        self.seed_embed = nn.Embedding(seed_vocab, seed_rank)
        self.seed_embed.weight.requires_grad_(False)
        self.seed_proj = nn.Linear(seed_rank, width, bias=False)
        self.vis_q = nn.Linear(vis_dim, width, bias=False)
        self.in_proj = nn.Linear(in_dim, width)
        self.vis_in = nn.Linear(vis_dim, width, bias=False)
        self.blocks = nn.ModuleList(ResamplerBlock(width, mlp_hidden) for _ in range(depth))
        self.ln_out = nn.LayerNorm(width, eps=LN_EPS)
        if n_bank:
            setattr(self, self._bank_head, nn.Linear(width, bank_dim))
        self.out_proj = nn.Linear(width, out_dim)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None, *, seed_ids: torch.Tensor,
                slot_mask: torch.Tensor | None = None, vis_slot: torch.Tensor | None = None,
                vis_kv: torch.Tensor | None = None, vis_keep: torch.Tensor | None = None,
                bank_hidden: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """h [B, L, in] (mask [B, L]); seed_ids [B, P] (slot_mask [B, P]); vis_slot [B, P, vis];
        vis_kv [B, V, vis] (vis_keep [B, V]); bank_hidden [B, n_bank, in]."""
        B, P = seed_ids.shape
        n_bank = self.n_bank
        if P > self.max_slots:
            raise ValueError(f"{P} template tokens exceed the adapter's {self.max_slots} slots")
        kv, kv_mask = self.in_proj(h), mask
        if vis_kv is not None and vis_kv.shape[1]:
            kv = torch.cat([kv, self.vis_in(vis_kv)], 1)
            if mask is not None or vis_keep is not None:
                keep_h = mask if mask is not None else torch.ones(h.shape[:2], dtype=torch.bool, device=h.device)
                keep_v = vis_keep if vis_keep is not None else torch.ones(vis_kv.shape[:2], dtype=torch.bool,
                                                                          device=h.device)
                kv_mask = torch.cat([keep_h, keep_v], 1)
        q = self.slot_query[:P].unsqueeze(0) + self.seed_proj(self.seed_embed(seed_ids))      # [B, P, W]
        if vis_slot is not None:
            q = q + self.vis_q(vis_slot)
        self_mask = slot_mask
        if n_bank:
            bank = getattr(self, self._bank_query).unsqueeze(0).expand(B, -1, -1)
            if bank_hidden is not None:
                if not hasattr(self, "bank_in"):
                    raise ValueError("bank_hidden needs a prompt-aligned bank (bank_in)")
                bank = bank + self.bank_in(bank_hidden)
            q = torch.cat([bank, q], 1)
            if slot_mask is not None:
                self_mask = torch.cat([torch.ones(B, n_bank, dtype=torch.bool, device=slot_mask.device),
                                       slot_mask], 1)
        for block in self.blocks:
            q = run_block(self, block, q, kv, kv_mask, self_mask)
        q = self.ln_out(q)
        bank_out = getattr(self, self._bank_head)(q[:, :n_bank]) if n_bank else None
        return bank_out, self.out_proj(q[:, n_bank:])


_INITS = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_", "constant_")


@contextlib.contextmanager
def weights_left_uninitialized() -> Iterator[None]:
    """torch.nn.init's fills (what Linear, Embedding and LayerNorm call as they are built) do nothing."""
    saved = {name: getattr(nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fill in saved.items():
            setattr(nn.init, name, fill)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
