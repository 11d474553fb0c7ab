"""What the train stage optimises and validates, per adapter kind: pure tensor code over a Batch.

    resampler                standardized targets, every row: MSE + cos_weight·(1 − cos)
    token_aligned_layerwise  standardized targets, row weights, per-tap cosine (tap_losses)
    the others               raw targets, MSE whitened by 1/σ_f, the supervised rows only

`ValScore` turns validation batches into the val_* numbers the stage records: val_cos (the
training metric), val_rel_mse (raw space) and the pack's splits of val_cos.
"""
from __future__ import annotations

from typing import Any

import torch

from trainer_core.contract.adapter import AdapterConfig
from trainer_core.contract.losses import distill_loss, rel_mse, row_cos, standardize
from trainer_core.contract.stream import Batch
from trainer_core.contract.tap_losses import layerwise_loss, tap_cos, weighted_rel_mse

__all__ = ["batch_loss", "ValScore"]


def batch_loss(config: AdapterConfig, batch: Batch, pred: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor,
               cos_weight: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, {"mse", "cos", "rel_mse"}) of the model's output `pred` (float32) on `batch`."""
    if config.layerwise:
        loss, parts = layerwise_loss(pred, standardize(batch.target, mu, sigma), batch.weight, len(config.taps),
                                     cos_weight)
        parts["rel_mse"] = weighted_rel_mse(pred.detach() * sigma + mu, batch.target, batch.weight)
    elif config.standardized:   # the resampler learns (t − μ)/σ_f over all rows
        target = standardize(batch.target, mu, sigma)
        loss, parts = distill_loss(pred, target, torch.ones_like(sigma), None, cos_weight)
        parts["rel_mse"] = rel_mse(pred.detach() * sigma + mu, batch.target)
    else:                       # raw targets, MSE whitened by 1/σ_f, masked to the rows supervised
        loss, parts = distill_loss(pred, batch.target, sigma, batch.tmask, cos_weight)
        parts["rel_mse"] = rel_mse(pred.detach(), batch.target, batch.tmask)
    return loss, parts


class ValScore:
    """Means of per-batch val_cos and val_rel_mse over the val set, plus pooled splits of val_cos:
    image packs split vision rows from the others ("vis" / "txt"), or, when only text rows are
    supervised (`by_sample`), samples with images from the others ("edit" / "t2i"); the layerwise
    kind splits real rows from pads ("tokens" / "pads")."""

    def __init__(self, config: AdapterConfig, mu: torch.Tensor, sigma: torch.Tensor, by_sample: bool = False):
        self.config, self.mu, self.sigma, self.by_sample = config, mu, sigma, by_sample
        self.cos = self.rel = 0.0
        self.n = 0
        self.split: dict[str, list[float]] = {}

    def _pool(self, name: str, values: torch.Tensor, weights: torch.Tensor) -> None:
        entry = self.split.setdefault(name, [0.0, 0.0])
        entry[0] += float((values * weights).sum())
        entry[1] += float(weights.sum())

    def add(self, batch: Batch, pred: torch.Tensor) -> None:
        c, mu, sigma = self.config, self.mu, self.sigma
        if c.layerwise:
            w = batch.weight
            cos = tap_cos(pred, standardize(batch.target, mu, sigma), len(c.taps))
            self.cos += float((cos * w).sum() / w.sum().clamp_min(1e-12))
            self.rel += float(weighted_rel_mse(pred * sigma + mu, batch.target, w))
            self._pool("tokens", cos, w * ~batch.pad)
            self._pool("pads", cos, w * batch.pad)
        elif c.standardized:
            self.cos += float(row_cos(pred, standardize(batch.target, mu, sigma)).mean())
            self.rel += float(rel_mse(pred * sigma + mu, batch.target))
        else:
            rows = row_cos(pred, batch.target)
            self.cos += float(rows[batch.tmask].mean())
            self.rel += float(rel_mse(pred, batch.target, batch.tmask))
            if batch.vision is not None:
                edit = batch.vision.any(-1, keepdim=True)
                parts = ((("edit", batch.tmask & edit), ("t2i", batch.tmask & ~edit)) if self.by_sample else
                         (("vis", batch.tmask & batch.vision), ("txt", batch.tmask & ~batch.vision)))
                for name, where in parts:
                    self._pool(name, rows, where.to(rows.dtype))
        self.n += 1

    def result(self) -> dict[str, Any]:
        out = {"val_cos": self.cos / self.n, "val_rel_mse": self.rel / self.n}
        for name, (total, count) in self.split.items():
            if count:                              # a split without rows is left out, not written as 0
                out[f"val_cos_{name}"] = total / count
        return out
