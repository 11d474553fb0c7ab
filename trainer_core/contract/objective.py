"""What the train stage optimises and validates, per adapter kind: pure tensor code over a Batch.

    resampler                standardized targets, every row: MSE + cos_weight·(1 − cos)
    token_aligned_layerwise  standardized targets, row weights, per-tap cosine (tap_losses)
    qwen35_bridge, ming_image  standardized slot targets + the bank's own standardization (bridge.py)
    the others               raw targets, MSE whitened by 1/σ_f, the supervised rows only

`ValScore` turns validation batches into the val_* numbers the stage records: val_cos (the
training metric), val_rel_mse (raw space) and the pack's splits of val_cos.
"""
from __future__ import annotations

from typing import Any

import torch

from trainer_core.contract.adapter import AdapterConfig
from trainer_core.contract.bridge import HEADS, bridge_forward, bridge_loss
from trainer_core.contract.losses import distill_loss, rel_mse, row_cos, standardize
from trainer_core.contract.stream import Batch
from trainer_core.contract.tap_losses import layerwise_loss, tap_cos, weighted_rel_mse

__all__ = ["model_outputs", "as_float", "batch_loss", "ValScore"]

Outputs = Any          # a tensor [B, R, out], or the bridge's (slots, bank rows, aligned bank rows)


def model_outputs(config: AdapterConfig, model: torch.nn.Module, batch: Batch) -> Outputs:
    """The adapter's output on a batch, fed as the engine feeds this kind."""
    if config.bridge:
        return bridge_forward(model, batch)
    extra = ({"seed_ids": batch.seed_ids} if batch.seed_ids is not None else
             {"vis": batch.vis} if batch.vis is not None else {})
    return model(batch.h, batch.mask, **extra)


def as_float(outputs: Outputs) -> Outputs:
    if isinstance(outputs, tuple):
        return tuple(None if o is None else o.float() for o in outputs)
    return outputs.float()


def batch_loss(config: AdapterConfig, batch: Batch, pred: Outputs, mu: torch.Tensor, sigma: torch.Tensor,
               cos_weight: float, bank_stats: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, {"mse", "cos", "rel_mse"}) of the model's output `pred` (float32) on `batch`."""
    if config.bridge:
        return bridge_loss(batch, pred, mu, sigma, bank_stats, cos_weight)
    if config.layerwise:
        loss, parts = layerwise_loss(pred, standardize(batch.target, mu, sigma), batch.weight, len(config.taps),
                                     cos_weight)
        parts["rel_mse"] = weighted_rel_mse(pred.detach() * sigma + mu, batch.target, batch.weight)
    elif config.standardized:   # the resampler learns (t − μ)/σ_f over all rows
        target = standardize(batch.target, mu, sigma)
        loss, parts = distill_loss(pred, target, torch.ones_like(sigma), None, cos_weight, err_weight=sigma * sigma)
        raw = batch.target.float()        # the error is raw-space already ((p − t)·σ_f); the reference is not
        parts["rel_mse"] = parts["err"] / torch.linalg.vecdot(raw, raw).sum().clamp_min(torch.finfo(raw.dtype).tiny)
    else:                       # raw targets, MSE whitened by 1/σ_f, masked to the rows supervised
        loss, parts = distill_loss(pred, batch.target, sigma, batch.tmask, cos_weight)
        parts["rel_mse"] = parts["err"] / parts["ref"].clamp_min(torch.finfo(parts["ref"].dtype).tiny)
    return loss, parts


class ValScore:
    """Means of per-batch val_cos and val_rel_mse over the val set, plus pooled splits of val_cos:
    image packs split vision rows from the others ("vis" / "txt"), or, when only text rows are
    supervised (`by_sample`), samples with images from the others ("edit" / "t2i"); the layerwise
    kind splits real rows from pads ("tokens" / "pads"); the bridges their slot head from their bank
    (bridge.HEADS: "moss" / "klein", Ming's "dir" / "cap"), and val_cos is their mean when the val set has
    bank targets."""

    def __init__(self, config: AdapterConfig, mu: torch.Tensor, sigma: torch.Tensor, by_sample: bool = False,
                 bank_stats: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.config, self.mu, self.sigma, self.by_sample = config, mu, sigma, by_sample
        self.bank_stats = bank_stats
        self.cos = self.rel = 0.0
        self.n = 0
        self.split: dict[str, list[float]] = {}

    def _pool(self, name: str, values: torch.Tensor, weights: torch.Tensor) -> None:
        entry = self.split.setdefault(name, [0.0, 0.0])
        entry[0] += float((values * weights).sum())
        entry[1] += float(weights.sum())

    def add(self, batch: Batch, pred: Outputs) -> None:
        c, mu, sigma = self.config, self.mu, self.sigma
        if c.bridge:
            self._add_bridge(batch, pred)
        elif c.layerwise:
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

    def _add_bridge(self, batch: Batch, pred: Outputs) -> None:
        slots, _, bank = pred
        slot_head, bank_head = HEADS[self.config.kind]
        cos = row_cos(slots, standardize(batch.target, self.mu, self.sigma))
        self._pool(slot_head, cos, batch.tmask.to(cos.dtype))
        self.rel += float(rel_mse(slots * self.sigma + self.mu, batch.target, batch.tmask))
        if bank is not None and self.bank_stats is not None and bank.shape[0]:
            bmu, bsigma = self.bank_stats
            b = batch.bridge
            bank_cos = row_cos(bank, standardize(b.bank_target, bmu, bsigma))
            self._pool(bank_head, bank_cos, b.bank_mask.to(bank_cos.dtype))

    def result(self) -> dict[str, Any]:
        if self.config.bridge:          # pooled over the set: Klein rows exist in some batches only
            heads = [total / count for total, count in self.split.values() if count]
            self.cos = sum(heads) / max(len(heads), 1) * self.n
        out = {"val_cos": self.cos / self.n, "val_rel_mse": self.rel / self.n}
        for name, (total, count) in self.split.items():
            if count:                              # a split without rows is left out, not written as 0
                out[f"val_cos_{name}"] = total / count
        return out
