"""Distillation loss, target statistics and evaluation metrics: pure tensor code.

The facts come from the engine contract: §0.4 (statistics and the σ floor), §0.5 (loss),
§0.6 (evaluation) and the Loss / Eval paragraphs of §1–§4. Nothing here reads the disk or
the clock; stages feed tensors in and write the numbers out.

Which adapter kind uses what (contract/kinds/ calls these):

    the resampler        STANDARDIZED: distill_loss(pred_std, standardize(t, mu, sigma), ones(D),
                         mask=None); eval ResamplerMetrics(mu)
    token-aligned        raw targets: distill_loss(p, t, sigma, sup) with sup every real row or the
                         consumed text rows (≥ sup_start, not under an image slot); eval TokenAlignedMetrics
    the seeded resampler raw targets: distill_loss(p, t, sigma, real slots); eval SeededMetrics

Shapes: B samples, R rows per sample (queries, slots or tokens), D output dims. A row mask
is bool [B, R], True = the row counts. Row math runs in at least float32 whatever the input
dtype (bf16 under autocast); running sums are float64.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "COS_EPS", "RMS_EPS", "VAR_MIN", "HEALTHY_CENTERED_COS", "BROKEN_ROPE_BAND",
    "accumulate_stats", "target_stats", "standardize", "destandardize",
    "row_cos", "row_cos_and_rms", "rms_norm", "real_slots", "distill_loss", "rel_mse",
    "PooledMean", "ResamplerMetrics", "SeededMetrics", "TokenAlignedMetrics", "health_verdict",
    # the row sums and metric helpers the bridge and layerwise modules build on
    "at_least_f32", "row_dot", "cos_of_sums", "cos_and_rms_of_sums", "running_min", "put_present",
]

COS_EPS = 1e-8    # a zero row has cosine 0 with anything, never NaN
RMS_EPS = 1e-5    # rms_norm, as the peer's evaluate.py (§0.6)
VAR_MIN = 1e-6    # variance floor inside target_stats, before the σ floor (§0.4)
HEALTHY_CENTERED_COS = 0.96
BROKEN_ROPE_BAND = (0.80, 0.92)   # around the ~0.87 signature quoted in §1


def at_least_f32(x: Tensor) -> Tensor:
    """x in at least float32 (bf16/f16 are upcast, float64 stays)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check(pred: Tensor, target: Tensor, mask: Tensor | None = None) -> None:
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} "
                         f"differ in shape")
    if mask is not None and (mask.shape != pred.shape[:-1] or mask.dtype != torch.bool):
        raise ValueError(f"the row mask must be bool {tuple(pred.shape[:-1])}, got "
                         f"{mask.dtype} {tuple(mask.shape)}")


# ---------------------------------------------------------------- statistics (§0.4)

def accumulate_stats(rows: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor, int]:
    """(Σx, Σx², n) per output dim over the rows mask keeps, in float64; sum them over shards."""
    x = rows.reshape(-1, rows.shape[-1]).double()                       # [N, D]
    if mask is not None:
        if mask.shape != rows.shape[:-1]:
            raise ValueError(f"mask {tuple(mask.shape)} does not match rows {tuple(rows.shape)}")
        x = x[mask.reshape(-1)]                                          # [n, D]
    return x.sum(0), (x * x).sum(0), int(x.shape[0])


def target_stats(sum_x: Tensor, sum_x2: Tensor, n: int,
                 sigma_floor: float) -> tuple[Tensor, Tensor]:
    """(μ, σ_f) as float32 [D]: var = max(Σx²/n − μ², 1e-6), σ_f = max(√var, sigma_floor)."""
    if n <= 0:
        raise ValueError("target statistics need at least one target row; the shards hold none")
    mu = sum_x.double() / n                                              # [D]
    var = (sum_x2.double() / n - mu * mu).clamp_min(VAR_MIN)             # [D]
    sigma = var.sqrt().clamp_min(sigma_floor)                            # [D]
    return mu.float(), sigma.float()


def standardize(t: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    """(t − μ)/σ over the last dim."""
    return (t - mu) / sigma


def destandardize(p: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    """p·σ + μ: back to teacher scale (what the export fold bakes into out_proj)."""
    return p * sigma + mu


# ---------------------------------------------------------------- row math and the loss

def row_dot(a: Tensor, b: Tensor) -> Tensor:
    """Σ a·b over the last dim without an [..., D] temporary (2× the multiply-then-sum on the CPU)."""
    return torch.linalg.vecdot(a, b)


def row_cos(p: Tensor, t: Tensor, eps: float = COS_EPS) -> Tensor:
    """Cosine of each row, [..., D] → [...]; a zero row gives 0 and finite gradients."""
    p, t = at_least_f32(p), at_least_f32(t)
    return cos_of_sums(row_dot(p, t), row_dot(p, p), row_dot(t, t), eps)


def cos_of_sums(dot: Tensor, pp: Tensor, tt: Tensor, eps: float = COS_EPS) -> Tensor:
    """The cosine from a row's p·t, p·p and t·t (row_cos without the passes over the rows)."""
    # clamp the squared norms before the root so neither value nor gradient can be NaN
    return dot / (pp.clamp_min(eps * eps).sqrt() * tt.clamp_min(eps * eps).sqrt())


def row_cos_and_rms(p: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """(row_cos(p, t), row_cos(rms_norm(p), rms_norm(t))) from one set of row sums, [..., D] → [...] each.
    rms_norm scales a row by r = rsqrt(mean(x²) + RMS_EPS) > 0, so the second is the first with each norm
    scaled by its r before the COS_EPS clamp: the same numbers without the two normalized copies."""
    p, t = at_least_f32(p), at_least_f32(t)
    return cos_and_rms_of_sums(row_dot(p, t), row_dot(p, p), row_dot(t, t), p.shape[-1])


def cos_and_rms_of_sums(dot: Tensor, pp: Tensor, tt: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """row_cos_and_rms from a row's p·t, p·p and t·t, D = dim."""
    eps2 = COS_EPS * COS_EPS
    cos = dot / (pp.clamp_min(eps2).sqrt() * tt.clamp_min(eps2).sqrt())
    rp = torch.rsqrt(pp / dim + RMS_EPS)
    rt = torch.rsqrt(tt / dim + RMS_EPS)
    cos_rms = dot * rp * rt / ((pp * rp * rp).clamp_min(eps2).sqrt() * (tt * rt * rt).clamp_min(eps2).sqrt())
    return cos, cos_rms


def rms_norm(x: Tensor) -> Tensor:
    """x·rsqrt(mean(x²) + 1e-5) per row (§0.6); not centred, so cos_rms ≈ the raw cosine."""
    x = at_least_f32(x)
    return x * torch.rsqrt(row_dot(x, x)[..., None] / x.shape[-1] + RMS_EPS)


class _DistillRows(torch.autograd.Function):
    """distill_loss's arithmetic in a few passes over the [B, R, D] rows, with its gradient written out.

    Autograd over the plain formula keeps nine [B, R, D] temporaries and walks each back; at the
    PixArt demo geometry (8 × 120 × 4096) that was ~25 % of a train step on the CPU. Here the forward
    makes two (p − t and its 1/σ² weighting) and the row sums come from vecdot; the backward is
    dL/dp = a·(p − t)/σ² + b·t + c·p with per-row a, b, c:
        a = 2/(n·D),  b = −w/(n·|p|·|t|),  c = w·cos/(n·|p|²)  (0 where |p| is clamped at COS_EPS)
    on the rows kept (w = cos_weight, n = rows kept), 0 elsewhere.
    """

    @staticmethod
    def forward(ctx, p: Tensor, t: Tensor, inv_var: Tensor, rows: Tensor,  # type: ignore[override]
                cos_weight: float, err_weight: Tensor | None) -> tuple[Tensor, ...]:
        d = p - t                                                        # [B, R, D]
        dw = d * inv_var                                                 # [B, R, D]: (p − t)/σ²
        sq = row_dot(d, dw)                                                # [B, R]: Σ((p − t)/σ)²
        err = row_dot(d, d) if err_weight is None else row_dot(d * err_weight, d)  # [B, R], raw-space Σ(p − t)²
        dot, pp, tt = row_dot(p, t), row_dot(p, p), row_dot(t, t)              # [B, R]
        eps2 = COS_EPS * COS_EPS
        p_norm, t_norm = pp.clamp_min(eps2).sqrt(), tt.clamp_min(eps2).sqrt()
        cos = dot / (p_norm * t_norm)                                    # [B, R]
        zero = sq.new_zeros(())
        n = rows.sum().to(sq.dtype).clamp_min(1.0)                       # no sync, no 0/0
        mse = torch.where(rows, sq, zero).sum() / (n * p.shape[-1])
        miss = torch.where(rows, 1.0 - cos, zero).sum() / n              # = 1 − mean cos
        loss = mse + cos_weight * miss
        mean_cos = torch.where(rows, cos, zero).sum() / n
        err_sum, ref_sum = torch.where(rows, err, zero).sum(), torch.where(rows, tt, zero).sum()
        ctx.save_for_backward(p, t, dw, rows, cos, p_norm, t_norm, pp, n)
        ctx.cos_weight = cos_weight
        ctx.mark_non_differentiable(mse, mean_cos, err_sum, ref_sum)
        return loss, mse, mean_cos, err_sum, ref_sum

    @staticmethod
    def backward(ctx, grad: Tensor, *_unused: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        p, t, dw, rows, cos, p_norm, t_norm, pp, n = ctx.saved_tensors
        w, zero = ctx.cos_weight, cos.new_zeros(())
        a = torch.where(rows, 2.0 * grad / (n * p.shape[-1]), zero)      # [B, R]
        b = torch.where(rows, -w * grad / (n * p_norm * t_norm), zero)   # [B, R]
        c = torch.where(rows & (pp > COS_EPS * COS_EPS), w * grad * cos / (n * p_norm * p_norm), zero)
        grad_p = dw * a[..., None]                                       # [B, R, D]
        grad_p.addcmul_(t, b[..., None]).addcmul_(p, c[..., None])
        return grad_p, None, None, None, None, None


def distill_loss(pred: Tensor, target: Tensor, sigma: Tensor, mask: Tensor | None = None,
                 cos_weight: float = 0.5, err_weight: Tensor | None = None
                 ) -> tuple[Tensor, dict[str, Tensor]]:
    """Σ_m((p−t)/σ)²/(n_m·D) + cos_weight·(1 − mean_m cos(p, t)), in float32 or wider.

    pred, target [B, R, D]; sigma [D] (the floored σ_f); mask [B, R] bool, None = every row.
    The raw-target packs pass raw rows and σ_f. LLaDA (§1, standardized) passes the model
    output as pred_std, target = standardize(t, μ, σ_f), sigma = ones(D) and mask None, which
    is exactly mean-over-all-elements MSE + 0.5·(1 − mean row cos) in standardized space.
    A batch with no supervised row gives loss 0 (zero gradient), never NaN. parts holds the
    detached "mse", "cos" (masked mean cosine: the per-batch val_cos), and the sums of the
    rows kept "err" = Σ(p−t)²·err_weight (err_weight [D], None = 1: σ_f² gives a standardized
    pair's raw-space error) and "ref" = Σt², of which rel_mse is made.
    """
    _check(pred, target, mask)
    p, t = at_least_f32(pred), at_least_f32(target)                                    # [B, R, D]
    if mask is not None and p.device.type == "cpu" and not bool(mask.all()):
        # on the CPU the rows kept are gathered first: a vision pack's batch is half pads, and the passes
        # below cost more than the gather (on a GPU the selection would wait for the device)
        keep = mask.reshape(-1).nonzero().squeeze(1)                     # [N]
        p = p.reshape(-1, p.shape[-1]).index_select(0, keep)[None]       # [1, N, D]
        t = t.reshape(-1, t.shape[-1]).index_select(0, keep)[None]
        mask = None
    rows = torch.ones(p.shape[:-1], dtype=torch.bool, device=p.device) if mask is None else mask
    inv_var = at_least_f32(sigma).to(p.device).pow(-2)                          # [D]
    weight = None if err_weight is None else at_least_f32(err_weight).to(p)
    with torch.autocast(p.device.type, enabled=False):
        loss, mse, cos, err, ref = _DistillRows.apply(p, t, inv_var.to(p.dtype), rows, float(cos_weight), weight)
    return loss, {"mse": mse, "cos": cos, "err": err, "ref": ref}


def _sq_sums(p: Tensor, t: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """(Σ_m (p−t)², Σ_m t²) as 0-d float64 tensors: each row summed in the inputs' dtype (the same
    whatever batch the row is in), the rows in float64 — no float64 copy of whole batches."""
    d = p - t
    return masked_totals(row_dot(d, d).double(), row_dot(t, t).double(), mask)          # rows [B, R]


def masked_totals(err: Tensor, ref: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """(Σ_m err, Σ_m ref) of per-row sums over the rows mask keeps (all when None)."""
    if mask is not None:                    # where, not err[mask]: no wait for the GPU
        zero = err.new_zeros(())
        err, ref = torch.where(mask, err, zero), torch.where(mask, ref, zero)
    return err.sum(), ref.sum()


def rel_mse(pred: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
    """Σ_m(p−t)² / Σ_m t² over the rows mask keeps (all rows when None), a 0-d tensor."""
    _check(pred, target, mask)
    err, ref = _sq_sums(at_least_f32(pred), at_least_f32(target), mask)
    return ratio_of_totals(err, ref)


def ratio_of_totals(err: Tensor, ref: Tensor) -> Tensor:
    """rel_mse from its two totals."""
    return err / ref.clamp_min(torch.finfo(ref.dtype).tiny)


# ------------------------------------------------------------ streaming metrics (§0.6, §1–§4)

class PooledMean:
    """Σ totals / Σ counts over a stream, in float64: a pooled mean when count counts rows,
    a pooled ratio (rel_mse = Σ err / Σ ref) otherwise. value is None while count is 0."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0.0

    def add(self, total: float | Tensor, count: float | Tensor = 1) -> None:
        self.total += float(total)
        self.count += float(count)

    def add_values(self, values: Tensor) -> None:
        """Pool every element of values (e.g. the cosines of the selected rows)."""
        self.add(values.double().sum(), values.numel())

    @property
    def value(self) -> float | None:
        return self.total / self.count if self.count else None


def running_min(current: float | None, values: Tensor) -> float | None:
    if values.numel() == 0:
        return current
    low = float(values.min())
    return low if current is None else min(current, low)


def put_present(out: dict[str, float | int], name: str, value: float | None) -> None:
    if value is not None:   # a split with no rows is omitted, never written as 0
        out[name] = value


class ResamplerMetrics:
    """§1 (`_eval_resampler`): every metric is the per-batch mean over all rows, averaged over
    batches (one update() = one batch); worst_row_cos_rms is the lowest row over the set.
    mu [D] is the checkpoint's raw mean; pred, target, pred_ck are teacher-scale [B, R, D]."""

    def __init__(self, mu: Tensor) -> None:
        self.mu = at_least_f32(mu)
        self.means = {k: PooledMean() for k in
                      ("cos_centered", "cos_rms", "rel_mse", "cos_raw", "roundtrip_cos")}
        self.worst_row_cos_rms: float | None = None
        self.batches = 0

    def update(self, pred: Tensor, target: Tensor, pred_ck: Tensor | None = None) -> None:
        _check(pred, target)
        p, t = at_least_f32(pred), at_least_f32(target)                                # [B, R, D]
        mu = self.mu.to(p)
        # each row sum once (they are the metric's cost: [B, R, D] passes): t·t serves the raw cosines and
        # rel_mse, the centred prediction's norm both centred cosines — the same numbers as the helpers'
        tt = row_dot(t, t)
        cos_raw, cos_rms = cos_and_rms_of_sums(row_dot(p, t), row_dot(p, p), tt, p.shape[-1])   # [B, R] each
        centred, t_c = p - mu, t - mu
        cc = row_dot(centred, centred)
        self.means["cos_centered"].add(cos_of_sums(row_dot(centred, t_c), cc, row_dot(t_c, t_c)).mean())
        self.means["cos_rms"].add(cos_rms.mean())
        d = p - t
        err, ref = row_dot(d, d).double().sum(), tt.double().sum()
        self.means["rel_mse"].add(err / ref.clamp_min(torch.finfo(ref.dtype).tiny))
        self.means["cos_raw"].add(cos_raw.mean())
        if pred_ck is not None:
            _check(pred, pred_ck)
            ck = at_least_f32(pred_ck) - mu
            self.means["roundtrip_cos"].add(cos_of_sums(row_dot(centred, ck), cc, row_dot(ck, ck)).mean())
        self.worst_row_cos_rms = running_min(self.worst_row_cos_rms, cos_rms)
        self.batches += 1

    def result(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for name in ("cos_centered", "cos_rms"):
            put_present(out, name, self.means[name].value)
        put_present(out, "worst_row_cos_rms", self.worst_row_cos_rms)
        for name in ("rel_mse", "cos_raw", "roundtrip_cos"):
            put_present(out, name, self.means[name].value)
        out["val_batches"] = self.batches
        return out


def real_slots(seed_len: Tensor, slots: int) -> Tensor:
    """bool [B, slots]: True for the first seed_len[b] slots (EOS included)."""
    return torch.arange(slots, device=seed_len.device)[None, :] < seed_len[:, None]


class SeededMetrics:
    """§4 (`_eval_seeded`): pooled over the real slots of every sample seen. pred, target,
    pred_ck [B, Q, D] (pad slots ignored); seed_len [B] int in 1..Q (EOS included)."""

    def __init__(self) -> None:
        self.means = {k: PooledMean() for k in
                      ("cos", "cos_rms", "rel_mse", "cos_eos", "roundtrip_cos")}
        self.worst_row_cos: float | None = None
        self.batches = 0

    def update(self, pred: Tensor, target: Tensor, seed_len: Tensor,
               pred_ck: Tensor | None = None) -> None:
        _check(pred, target)
        p, t = at_least_f32(pred), at_least_f32(target)                                # [B, Q, D]
        batch, slots = p.shape[0], p.shape[1]
        seed_len = seed_len.to(device=p.device, dtype=torch.long)        # [B]
        if seed_len.shape != (batch,) or bool(((seed_len < 1) | (seed_len > slots)).any()):
            raise ValueError(f"seed_len must hold one length in 1..{slots} per sample, got "
                             f"{seed_len.tolist()}")
        real = real_slots(seed_len, slots)                               # [B, Q]
        cos, cos_rms = row_cos_and_rms(p, t)                             # [B, Q] each
        self.means["cos"].add_values(cos[real])
        self.means["cos_rms"].add_values(cos_rms[real])
        self.means["rel_mse"].add(*_sq_sums(p, t, real))
        self.means["cos_eos"].add_values(cos[torch.arange(batch, device=p.device), seed_len - 1])
        if pred_ck is not None:
            _check(pred, pred_ck)
            self.means["roundtrip_cos"].add_values(row_cos(p, pred_ck)[real])
        self.worst_row_cos = running_min(self.worst_row_cos, cos[real])
        self.batches += 1

    def result(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for name in ("cos", "cos_rms", "rel_mse"):
            put_present(out, name, self.means[name].value)
        put_present(out, "worst_row_cos", self.worst_row_cos)
        for name in ("cos_eos", "roundtrip_cos"):
            put_present(out, name, self.means[name].value)
        out["val_batches"] = self.batches
        return out


class TokenAlignedMetrics:
    """§2/§3 (`_eval_token_aligned`): cosines token-pooled over rows, rel_mse pooled over sup
    rows, cos_slice averaged over samples. Per update, all [B, L] bool unless noted:

    sup        supervised rows (MageFlow: every real token; Qwen-Image 2.1: consumed text)
    vision     image-slot rows (supervised or not); a sample with any is an "edit" sample
    sup_start  [B] int, where the engine's slice starts (MageFlow 64 edit / 34 t2i; Qwen 14)
    keep       real rows, for roundtrip_cos (None = sup)
    pred_ck    the checkpoint's prediction [B, L, D] for roundtrip_cos (raw cosine)
    """

    SPLITS = ("cos", "cos_vis", "cos_txt", "cos_edit", "cos_t2i")

    def __init__(self) -> None:
        self.means = {k: PooledMean() for k in
                      (*self.SPLITS, "rel_mse", "cos_slice", "roundtrip_cos")}
        self.worst_sample_cos_slice: float | None = None
        self.samples = 0
        self.batches = 0

    def update(self, pred: Tensor, target: Tensor, *, sup: Tensor, vision: Tensor,
               sup_start: Tensor, keep: Tensor | None = None,
               pred_ck: Tensor | None = None) -> None:
        _check(pred, target, sup)
        _check(pred, target, vision)
        p, t = at_least_f32(pred), at_least_f32(target)                                # [B, L, D]
        batch, length = p.shape[0], p.shape[1]
        cos = row_cos(p, t)                                              # [B, L]
        edit = vision.any(-1, keepdim=True)                              # [B, 1]
        splits = {"cos": sup, "cos_vis": sup & vision, "cos_txt": sup & ~vision,
                  "cos_edit": sup & edit, "cos_t2i": sup & ~edit}
        for name, rows in splits.items():
            self.means[name].add_values(cos[rows])
        self.means["rel_mse"].add(*_sq_sums(p, t, sup))

        start = sup_start.to(device=p.device, dtype=torch.long).reshape(batch, 1)  # [B, 1]
        in_slice = sup & (torch.arange(length, device=p.device)[None, :] >= start)  # [B, L]
        counts = in_slice.sum(-1)                                        # [B]
        sums = torch.where(in_slice, cos, cos.new_zeros(())).double().sum(-1)      # [B]
        per_sample = (sums / counts.clamp_min(1))[counts > 0]            # [B'] samples with rows
        self.means["cos_slice"].add_values(per_sample)
        self.worst_sample_cos_slice = running_min(self.worst_sample_cos_slice, per_sample)

        if pred_ck is not None:
            _check(pred, pred_ck, keep)
            rows = sup if keep is None else keep
            self.means["roundtrip_cos"].add_values(row_cos(p, pred_ck)[rows])
        self.samples += batch
        self.batches += 1

    def result(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for name in ("cos_slice", "cos_vis", "cos_txt", "cos_edit", "cos_t2i", "cos", "rel_mse"):
            put_present(out, name, self.means[name].value)
        put_present(out, "worst_sample_cos_slice", self.worst_sample_cos_slice)
        put_present(out, "roundtrip_cos", self.means["roundtrip_cos"].value)
        out["val_samples"] = self.samples
        out["val_batches"] = self.batches
        return out


def health_verdict(centered_cos: float) -> str:
    """One sentence judging an adapter's centred cosine against a teacher-conditioned engine
    context (§1): ≥ 0.96 healthy; around 0.87 the broken-RoPE signature."""
    c = float(centered_cos)
    if math.isnan(c):
        return "The centred cosine is not a number, so the adapter's output cannot be judged."
    if c >= HEALTHY_CENTERED_COS:
        return f"Centred cosine {c:.3f} against the teacher-conditioned engine context is healthy."
    low, high = BROKEN_ROPE_BAND
    if low <= c <= high:
        return (f"Centred cosine {c:.3f} is the broken-RoPE signature (teacher rotary tables "
                f"uninitialised; retrain on fresh shards).")
    return (f"Centred cosine {c:.3f} against the teacher-conditioned engine context is below "
            f"the healthy {HEALTHY_CENTERED_COS:.2f} and outside the broken-RoPE band around 0.87.")
