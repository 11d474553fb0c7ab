"""Kind `token_aligned_layerwise` (FLUX.3 Klein): position i of the student → the teacher's hidden states
of several tapped layers side by side at row i, [B, L, n_taps · layer_dim], plus a skip path.

`adapter.layer_map` (the tap numbers, F32, first tensor) is how the engine tells it apart and counts the
layers (at least 2; a 1-entry map reads as a plain adapter). Trained on standardized targets with a
per-tap relative σ floor and a per-tap cosine (contract/tap_losses.py); the export folds σ into out_proj
(+ μ) and skip (σ only). Its shards store each sample's real rows and ONE pad row (`n_real`,
`pad_multiple`): the reader repeats the pad row to the next multiple, and a sample's pads weigh one row.
A shard with `pad_multiple` 1 has no pad rows; one with `sup_start` [S] names, per sample, the first row
the engine hands on to the DiT: the adapter still runs over the rows before it, which weigh 0.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from trainer_core.contract.adapter_layout import TOKEN_BLOCK, Layout, LayoutProblem, check_expected, ne_reader
from trainer_core.contract.kinds._plain import plain_checks, plain_common
from trainer_core.contract.kinds.base import AdapterConfig, AdapterKind, KindField, Names, register

__all__ = ["KIND", "LayerwiseKind", "KV_KIND", "KV_LAYER_DIM", "KV_N_OUT_LAYERS", "KV_OUT_LAYERS"]

KV_KIND = "adapter.kind"
KV_LAYER_DIM, KV_N_OUT_LAYERS, KV_OUT_LAYERS = "adapter.layer_dim", "adapter.n_out_layers", "adapter.out_layers"


class LayerwiseKind(AdapterKind):
    name = "token_aligned_layerwise"
    title = "layerwise"
    plural = "layerwise adapters"
    standardized = True
    detect_rank = 40
    fields = (KindField("taps", (), (), "the teacher layers stacked side by side in a row, ascending (layer_map)"),
              KindField("has_skip", True, False, "the skip path (always there: part of the kind)"))
    shard_keys = ("n_real", "pad_multiple")
    optional_shard_keys = ("sup_start",)

    def validate(self, c: AdapterConfig) -> None:
        taps = tuple(int(t) for t in c.taps)
        if len(taps) < 2:
            raise ValueError(f"a {self.name} adapter needs at least 2 taps (the engine reads a 1-entry "
                             f"layer_map as a plain adapter), got {list(taps)}")
        if c.out_dim % len(taps):
            raise ValueError(f"out_dim {c.out_dim} is not {len(taps)} taps of equal width")

    def canonical(self, c: AdapterConfig) -> dict[str, Any]:
        return {"has_skip": True, "taps": tuple(int(t) for t in c.taps)}

    def layer_dim(self, c: AdapterConfig) -> int:
        """The width of one tapped layer."""
        return c.out_dim // len(c.taps)

    def tap_count(self, c: AdapterConfig) -> int:
        return len(c.taps)

    # ------------------------------------------------------------ the engine's file
    def claims(self, names: Names) -> bool:
        return "layer_map" in names and "query" not in names

    def detect(self, names: Names, outside: Names, layer_map: Any, problems: list[LayoutProblem]
               ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
        """The engine's rules for a token-aligned adapter with a layer_map: its count is ne[0] (a stored
        [n, 1] still counts), at least 2, and out_proj's width is that many layers of equal width."""
        problems = plain_checks(names, problems)
        if any(p.fatal for p in problems):
            return None, problems
        common, problems = plain_common(names, problems)
        if common is None:
            return None, problems
        ne = ne_reader(names)
        shape = ne("layer_map")
        n = shape[0]
        if any(d != 1 for d in shape[1:]):
            return None, problems + [LayoutProblem(f"adapter.layer_map has ne {list(shape)}; the engine needs a 1-D "
                                                   f"tensor with one entry per stacked layer")]
        if len(shape) > 1:
            problems.append(LayoutProblem(f"adapter.layer_map has ne {list(shape)}; gguf-trainer writes it 1-D",
                                          fatal=False))
        if n < 2:
            return None, problems + [LayoutProblem(f"adapter.layer_map has {n} entry; the engine needs at least 2 "
                                                   f"stacked layers (1 reads as a plain adapter)")]
        for name in ("vision_proj.weight", "vis_in.weight", "query"):
            if name in names:
                problems.append(LayoutProblem(f"adapter.{name} does not belong to a layerwise adapter"))
        if ne("skip.weight") is None:
            problems.append(LayoutProblem("adapter.skip.weight is missing; a layerwise adapter has a skip path"))
        taps = tuple(int(round(float(v))) for v in np.asarray(layer_map).reshape(-1)) if layer_map is not None else ()
        if len(taps) != n:
            taps = tuple(range(1, n + 1))
        if common["out_dim"] % n:
            problems.append(LayoutProblem(f"adapter.out_proj.weight gives {common['out_dim']} outputs, which is not "
                                          f"{n} stacked layers of equal width (adapter.layer_map has {n} entries)"))
        if any(p.fatal for p in problems):
            return None, problems
        try:
            config = AdapterConfig(kind=self.name, taps=taps, **common)
        except ValueError as e:
            return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
        return check_expected(config, self.expected_ne(config), names, problems, self.f32_names)

    def expected_ne(self, c: AdapterConfig) -> dict[str, tuple[int, ...]]:
        W, layout = c.width, Layout(c.width)
        layout.tensor("layer_map", len(c.taps))
        layout.linear("in_proj", c.in_dim, W)
        layout.blocks(c.depth, TOKEN_BLOCK, c.mlp)
        layout.norm("ln_out")
        layout.linear("out_proj", W, c.out_dim)
        layout.linear("skip", c.in_dim, c.out_dim)
        return layout.ne

    def structural_kvs(self, c: AdapterConfig) -> tuple[list, list]:
        return [], [(KV_KIND, c.kind, "str"), (KV_LAYER_DIM, self.layer_dim(c), "u32"),
                    (KV_N_OUT_LAYERS, len(c.taps), "u32"), (KV_OUT_LAYERS, list(c.taps), "i32s")]

    def folded_heads(self, c: AdapterConfig) -> tuple[str, ...]:
        return ("out_proj", "skip")

    # ------------------------------------------------------------ torch
    def build(self, c: AdapterConfig) -> Any:
        from trainer_core.contract.adapter import Layerwise
        return Layerwise(c.in_dim, c.out_dim, c.width, c.depth, c.mlp, c.taps)

    def loss(self, c: AdapterConfig, batch: Any, pred: Any, mu: Any, sigma: Any, cos_weight: float,
             bank_stats: Any = None) -> tuple[Any, dict[str, Any]]:
        from trainer_core.contract.losses import standardize
        from trainer_core.contract.tap_losses import layerwise_loss, weighted_rel_mse
        loss, parts = layerwise_loss(pred, standardize(batch.target, mu, sigma), batch.weight, len(c.taps),
                                     cos_weight)
        parts["rel_mse"] = weighted_rel_mse(pred.detach() * sigma + mu, batch.target, batch.weight)
        return loss, parts

    def score_batch(self, score: Any, batch: Any, pred: Any) -> None:
        """The per-tap cosine, row-weighted; split into real rows and pads ("tokens" / "pads")."""
        from trainer_core.contract.losses import standardize
        from trainer_core.contract.tap_losses import tap_cos, weighted_rel_mse
        w = batch.weight
        cos = tap_cos(pred, standardize(batch.target, score.mu, score.sigma), len(score.config.taps))
        score.cos += float((cos * w).sum() / w.sum().clamp_min(1e-12))
        score.rel += float(weighted_rel_mse(pred * score.sigma + score.mu, batch.target, w))
        score.pool("tokens", cos, w * ~batch.pad)
        score.pool("pads", cos, w * batch.pad)

    def eval_metrics(self, c: AdapterConfig, mu: Any, sigma: Any, bank: Any) -> Any:
        from trainer_core.contract.tap_losses import LayerwiseMetrics
        return LayerwiseMetrics(mu, sigma, c.taps)

    def eval_batch(self, metrics: Any, batch: Any, pred: Any, pred_ck: Any) -> None:
        metrics.update(pred, batch.target, weight=batch.weight, pad=batch.pad, pred_ck=pred_ck)

    # ------------------------------------------------------------ the shard schema
    def rows(self, src: Any) -> None:
        src.n_real = src.shard["n_real"].long()
        src.pad_multiple = int(src.shard["pad_multiple"][0])
        src.sup_start = src.shard["sup_start"].long() if "sup_start" in src.shard.keys else None

    def collate(self, src: Any, idx: Any, keep_dtype: bool, pin: bool) -> Any:
        """Each sample's rows as the engine hands them to the adapter: its n_real rows, then its one stored
        pad row repeated up to the next multiple of pad_multiple (none when n_real is one already). Real
        rows weigh 1 and the pads of a sample 1/n_pad each, so a sample's pads count as one row; rows before
        the sample's sup_start (when the shard has one) weigh 0."""
        import torch

        from trainer_core.contract.batch import Batch
        n_real, off, m = src.n_real[idx], src.q_off[idx], src.pad_multiple
        rows = (n_real + m - 1) // m * m                                                # [B] ceil to m
        B, L = len(idx), int(rows.max())
        within = torch.arange(L)[None, :]                                               # [1, L]
        keep = within < rows[:, None]                                                   # [B, L]
        pad = keep & (within >= n_real[:, None])
        n_pad = (rows - n_real).clamp_min(1)
        weight = torch.where(pad, 1.0 / n_pad[:, None].float(), keep.float())
        if src.sup_start is not None:          # the engine drops these rows after the adapter
            weight = weight * (within >= src.sup_start[idx][:, None])
        src_row = off[:, None] + torch.minimum(within, n_real[:, None])                # the stored pad at n_real
        flat_src, flat_dest = src_row[keep], (torch.arange(B)[:, None] * L + within)[keep]

        def gather(packed: torch.Tensor) -> torch.Tensor:
            dtype = packed.dtype if keep_dtype else torch.float32
            out = torch.zeros(B * L, packed.shape[1], dtype=dtype, pin_memory=pin)
            out[flat_dest] = packed[flat_src].to(dtype)
            return out.view(B, L, -1)
        return Batch(gather(src._q), keep, gather(src._t), keep, None, None, weight=weight, pad=pad)

    # ------------------------------------------------------------ infer
    def infer(self, c: AdapterConfig, model: Any, hidden: Any, given: Mapping[str, Any]) -> Any:
        import torch
        with torch.no_grad():
            out = model(torch.from_numpy(hidden).unsqueeze(0), None)              # [1, L, n_taps · layer_dim]
        return out[0].numpy()


KIND = register(LayerwiseKind())
