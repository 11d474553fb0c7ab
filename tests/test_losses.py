"""trainer_core.contract.losses against straightforward float64 reimplementations (numpy and loops)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer_core.contract.losses import (
    PooledMean, ResamplerMetrics, SeededMetrics, TokenAlignedMetrics, accumulate_stats,
    destandardize, distill_loss, health_verdict, real_slots, rel_mse, rms_norm, row_cos, row_cos_and_rms,
    standardize, target_stats,
)

B, R, D = 3, 5, 8


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def rand_mask(b: int, r: int, seed: int) -> torch.Tensor:
    mask = torch.rand(b, r, generator=torch.Generator().manual_seed(seed)) < 0.6
    mask[:, 0] = True   # every sample keeps at least one row
    return mask


# ---------------------------------------------------------------- references (float64, loops)

def ref_cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = math.sqrt(float(a @ a)), math.sqrt(float(b @ b))
    return float(a @ b) / (na * nb) if na and nb else 0.0


def ref_rms(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / math.sqrt(float((x * x).mean()) + 1e-5)


def ref_loss(p, t, sigma, mask, cos_weight) -> tuple[float, float, float]:
    p, t, s = p.double().numpy(), t.double().numpy(), sigma.double().numpy()
    sq, cos, n = 0.0, 0.0, 0
    for b in range(p.shape[0]):
        for r in range(p.shape[1]):
            if mask is None or mask[b, r]:
                sq += float((((p[b, r] - t[b, r]) / s) ** 2).sum())
                cos += ref_cos(p[b, r], t[b, r])
                n += 1
    mse, mean_cos = sq / (n * p.shape[2]), cos / n
    return mse + cos_weight * (1 - mean_cos), mse, mean_cos


def ref_rel_mse(p, t, mask) -> float:
    p, t = p.double().numpy(), t.double().numpy()
    keep = np.ones(p.shape[:-1], bool) if mask is None else mask.numpy()
    return float(((p - t) ** 2)[keep].sum() / (t ** 2)[keep].sum())


# ---------------------------------------------------------------- statistics

def test_target_stats_match_numpy_mean_and_std_over_the_kept_rows():
    rows = rand(4, 6, D, seed=1) * torch.linspace(0.01, 3.0, D) + 5.0   # [4, 6, D]
    mask = rand_mask(4, 6, seed=2)
    s, s2, n = accumulate_stats(rows, mask)
    mu, sigma = target_stats(s, s2, n, sigma_floor=0.03)
    kept = rows.double().numpy()[mask.numpy()]                          # [n, D]
    assert n == mask.sum().item() == kept.shape[0]
    assert mu.dtype == sigma.dtype == torch.float32
    np.testing.assert_allclose(mu.numpy(), kept.mean(0), rtol=1e-6)
    np.testing.assert_allclose(sigma.numpy(), np.maximum(kept.std(0), 0.03), rtol=1e-5)


def test_masked_out_rows_do_not_enter_the_statistics():
    rows, mask = rand(4, 6, D, seed=3), rand_mask(4, 6, seed=4)
    changed = rows.clone()
    changed[~mask] = 1e3
    for a, b in zip(accumulate_stats(rows, mask), accumulate_stats(changed, mask)):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def test_stats_add_up_over_shards():
    rows = rand(10, D, seed=5)
    s_a, s2_a, n_a = accumulate_stats(rows[:4])
    s_b, s2_b, n_b = accumulate_stats(rows[4:])
    s, s2, n = accumulate_stats(rows)
    assert s_a.dtype == torch.float64 and n_a + n_b == n == 10
    torch.testing.assert_close(s_a + s_b, s)
    torch.testing.assert_close(s2_a + s2_b, s2)


def test_sigma_floor_and_variance_floor():
    rows = torch.zeros(20, 3, dtype=torch.float64)
    rows[:, 0] = 7.0                                   # constant: variance clamps to 1e-6
    rows[:, 1] = torch.linspace(-0.01, 0.01, 20)       # std ≈ 0.006: below the σ floor
    rows[:, 2] = torch.linspace(-2.0, 2.0, 20)         # std ≈ 1.2: untouched
    s, s2, n = accumulate_stats(rows)
    _, floored = target_stats(s, s2, n, sigma_floor=0.03)
    _, unfloored = target_stats(s, s2, n, sigma_floor=0.0)
    std2 = float(rows[:, 2].numpy().std())
    np.testing.assert_allclose(floored.numpy(), [0.03, 0.03, std2], rtol=1e-5)
    np.testing.assert_allclose(unfloored.numpy(), [1e-3, float(rows[:, 1].numpy().std()), std2],
                               rtol=1e-4)
    with pytest.raises(ValueError):
        target_stats(s, s2, 0, sigma_floor=0.03)


def test_standardize_round_trip():
    t, mu, sigma = rand(B, R, D, seed=6), rand(D, seed=7), rand(D, seed=8).abs() + 0.1
    std = standardize(t, mu, sigma)
    np.testing.assert_allclose(std.numpy(), (t.numpy() - mu.numpy()) / sigma.numpy(), rtol=1e-6)
    torch.testing.assert_close(destandardize(std, mu, sigma), t)


# ---------------------------------------------------------------- row math, loss, rel_mse

def test_row_cos_and_rms_norm_match_loops():
    p, t = rand(B, R, D, seed=9), rand(B, R, D, seed=10)
    cos, normed = row_cos(p, t), rms_norm(p)
    assert cos.shape == (B, R)
    for b in range(B):
        for r in range(R):
            assert cos[b, r].item() == pytest.approx(ref_cos(p[b, r], t[b, r]), abs=1e-6)
            np.testing.assert_allclose(normed[b, r].numpy(), ref_rms(p[b, r]), rtol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_distill_loss_matches_reference(masked):
    p, t = rand(B, R, D, seed=11), rand(B, R, D, seed=12)
    sigma, mask = rand(D, seed=13).abs() + 0.2, rand_mask(B, R, seed=14) if masked else None
    loss, parts = distill_loss(p, t, sigma, mask, cos_weight=0.5)
    want, mse, mean_cos = ref_loss(p, t, sigma, mask, 0.5)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert parts["mse"].item() == pytest.approx(mse, rel=1e-5)
    assert parts["cos"].item() == pytest.approx(mean_cos, abs=1e-6)


def plain_loss(p, t, sigma, mask, cos_weight):
    """The loss as one autograd formula (float64): what the hand-written gradient must equal."""
    keep = torch.ones(p.shape[:-1], dtype=torch.bool) if mask is None else mask
    sq = (((p - t) / sigma) ** 2).sum(-1)
    cos = (p * t).sum(-1) / ((p * p).sum(-1).clamp_min(1e-16).sqrt() * (t * t).sum(-1).clamp_min(1e-16).sqrt())
    n = keep.sum().clamp_min(1)
    return sq[keep].sum() / (n * p.shape[-1]) + cos_weight * (1 - cos[keep]).sum() / n


@pytest.mark.parametrize("masked", [False, True])
def test_distill_loss_gradient_equals_autograd_of_the_plain_formula(masked):
    p, t = rand(B, R, D, seed=40).double(), rand(B, R, D, seed=41).double()
    t[1, 2] = 0.0                                   # a zero target row
    p[2, 3] = 1e-12                                 # a prediction row under the norm clamp
    sigma, mask = rand(D, seed=42).double().abs() + 0.2, rand_mask(B, R, seed=43) if masked else None
    ours, plain = p.clone().requires_grad_(), p.clone().requires_grad_()
    distill_loss(ours, t, sigma, mask, cos_weight=0.7)[0].mul(3.0).backward()
    plain_loss(plain, t, sigma, mask, 0.7).mul(3.0).backward()
    torch.testing.assert_close(ours.grad, plain.grad, rtol=1e-9, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: distill_loss(x, t, sigma, mask, 0.7)[0],
                                    (rand(B, R, D, seed=44).double().requires_grad_(),))


def test_distill_loss_error_sums_give_rel_mse_raw_and_standardized():
    p, t = rand(B, R, D, seed=45), rand(B, R, D, seed=46)
    sigma, mu, mask = rand(D, seed=47).abs() + 0.2, rand(D, seed=48), rand_mask(B, R, seed=49)
    _, parts = distill_loss(p, t, sigma, mask)
    assert (parts["err"] / parts["ref"]).item() == pytest.approx(ref_rel_mse(p, t, mask), rel=1e-5)
    # a standardized pair with err_weight = σ²: the raw-space error of p·σ + μ against t
    _, parts = distill_loss(p, standardize(t, mu, sigma), torch.ones(D), None, err_weight=sigma * sigma)
    want = float(((destandardize(p, mu, sigma).double() - t.double()) ** 2).sum())
    assert parts["err"].item() == pytest.approx(want, rel=1e-5)


def test_row_cos_and_rms_is_both_cosines_from_one_set_of_row_sums():
    p, t = rand(B, R, D, seed=50), rand(B, R, D, seed=51) * 3.0
    p[0, 0], t[1, 1] = 0.0, 0.0                     # zero rows: cosine 0 in both
    p[2, 2] = 1e-9                                  # a row whose norm is under the clamp
    cos, cos_rms = row_cos_and_rms(p, t)
    torch.testing.assert_close(cos, row_cos(p, t), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(cos_rms, row_cos(rms_norm(p), rms_norm(t)), rtol=1e-6, atol=1e-7)
    for b, r in ((0, 3), (1, 0)):
        assert cos_rms[b, r].item() == pytest.approx(ref_cos(ref_rms(p[b, r]), ref_rms(t[b, r])), abs=1e-6)


def test_distill_loss_ignores_masked_rows_and_none_means_all():
    p, t, sigma = rand(B, R, D, seed=15), rand(B, R, D, seed=16), torch.ones(D)
    mask = rand_mask(B, R, 17)
    p2, t2 = p.clone(), t.clone()
    p2[~mask], t2[~mask] = 50.0, -3.0
    assert distill_loss(p2, t2, sigma, mask)[0].item() == distill_loss(p, t, sigma, mask)[0].item()
    everything = torch.ones(B, R, dtype=torch.bool)
    assert distill_loss(p, t, sigma, None)[0].item() == pytest.approx(
        distill_loss(p, t, sigma, everything)[0].item(), rel=1e-6)


def test_standardized_case_is_elementwise_mean_plus_cos():
    p, t = rand(B, R, D, seed=18), rand(B, R, D, seed=19)
    loss, _ = distill_loss(p, t, torch.ones(D), None, cos_weight=0.5)
    pn, tn = p.double().numpy(), t.double().numpy()
    rows = [ref_cos(pn[b, r], tn[b, r]) for b in range(B) for r in range(R)]
    want = float(((pn - tn) ** 2).mean()) + 0.5 * (1 - float(np.mean(rows)))
    assert loss.item() == pytest.approx(want, rel=1e-5)


def test_perfect_prediction_gives_zero_loss_cos_one_rel_mse_zero():
    t, mask = rand(B, R, D, seed=20), rand_mask(B, R, seed=21)
    loss, parts = distill_loss(t.clone(), t, torch.full((D,), 0.5), mask)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    assert parts["cos"].item() == pytest.approx(1.0, abs=1e-6)
    assert rel_mse(t.clone(), t, mask).item() == 0.0


def test_zero_prediction_loss_by_hand():
    t = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [9.0, 9.0]]])          # [1, 3, 2]
    sigma, mask = torch.tensor([0.5, 2.0]), torch.tensor([[True, True, False]])
    # cos(0, t) = 0 on both kept rows; Σ t²/σ² = (4 + 1) + (36 + 0) = 41 over n_m·D = 2·2
    loss, parts = distill_loss(torch.zeros_like(t), t, sigma, mask, cos_weight=0.5)
    assert loss.item() == pytest.approx(0.5 * 1 + 41 / 4, rel=1e-6)
    assert parts["cos"].item() == 0.0


def test_bf16_inputs_are_computed_in_float32():
    p, t = rand(B, R, D, seed=22).bfloat16(), rand(B, R, D, seed=23).bfloat16()
    loss, _ = distill_loss(p, t, torch.ones(D), None)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(ref_loss(p.float(), t.float(), torch.ones(D), None, 0.5)[0],
                                        rel=1e-5)


def test_zero_rows_and_empty_masks_stay_finite():
    p, t = rand(B, R, D, seed=24).requires_grad_(), rand(B, R, D, seed=25)
    t = t.clone()
    t[0, 1] = 0.0
    with torch.no_grad():
        p[0, 1] = 0.0
        p[1, 2] = 0.0
    loss, _ = distill_loss(p, t, torch.ones(D), None)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(p.grad).all()
    assert row_cos(torch.zeros(2, D), torch.zeros(2, D)).tolist() == [0.0, 0.0]
    none = torch.zeros(B, R, dtype=torch.bool)
    loss, parts = distill_loss(p, t, torch.ones(D), none)
    assert loss.item() == 0.0 and parts["cos"].item() == 0.0


@pytest.mark.parametrize("masked", [False, True])
def test_rel_mse_matches_reference(masked):
    p, t = rand(B, R, D, seed=26), rand(B, R, D, seed=27)
    mask = rand_mask(B, R, seed=28) if masked else None
    assert rel_mse(p, t, mask).item() == pytest.approx(ref_rel_mse(p, t, mask), rel=1e-5)


def test_shape_mistakes_are_reported():
    with pytest.raises(ValueError, match="differ in shape"):
        distill_loss(rand(B, R, D), rand(B, R + 1, D), torch.ones(D))
    with pytest.raises(ValueError, match="mask"):
        rel_mse(rand(B, R, D), rand(B, R, D), torch.ones(B, R))       # float, not bool


def test_pooled_mean():
    pooled = PooledMean()
    assert pooled.value is None
    pooled.add_values(torch.tensor([1.0, 2.0]))
    pooled.add(6.0, 1)
    assert pooled.value == 3.0


# ---------------------------------------------------------------- resampler metrics (§1)

def resampler_batches(sizes=(3, 2, 1), rows=4):
    mu = rand(D, seed=30) * 2
    return mu, [(rand(n, rows, D, seed=31 + i) + mu, rand(n, rows, D, seed=41 + i) + mu,
                 rand(n, rows, D, seed=51 + i) + mu) for i, n in enumerate(sizes)]


def ref_resampler(mu, batches) -> dict:
    mu = mu.double().numpy()
    names = ("cos_raw", "cos_rms", "cos_centered", "rel_mse", "roundtrip_cos")
    per_batch: dict[str, list[float]] = {k: [] for k in names}
    worst = math.inf
    for p, t, ck in batches:
        rows = [(p[b, r].double().numpy(), t[b, r].double().numpy(), ck[b, r].double().numpy())
                for b in range(p.shape[0]) for r in range(p.shape[1])]
        rms = [ref_cos(ref_rms(a), ref_rms(c)) for a, c, _ in rows]
        per_batch["cos_raw"].append(np.mean([ref_cos(a, c) for a, c, _ in rows]))
        per_batch["cos_rms"].append(np.mean(rms))
        per_batch["cos_centered"].append(np.mean([ref_cos(a - mu, c - mu) for a, c, _ in rows]))
        per_batch["rel_mse"].append(sum(((a - c) ** 2).sum() for a, c, _ in rows)
                                    / sum((c ** 2).sum() for _, c, _ in rows))
        per_batch["roundtrip_cos"].append(np.mean([ref_cos(a - mu, k - mu) for a, _, k in rows]))
        worst = min(worst, *rms)
    out = {k: float(np.mean(v)) for k, v in per_batch.items()}
    return {**out, "worst_row_cos_rms": worst, "val_batches": len(batches)}


def assert_same(got: dict, want: dict, tol: float = 1e-5) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=tol), key


def test_resampler_metrics_are_per_batch_means_averaged_over_batches():
    mu, batches = resampler_batches()
    metrics = ResamplerMetrics(mu)
    for p, t, ck in batches:
        metrics.update(p, t, ck)
    assert_same(metrics.result(), ref_resampler(mu, batches))


def test_resampler_without_checkpoint_prediction_omits_roundtrip():
    mu, batches = resampler_batches(sizes=(2,))
    metrics = ResamplerMetrics(mu)
    metrics.update(batches[0][0], batches[0][1])
    assert "roundtrip_cos" not in metrics.result()
    assert ResamplerMetrics(mu).result() == {"val_batches": 0}


# ---------------------------------------------------------------- seeded metrics (§4)

Q = 6


def seeded_batches(sizes=(3, 2, 4)):
    out = []
    for i, n in enumerate(sizes):
        seed_len = torch.randint(1, Q + 1, (n,), generator=torch.Generator().manual_seed(60 + i))
        out.append((rand(n, Q, D, seed=61 + i), rand(n, Q, D, seed=71 + i), seed_len,
                    rand(n, Q, D, seed=81 + i)))
    return out


def ref_seeded(batches) -> dict:
    cos, rms, eos, trip, err, ref = [], [], [], [], 0.0, 0.0
    for p, t, seed_len, ck in batches:
        for b in range(p.shape[0]):
            n = int(seed_len[b])
            for q in range(n):
                a, c, k = (x[b, q].double().numpy() for x in (p, t, ck))
                cos.append(ref_cos(a, c))
                rms.append(ref_cos(ref_rms(a), ref_rms(c)))
                trip.append(ref_cos(a, k))
                err += float(((a - c) ** 2).sum())
                ref += float((c ** 2).sum())
            eos.append(ref_cos(p[b, n - 1].double().numpy(), t[b, n - 1].double().numpy()))
    return {"cos": np.mean(cos), "cos_rms": np.mean(rms), "rel_mse": err / ref,
            "worst_row_cos": min(cos), "cos_eos": np.mean(eos), "roundtrip_cos": np.mean(trip),
            "val_batches": len(batches)}


def test_seeded_metrics_pool_over_real_slots():
    batches = seeded_batches()
    metrics = SeededMetrics()
    for p, t, seed_len, ck in batches:
        metrics.update(p, t, seed_len, ck)
    assert_same(metrics.result(), ref_seeded(batches))


def test_seeded_streaming_equals_one_shot_on_the_concatenation():
    batches = seeded_batches()
    streamed, whole = SeededMetrics(), SeededMetrics()
    for p, t, seed_len, ck in batches:
        streamed.update(p, t, seed_len, ck)
    whole.update(*(torch.cat(parts) for parts in zip(*batches)))
    got, want = streamed.result(), whole.result()
    assert got.pop("val_batches") == 3 and want.pop("val_batches") == 1
    assert_same(got, want, tol=1e-9)


def test_seeded_pad_slots_change_nothing_and_cos_eos_is_the_last_real_slot():
    t = rand(3, Q, D, seed=90)
    seed_len = torch.tensor([1, 4, Q])
    p = -t.clone()                                  # every real slot wrong (cos −1) ...
    for b, n in enumerate(seed_len.tolist()):
        p[b, n - 1] = t[b, n - 1]                   # ... except the EOS slot (cos 1)
        p[b, n:] = t[b, n:]                         # pads perfect: they must not count
    got = SeededMetrics()
    got.update(p, t, seed_len)
    result = got.result()
    assert result["cos_eos"] == pytest.approx(1.0, abs=1e-6)
    assert result["worst_row_cos"] == pytest.approx(-1.0, abs=1e-6)
    real = 1 + 4 + Q
    assert result["cos"] == pytest.approx((3 - (real - 3)) / real, abs=1e-6)
    assert real_slots(seed_len, Q).sum().item() == real
    garbage = p.clone()
    garbage[~real_slots(seed_len, Q)] = 123.0
    again = SeededMetrics()
    again.update(garbage, t, seed_len)
    assert again.result() == result


def test_seeded_rejects_lengths_outside_the_window():
    with pytest.raises(ValueError, match="seed_len"):
        SeededMetrics().update(rand(2, Q, D), rand(2, Q, D), torch.tensor([0, 3]))


# ---------------------------------------------------------------- token-aligned metrics (§2/§3)

L = 12


def token_batch(seed: int, n: int = 4, with_vision=(True, False, True, False), sup_vision=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, L + 1, (n,), generator=g)
    keep = torch.arange(L)[None, :] < lengths[:, None]                  # [n, L]
    vision = torch.zeros(n, L, dtype=torch.bool)
    for b in range(n):
        if with_vision[b]:
            vision[b, 2:5] = True                                       # an image span
    sup = keep if sup_vision else keep & ~vision
    sup_start = torch.randint(0, 5, (n,), generator=g)
    return dict(pred=rand(n, L, D, seed=seed + 1), target=rand(n, L, D, seed=seed + 2),
                sup=sup, vision=vision, sup_start=sup_start, keep=keep,
                pred_ck=rand(n, L, D, seed=seed + 3))


def ref_token_aligned(batches) -> dict:
    names = ("cos", "cos_vis", "cos_txt", "cos_edit", "cos_t2i")
    split: dict[str, list[float]] = {k: [] for k in names}
    slices, trip, err, ref, samples = [], [], 0.0, 0.0, 0
    for x in batches:
        p, t, ck = (x[k].double().numpy() for k in ("pred", "target", "pred_ck"))
        for b in range(p.shape[0]):
            samples += 1
            edit = bool(x["vision"][b].any())
            in_slice = []
            for i in range(L):
                c = ref_cos(p[b, i], t[b, i])
                if x["keep"][b, i]:
                    trip.append(ref_cos(p[b, i], ck[b, i]))
                if not x["sup"][b, i]:
                    continue
                split["cos"].append(c)
                split["cos_vis" if x["vision"][b, i] else "cos_txt"].append(c)
                split["cos_edit" if edit else "cos_t2i"].append(c)
                err += float(((p[b, i] - t[b, i]) ** 2).sum())
                ref += float((t[b, i] ** 2).sum())
                if i >= int(x["sup_start"][b]):
                    in_slice.append(c)
            if in_slice:
                slices.append(np.mean(in_slice))
    out = {k: float(np.mean(v)) for k, v in split.items() if v}
    out.update(rel_mse=err / ref, roundtrip_cos=np.mean(trip), val_samples=samples,
               val_batches=len(batches))
    if slices:
        out.update(cos_slice=np.mean(slices), worst_sample_cos_slice=min(slices))
    return out


def run_token_aligned(batches) -> dict:
    metrics = TokenAlignedMetrics()
    for x in batches:
        metrics.update(x["pred"], x["target"], sup=x["sup"], vision=x["vision"],
                       sup_start=x["sup_start"], keep=x["keep"], pred_ck=x["pred_ck"])
    return metrics.result()


@pytest.mark.parametrize("sup_vision", [True, False], ids=["mageflow", "qwen_image"])
def test_token_aligned_metrics_match_reference(sup_vision):
    batches = [token_batch(100 + 10 * i, sup_vision=sup_vision) for i in range(3)]
    assert_same(run_token_aligned(batches), ref_token_aligned(batches))


def test_token_aligned_streaming_equals_one_shot_on_the_concatenation():
    batches = [token_batch(200 + 10 * i) for i in range(3)]
    whole = {k: torch.cat([x[k] for x in batches]) for k in batches[0]}
    got, want = run_token_aligned(batches), run_token_aligned([whole])
    assert got.pop("val_batches") == 3 and want.pop("val_batches") == 1
    assert_same(got, want, tol=1e-9)


def test_token_aligned_omits_empty_splits():
    text_only = run_token_aligned([token_batch(300, with_vision=(False,) * 4)])
    assert "cos_vis" not in text_only and "cos_edit" not in text_only
    assert text_only["cos_t2i"] == pytest.approx(text_only["cos"], abs=1e-12)
    qwen = run_token_aligned([token_batch(310, sup_vision=False)])        # slots never supervised
    assert "cos_vis" not in qwen and {"cos_edit", "cos_t2i"} <= set(qwen)
    assert qwen["cos_txt"] == pytest.approx(qwen["cos"], abs=1e-12)
    x = token_batch(320)
    x["sup"] = torch.zeros_like(x["sup"])                                 # nothing supervised
    nothing = run_token_aligned([x])
    assert set(nothing) == {"roundtrip_cos", "val_samples", "val_batches"}


def test_cos_slice_starts_at_each_samples_own_start_and_worst_is_the_minimum():
    t = rand(2, L, D, seed=400)
    p = -t.clone()                                          # wrong before the start ...
    starts = torch.tensor([3, 7])
    p[0, 3:] = t[0, 3:]                                     # ... sample 0 right from 3
    p[1, 7:] = t[1, 7:]
    p[1, 9] = -t[1, 9]                                      # sample 1: 4 of 5 right
    sup = torch.ones(2, L, dtype=torch.bool)
    metrics = TokenAlignedMetrics()
    metrics.update(p, t, sup=sup, vision=torch.zeros_like(sup), sup_start=starts)
    result = metrics.result()
    sample1 = (4 - 1) / 5
    assert result["cos_slice"] == pytest.approx((1.0 + sample1) / 2, abs=1e-6)
    assert result["worst_sample_cos_slice"] == pytest.approx(sample1, abs=1e-6)
    assert "roundtrip_cos" not in result


# ---------------------------------------------------------------- health verdict

@pytest.mark.parametrize("value, phrase", [
    (0.97, "is healthy"), (0.96, "is healthy"), (0.87, "is the broken-RoPE signature"),
    (0.80, "is the broken-RoPE signature"), (0.94, "0.940"), (0.5, "0.500"),
    (float("nan"), "not a number"),
])
def test_health_verdict_is_one_sentence(value, phrase):
    verdict = health_verdict(value)
    assert phrase in verdict and verdict.endswith(".") and verdict.count(". ") == 0
    assert ("is healthy" in verdict) == (value >= 0.96)
    assert ("is the broken-RoPE signature" in verdict) == (0.80 <= value <= 0.92)
    if "signature" in phrase:
        assert "retrain on fresh shards" in verdict
