"""The layerwise kind's statistics, loss and metrics (packs-contract-more §D.3 8–9): pure tensor code.

A target row is a stack of `n_taps` tapped layers, [n_taps · layer_dim]. The deep taps are far
larger than the shallow ones, so everything is measured per tap:

* **Statistics.** μ is the raw mean; σ = √max(var, 1e-6) floored *relatively*: tap k's floor is
  `sigma_floor` × the median of tap k's σ (0.05 by default), so a tap whose dims are all small is
  not flattened by an absolute floor made for another scale.
* **Loss** on standardized rows t_std = (t − μ)/σ_f with row weights w (real rows 1, a sample's
  pads together 1): MSE = Σ w·Σ_d(p − t_std)² / (Σw · D); cos = Σ w·cos_tok / Σw where cos_tok is
  the row's cosine on each tap's slice, averaged over the taps; loss = MSE + cos_weight·(1 − cos).
  A plain full-width cosine would be dominated by the deep taps.
* **Metrics** (eval.json) on the folded, teacher-scale output: see LayerwiseMetrics.
"""
from __future__ import annotations

import torch
from torch import Tensor

from trainer_core.contract.losses import VAR_MIN, PooledMean, at_least_f32, put_present, row_cos, running_min

__all__ = ["relative_sigma", "tap_cos", "layerwise_loss", "weighted_rel_mse", "LayerwiseMetrics"]


def relative_sigma(sum_x: Tensor, sum_x2: Tensor, n: int, sigma_floor: float, n_taps: int
                   ) -> tuple[Tensor, Tensor, int]:
    """(μ, σ_f, number of floored dims), float32 [D]: σ_f = max(σ, sigma_floor · median of the tap's σ)."""
    if n <= 0:
        raise ValueError("target statistics need at least one target row; the shards hold none")
    mu = sum_x.double() / n
    sigma = (sum_x2.double() / n - mu * mu).clamp_min(VAR_MIN).sqrt()             # [D]
    per_tap = sigma.reshape(n_taps, -1)                                            # [taps, layer_dim]
    floor = sigma_floor * per_tap.median(dim=1, keepdim=True).values               # [taps, 1]
    floored = per_tap < floor
    return mu.float(), torch.maximum(per_tap, floor).reshape(-1).float(), int(floored.sum())


def tap_cos(p: Tensor, t: Tensor, n_taps: int) -> Tensor:
    """[..., n_taps · layer_dim] → [...]: the cosine of each tap's slice, averaged over the taps."""
    shape = p.shape[:-1] + (n_taps, p.shape[-1] // n_taps)
    return row_cos(p.reshape(shape), t.reshape(shape)).mean(-1)


def layerwise_loss(pred_std: Tensor, t_std: Tensor, weight: Tensor, n_taps: int, cos_weight: float = 0.5
                   ) -> tuple[Tensor, dict[str, Tensor]]:
    """The weighted loss above; pred_std, t_std [B, R, D], weight [B, R] (0 = not a row). parts holds the
    detached "mse" and "cos"; a batch without weight gives 0, never NaN."""
    p, t = at_least_f32(pred_std), at_least_f32(t_std)
    w = weight.to(p.dtype)
    total = w.sum().clamp_min(1e-12)
    mse = (w * ((p - t) ** 2).sum(-1)).sum() / (total * p.shape[-1])
    cos = (w * tap_cos(p, t, n_taps)).sum() / total
    return mse + cos_weight * (1.0 - cos), {"mse": mse.detach(), "cos": cos.detach()}


def weighted_rel_mse(pred: Tensor, target: Tensor, weight: Tensor) -> Tensor:
    """Σ w·Σ_d(p − t)² / Σ w·Σ_d t², raw rows."""
    p, t = at_least_f32(pred), at_least_f32(target)
    w = weight.to(p.dtype)
    return (w * ((p - t) ** 2).sum(-1)).sum() / (w * (t * t).sum(-1)).sum().clamp_min(torch.finfo(p.dtype).tiny)


class LayerwiseMetrics:
    """eval.json of the layerwise kind, pooled over every val row (weights w as in the loss):

    cos             per-tap cosine of the standardized rows, w-weighted (the training metric)
    cos_tokens      the same over the real rows only; cos_pads over the pad rows only
    cos_dit         every row the DiT reads counted once (each pad row on its own, unweighted)
    cos_centered    per-tap cosine with μ subtracted; cos_raw per-tap on raw rows; cos_full the
                    plain full-width cosine
    cos_tap_<k>     per tap, standardized, w-weighted
    rel_mse         raw, w-weighted;  worst_sample_cos  the lowest sample's w-weighted mean cos
    roundtrip_cos   standardized per-tap cosine of the GGUF's rows against the checkpoint's
    """

    def __init__(self, mu: Tensor, sigma: Tensor, taps: tuple[int, ...]) -> None:
        self.mu, self.sigma, self.taps = at_least_f32(mu), at_least_f32(sigma), tuple(taps)
        names = ("cos", "cos_tokens", "cos_pads", "cos_dit", "cos_centered", "cos_raw", "cos_full", "rel_mse",
                 "roundtrip_cos", *(f"cos_tap_{k}" for k in self.taps))
        self.means = {k: PooledMean() for k in names}
        self.worst_sample_cos: float | None = None
        self.samples = self.batches = 0

    def update(self, pred: Tensor, target: Tensor, *, weight: Tensor, pad: Tensor,
               pred_ck: Tensor | None = None) -> None:
        """pred, target, pred_ck teacher-scale [B, R, D]; weight [B, R] (0 off the rows); pad [B, R] bool."""
        p, t = at_least_f32(pred), at_least_f32(target)
        n = len(self.taps)
        mu, sigma = self.mu.to(p), self.sigma.to(p)
        ps, ts = (p - mu) / sigma, (t - mu) / sigma
        w = weight.to(p.dtype)
        rows = w > 0
        cos = tap_cos(ps, ts, n)                                                     # [B, R]

        def pool(name: str, values: Tensor, where: Tensor) -> None:
            self.means[name].add((values * w)[where].sum(), w[where].sum())
        pool("cos", cos, rows)
        pool("cos_tokens", cos, rows & ~pad)
        pool("cos_pads", cos, rows & pad)
        self.means["cos_dit"].add_values(cos[rows])
        pool("cos_centered", tap_cos(p - mu, t - mu, n), rows)
        pool("cos_raw", tap_cos(p, t, n), rows)
        pool("cos_full", row_cos(p, t), rows)
        shape = ps.shape[:-1] + (n, ps.shape[-1] // n)
        per_tap = row_cos(ps.reshape(shape), ts.reshape(shape))                      # [B, R, taps]
        for i, k in enumerate(self.taps):
            pool(f"cos_tap_{k}", per_tap[..., i], rows)
        self.means["rel_mse"].add((w * ((p - t) ** 2).sum(-1)).sum(), (w * (t * t).sum(-1)).sum())
        per_sample = (cos * w).sum(-1) / w.sum(-1).clamp_min(1e-12)                 # [B]
        self.worst_sample_cos = running_min(self.worst_sample_cos, per_sample[w.sum(-1) > 0])
        if pred_ck is not None:
            pool("roundtrip_cos", tap_cos(ps, (at_least_f32(pred_ck) - mu) / sigma, n), rows)
        self.samples += p.shape[0]
        self.batches += 1

    def result(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for name in ("cos", "cos_tokens", "cos_pads", "cos_dit", "cos_centered", "cos_raw", "cos_full", "rel_mse"):
            put_present(out, name, self.means[name].value)
        put_present(out, "worst_sample_cos", self.worst_sample_cos)
        put_present(out, "roundtrip_cos", self.means["roundtrip_cos"].value)
        for k in self.taps:
            put_present(out, f"cos_tap_{k}", self.means[f"cos_tap_{k}"].value)
        out["val_samples"] = self.samples
        out["val_batches"] = self.batches
        return out
