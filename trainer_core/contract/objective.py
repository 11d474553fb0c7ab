"""What the train stage optimises and validates: the adapter's kind says (contract/kinds/, its `forward`,
`loss` and `score_batch`); this module is what every kind shares — the float cast of an output, and
`ValScore`, which turns validation batches into the val_* numbers the stage records: val_cos (the
training metric), val_rel_mse (raw space) and the kind's splits of val_cos.
"""
from __future__ import annotations

from typing import Any

import torch

from trainer_core.contract.batch import Batch
from trainer_core.contract.kinds import AdapterConfig

__all__ = ["model_outputs", "as_float", "batch_loss", "ValScore"]

Outputs = Any          # a tensor [B, R, out], or a tuple of a kind's heads (None where a head did not run)


def model_outputs(config: AdapterConfig, model: torch.nn.Module, batch: Batch) -> Outputs:
    """The adapter's output on a batch, fed as the engine feeds this kind."""
    return config.spec.forward(config, model, batch)


def as_float(outputs: Outputs) -> Outputs:
    if isinstance(outputs, tuple):
        return tuple(None if o is None else o.float() for o in outputs)
    return outputs.float()


def batch_loss(config: AdapterConfig, batch: Batch, pred: Outputs, mu: torch.Tensor, sigma: torch.Tensor,
               cos_weight: float, bank_stats: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, {"mse", "cos", "rel_mse"}) of the model's output `pred` (float32) on `batch`."""
    return config.spec.loss(config, batch, pred, mu, sigma, cos_weight, bank_stats)


class ValScore:
    """Means of per-batch val_cos and val_rel_mse over the val set, plus pooled splits of val_cos (`pool`):
    which splits a kind reports is its `score_batch`'s choice (vision rows or image samples, real rows and
    pads, a slot head and a bank head). A kind with `pooled_val` reports val_cos as the mean of its pooled
    splits (a bank's rows exist in some batches only)."""

    def __init__(self, config: AdapterConfig, mu: torch.Tensor, sigma: torch.Tensor, by_sample: bool = False,
                 bank_stats: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.config, self.mu, self.sigma, self.by_sample = config, mu, sigma, by_sample
        self.bank_stats = bank_stats
        self.cos = self.rel = 0.0
        self.n = 0
        self.split: dict[str, list[float]] = {}

    def pool(self, name: str, values: torch.Tensor, weights: torch.Tensor) -> None:
        entry = self.split.setdefault(name, [0.0, 0.0])
        entry[0] += float((values * weights).sum())
        entry[1] += float(weights.sum())

    def add(self, batch: Batch, pred: Outputs) -> None:
        self.config.spec.score_batch(self, batch, pred)
        self.n += 1

    def result(self) -> dict[str, Any]:
        if self.config.spec.pooled_val:
            heads = [total / count for total, count in self.split.values() if count]
            self.cos = sum(heads) / max(len(heads), 1) * self.n
        out = {"val_cos": self.cos / self.n, "val_rel_mse": self.rel / self.n}
        for name, (total, count) in self.split.items():
            if count:                              # a split without rows is left out, not written as 0
                out[f"val_cos_{name}"] = total / count
        return out
