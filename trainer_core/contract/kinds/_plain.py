"""What the engine's plain runners share (the query kinds and the token-aligned kinds, not the slot
kinds): the checks it makes before it picks one, the sizes every one of them reads from in_proj,
out_proj and the first MLP, and the standardized / raw-target loss and validation over one Batch."""
from __future__ import annotations

from typing import Any

from trainer_core.contract.adapter_layout import LayoutProblem, depth_of, ne_reader
from trainer_core.contract.kinds.base import Names

__all__ = ["plain_checks", "plain_common", "standardized_loss", "raw_loss", "score_raw_rows"]

_STRAY = ("skip.weight", "vision_proj.weight", "vis_in.weight")


def plain_checks(names: Names, problems: list[LayoutProblem]) -> list[LayoutProblem]:
    """The tensors the engine would misread: token-aligned parts beside `query`, a seed table without it,
    the factorized seed gguf-trainer does not read."""
    has_query = "query" in names
    for name in _STRAY:
        if has_query and name in names:
            problems.append(LayoutProblem(
                f"adapter.query makes the engine run this file as a resampler, but adapter.{name} "
                f"belongs to token-aligned adapters and would be ignored"))
    if not has_query and ("t5_embed.weight" in names or "t5_embed_a.weight" in names):
        problems.append(LayoutProblem("adapter.t5_embed.weight without adapter.query: the engine runs a "
                                      "token-aligned adapter and ignores the seed table"))
    if "t5_embed_a.weight" in names:
        problems.append(LayoutProblem("adapter.t5_embed_a.weight is the factorized seed gguf-trainer "
                                      "does not read; export a full adapter.t5_embed.weight instead"))
    return problems


def plain_common(names: Names, problems: list[LayoutProblem]) -> tuple[dict[str, int] | None, list[LayoutProblem]]:
    """(in_dim, out_dim, width, depth, mlp_hidden) as the engine reads them, or None with the fatal problem."""
    ne = ne_reader(names)
    for required in ("in_proj.weight", "out_proj.weight", "blocks.0.mlp.0.weight"):
        if ne(required) is None or len(ne(required)) != 2:
            return None, problems + [LayoutProblem(f"adapter.{required} (2-D) is missing; the engine "
                                                   f"cannot size the adapter without it")]
    in_proj, out_proj = ne("in_proj.weight"), ne("out_proj.weight")
    width = in_proj[1]
    if width % 64:
        return None, problems + [LayoutProblem(f"adapter.in_proj.weight gives width {width}, which is not "
                                               f"a multiple of the engine's head_dim 64")]
    return dict(in_dim=in_proj[0], out_dim=out_proj[1], width=width, depth=depth_of(names),
                mlp_hidden=ne("blocks.0.mlp.0.weight")[1]), problems


def standardized_loss(batch: Any, pred: Any, mu: Any, sigma: Any, cos_weight: float) -> tuple[Any, dict[str, Any]]:
    """The resampler learns (t − μ)/σ_f over all rows: MSE + cos_weight·(1 − cos); rel_mse in raw space."""
    import torch

    from trainer_core.contract.losses import distill_loss, standardize
    target = standardize(batch.target, mu, sigma)
    loss, parts = distill_loss(pred, target, torch.ones_like(sigma), None, cos_weight, err_weight=sigma * sigma)
    raw = batch.target.float()        # the error is raw-space already ((p − t)·σ_f); the reference is not
    parts["rel_mse"] = parts["err"] / torch.linalg.vecdot(raw, raw).sum().clamp_min(torch.finfo(raw.dtype).tiny)
    return loss, parts


def raw_loss(batch: Any, pred: Any, sigma: Any, cos_weight: float) -> tuple[Any, dict[str, Any]]:
    """Raw targets, MSE whitened by 1/σ_f, masked to the rows supervised."""
    import torch

    from trainer_core.contract.losses import distill_loss
    loss, parts = distill_loss(pred, batch.target, sigma, batch.tmask, cos_weight)
    parts["rel_mse"] = parts["err"] / parts["ref"].clamp_min(torch.finfo(parts["ref"].dtype).tiny)
    return loss, parts


def score_raw_rows(score: Any, batch: Any, pred: Any) -> Any:
    """val_cos over the supervised rows of raw targets (and val_rel_mse); returns the row cosines."""
    from trainer_core.contract.losses import rel_mse, row_cos
    rows = row_cos(pred, batch.target)
    score.cos += float(rows[batch.tmask].mean())
    score.rel += float(rel_mse(pred, batch.target, batch.tmask))
    return rows
