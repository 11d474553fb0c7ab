"""The seeded-slot bridges' training data, forward, loss and metrics (the slot kinds of
contract/kinds/: the Qwen3.5 bridge and Ming's).

A sample is a raw prompt (the student's rows), the Qwen3.5 ids of its MOSS template (one slot
each, with the teacher's last hidden state as the target), the raw vision embeds of its references
(under their `<|image_pad|>` slots and as extra keys), and — for the samples that have a bank target
(`has_bank_target`) — the FLUX.3 Klein bank target: n_real rows of the Klein template (3 prefix + body
+ 5 suffix) and ONE stored pad row, which the reader repeats up to n80 = min(n_bank, ceil80(n_real))
rows (the rows the engine hands the DiT; each counts fully).

Shard keys (docs/SHARDS.md): the common ids/len/q_pack, then slot_ids int32 [ΣP], t_len = P per
sample, t_pack [ΣP, out] (the slot targets), stat_* over every slot; v_pack [Tv, vis] with
vis_sample/vis_start/vis_len per image; has_bank_target int8 [S] (`klein` in shards of an earlier
version); with the Klein head: b_pack [Σ stored bank
rows, bank_dim], bank_rows/bank_real/bank_body int32 [S], bank_slots int32 [1], bstat_* (real rows
plus the pad row weighted n80 − n_real). The reader is the kind's `rows` / `collate`.

The engine runs the slot (MOSS) head with the bank rows = bank_query alone, and feeds the student's
rows into the bank only on FLUX.3 (bank_in). So a step runs every sample without bank_hidden (slot
loss) and, in the same forward, a copy of each Klein sample with it (bank loss): the MOSS head is
trained exactly as the engine runs it (packs-contract-more Part F §5).

Ming-Image's kind uses the same parts with its caption bank: every sample has a bank
target (its 256 caption rows, b_pack, bank_rows = bank_real = n_cap, no `has_bank_target` key), there is no
bank_hidden (the engine never feeds student rows into the caption bank), and the bank rows scored are
the plain bank rows of every sample. Its slots are one per Ling prompt token (the direct rows).
Each kind names its two heads (the Qwen3.5 bridge "moss" / "klein", Ming "dir" / "cap").
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from trainer_core.contract.losses import (PooledMean, cos_and_rms_of_sums, cos_of_sums, distill_loss, masked_totals,
                                         ratio_of_totals, rel_mse, row_dot, standardize)

__all__ = ["BANK_PREFIX", "BANK_SUFFIX", "BridgeParts", "bank_length", "bridge_forward",
           "bridge_loss", "BridgeMetrics"]

BANK_PREFIX, BANK_SUFFIX = 3, 5          # the Klein template's ids before and after the prompt's body
_ALIGN = 80


def bank_length(n_real: int, n_bank: int) -> int:
    """The bank rows the engine hands FLUX.3's DiT for n_real template rows: ceil80, at most n_bank."""
    return min(n_bank, -(-n_real // _ALIGN) * _ALIGN)


@dataclass
class BridgeParts:
    """What a bridge batch adds to Batch; the bank fields cover only the samples with a bank target (K of B)."""

    vis_slot: Tensor                 # [B, P, vis] raw vision embed under each image slot, zeros elsewhere
    vis_kv: Tensor                   # [B, V, vis] every raw vision embed of the sample, in image order
    vis_keep: Tensor                 # [B, V] bool
    has_bank_target: Tensor          # [B] bool: the sample has a bank target (a Klein sample; every Ming sample)
    bank_hidden: Tensor | None = None   # [K, n_bank, in] row 3 + i = the student's row i (i < body); Ming: None
    bank_target: Tensor | None = None   # [K, n_bank, bank_dim]
    bank_mask: Tensor | None = None     # [K, n_bank] bool: the n80 rows the DiT receives

    def to(self, device: torch.device) -> "BridgeParts":
        def move(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            t = t.to(device, non_blocking=True)
            return t.float() if t.is_floating_point() else t
        return BridgeParts(*(move(getattr(self, f.name)) for f in fields(self)))

    def __getitem__(self, rows: slice) -> "BridgeParts":
        """Samples rows.start … rows.stop − 1 (a micro-batch or a rank's share)."""
        start = rows.start or 0
        first = int(self.has_bank_target[:start].sum())
        last = first + int(self.has_bank_target[rows].sum())
        cut = lambda t: None if t is None else t[first:last]  # noqa: E731
        return BridgeParts(self.vis_slot[rows], self.vis_kv[rows], self.vis_keep[rows], self.has_bank_target[rows],
                           cut(self.bank_hidden), cut(self.bank_target), cut(self.bank_mask))

    @property
    def n_bank_targets(self) -> int:
        """The samples with a bank target (K)."""
        return int(self.has_bank_target.sum())


def bridge_forward(model: torch.nn.Module, batch: Any) -> tuple[Tensor, Tensor, Tensor | None]:
    """(slot rows [B, P, out], bank rows of every sample without bank_hidden [B, n_bank, bank_dim] or
    None, the bank rows scored against the bank targets [K, n_bank, bank_dim] or None) in ONE forward.
    Qwen3.5 bridge: the Klein samples run a second time, as a copy with their student rows in the bank
    (bank_in has no bias, so zeros there are exactly the engine's MOSS path), and that copy is scored.
    Ming: no bank_hidden, every sample has a caption target, and its plain bank rows are scored."""
    parts: BridgeParts = batch.bridge
    h, mask, seed, tmask = batch.h, batch.mask, batch.seed_ids, batch.tmask
    vis_slot, vis_kv, vis_keep = parts.vis_slot, parts.vis_kv, parts.vis_keep
    B = batch.size
    aligned = parts.bank_hidden is not None and parts.n_bank_targets > 0
    bank_hidden = None
    if aligned:
        k = parts.has_bank_target
        cat = lambda a, b: torch.cat([a, b[k]], 0)  # noqa: E731
        h, mask, seed, tmask = cat(h, h), cat(mask, mask), cat(seed, seed), cat(tmask, tmask)
        vis_slot, vis_kv, vis_keep = cat(vis_slot, vis_slot), cat(vis_kv, vis_kv), cat(vis_keep, vis_keep)
        bank_hidden = torch.cat([torch.zeros(B, *parts.bank_hidden.shape[1:], dtype=parts.bank_hidden.dtype,
                                             device=h.device), parts.bank_hidden], 0)
    bank, slots = model(h, mask, seed_ids=seed, slot_mask=tmask, vis_slot=vis_slot, vis_kv=vis_kv,
                        vis_keep=vis_keep, bank_hidden=bank_hidden)
    if bank is None:
        return slots[:B], None, None
    if aligned:
        return slots[:B], bank[:B], bank[B:]
    # no student rows in the bank: the scored rows are the plain ones of the samples with a target (Ming: all)
    target = parts.bank_target
    scored = None if target is None else bank[:B] if target.shape[0] == B else bank[:B][parts.has_bank_target]
    return slots[:B], bank[:B], scored


def bridge_loss(batch: Any, outputs: tuple[Tensor, Tensor | None, Tensor | None], mu: Tensor, sigma: Tensor,
                bank_stats: tuple[Tensor, Tensor] | None, cos_weight: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Slot loss (standardized, the real slots) + bank loss (standardized by the bank's own μ/σ, the
    n80 rows of each Klein sample) when the batch has a Klein sample; parts are the means of the two."""
    slots, bank_plain, bank = (None if o is None else o.float() for o in outputs)
    loss, parts = distill_loss(slots, standardize(batch.target, mu, sigma), torch.ones_like(sigma), batch.tmask,
                               cos_weight)
    rel = rel_mse(slots.detach() * sigma + mu, batch.target, batch.tmask)
    if bank is not None and bank_stats is not None and bank.shape[0]:
        bmu, bsigma = bank_stats
        target, where = batch.bridge.bank_target, batch.bridge.bank_mask
        b_loss, b_parts = distill_loss(bank, standardize(target, bmu, bsigma), torch.ones_like(bsigma), where,
                                       cos_weight)
        loss = loss + b_loss
        parts = {k: (parts[k] + b_parts[k]) / 2 for k in ("mse", "cos")}
        rel = (rel + rel_mse(bank.detach() * bsigma + bmu, target, where)) / 2
    elif bank_plain is not None:      # keep out_bank in the graph (DDP wants every parameter used)
        loss = loss + 0.0 * bank_plain.sum()
    return loss, {"mse": parts["mse"], "cos": parts["cos"], "rel_mse": rel}


class BridgeMetrics:
    """The evaluation of the GGUF (teacher scale): slot metrics over the real slots (MOSS rows; Ming's
    direct rows); bank metrics over the bank rows scored (the n80 rows of the Klein samples; Ming's 256
    caption rows of every sample); the pooled ones are their means (the slot head alone without bank
    batches). μ for centring: the slot head's μ and the bank's. `heads` names the two (slot, bank)."""

    _NAMES = ("cos_centered", "cos_rms", "cos_raw", "rel_mse", "roundtrip_cos")

    def __init__(self, mu: Tensor, bank_mu: Tensor | None, heads: tuple[str, str]) -> None:
        self.mu, self.bank_mu = mu.double(), None if bank_mu is None else bank_mu.double()
        self.heads = heads
        self.means = {f"{n}_{head}": PooledMean() for n in self._NAMES for head in heads}
        self.worst: float | None = None
        self.batches = self.bank_batches = 0

    def _update(self, head: str, pred: Tensor, target: Tensor, where: Tensor, mu: Tensor,
                pred_ck: Tensor | None) -> Tensor:
        p, t, mu = pred.double(), target.double(), mu.to(pred.device)
        w = where.to(torch.float64)
        n = w.sum().clamp_min(1.0)
        mean = lambda rows: float((rows * w).sum() / n)  # noqa: E731 — over the rows that count
        # row_cos_and_rms, row_cos and rel_mse of the rows, each row sum taken once (t·t, (p−μ)·(p−μ)
        # serve two metrics each): the same numbers as calling them, with fewer passes over the rows
        tt = row_dot(t, t)
        cos_raw, cos_rms = cos_and_rms_of_sums(row_dot(p, t), row_dot(p, p), tt, p.shape[-1])
        pc, tc = p - mu, t - mu
        pcpc = row_dot(pc, pc)
        self.means[f"cos_centered_{head}"].add(mean(cos_of_sums(row_dot(pc, tc), pcpc, row_dot(tc, tc))))
        del tc
        self.means[f"cos_rms_{head}"].add(mean(cos_rms))
        self.means[f"cos_raw_{head}"].add(mean(cos_raw))
        d = p - t
        self.means[f"rel_mse_{head}"].add(float(ratio_of_totals(*masked_totals(row_dot(d, d), tt, where))))
        del d
        if pred_ck is not None:
            ck = pred_ck.double() - mu
            self.means[f"roundtrip_cos_{head}"].add(mean(cos_of_sums(row_dot(pc, ck), pcpc, row_dot(ck, ck))))
        return cos_rms[where]

    def update(self, batch: Any, outputs: tuple[Tensor, Tensor | None, Tensor | None],
               ck_outputs: tuple[Tensor, Tensor | None, Tensor | None] | None = None) -> None:
        slots, _, bank = outputs
        ck_slots, _, ck_bank = ck_outputs or (None, None, None)
        slot_head, bank_head = self.heads
        rows = self._update(slot_head, slots, batch.target, batch.tmask, self.mu, ck_slots)
        if bank is not None and self.bank_mu is not None and bank.shape[0]:
            b = batch.bridge
            rows = torch.cat([rows, self._update(bank_head, bank, b.bank_target, b.bank_mask, self.bank_mu,
                                                 ck_bank)])
            self.bank_batches += 1
        low = float(rows.min()) if rows.numel() else None
        if low is not None:
            self.worst = low if self.worst is None else min(self.worst, low)
        self.batches += 1

    def result(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for name in self._NAMES:
            values = [(head, self.means[f"{name}_{head}"].value) for head in self.heads]
            for head, value in values:
                if value is not None and name != "roundtrip_cos":
                    out[f"{name}_{head}"] = value
            both = [v for _, v in values if v is not None]
            if both:
                out[name] = sum(both) / len(both)
        if self.worst is not None:
            out["worst_row_cos_rms"] = self.worst
        out["val_batches"], out[f"{self.heads[1]}_batches"] = self.batches, self.bank_batches
        return out
