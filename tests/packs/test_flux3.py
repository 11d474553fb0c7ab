"""FLUX.3 Klein (qwen3vl_flux3, packs-contract-more §D.3): the template ids with the real Qwen BPE, the
teacher against a plain transformers forward of a tiny random Qwen3-VL, the student's padded rows,
the layerwise shard layout and its expansion, the per-tap statistics and loss, and the layerwise GGUF
against an independent numpy reading of the file."""
from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from numpy_adapters import gguf_tensors, token_aligned_forward as layerwise_forward
from trainer_core.base.errors import ModelFileError
from trainer_core.contract.kinds import AdapterConfig, build_adapter
from trainer_core.contract.gguf_io import (LayoutProblem, Provenance, detect_layout, read_adapter_gguf,
                                           write_adapter_gguf)
from trainer_core.contract.objective import batch_loss
from trainer_core.contract.shards import write_shard
from trainer_core.contract.stream import Batch, ShardRows, collate, val_batches
from trainer_core.contract.tap_losses import layerwise_loss, relative_sigma
from trainer_core.packs.base import Budgets
from trainer_core.packs.qwen3vl_flux3 import PACK
from trainer_core.packs.common.flux3_klein import taps_for
from trainer_core.packs.common.qwen3vl.taps_teacher import MockTapsTeacher, TapsTeacher
from trainer_core.packs.common.qwen_chat import PREFIX, PREFIX_IDS, SUFFIX, SUFFIX_IDS

PAD = 151643
PROMPTS = ("", "a sheep in sunglasses", "café ☕ 日本語", "Add snow, heavy",
           "  leading spaces\nand a newline", "a red fox, oil painting, golden hour, 35mm, highly detailed")


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def qwen3vl(tmp_path_factory):
    from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
    return write_tiny_qwen3vl(tmp_path_factory.mktemp("qwen3vl"), layers=9)


@pytest.fixture(scope="module")
def teacher(qwen3vl):
    return TapsTeacher(qwen3vl, taps_of=taps_for, family="FLUX.3 Klein", device="cpu", mode="auto",
                       dtype=torch.float32)


@pytest.fixture(scope="module")
def plain_lm(qwen3vl):
    """Hugging Face's own Qwen3-VL text stack, all 9 layers (nothing dropped), float32."""
    from transformers import AutoModel
    model = AutoModel.from_pretrained(qwen3vl, dtype=torch.float32)
    return model.language_model.eval()


def body_ids(hf: Tokenizer, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


def template_ids(hf: Tokenizer, text: str) -> list[int]:
    """The template ids built by hand: the verified prefix / suffix ids around the HF body encoding."""
    return [*PREFIX_IDS, *body_ids(hf, text), *SUFFIX_IDS]


# ---------------------------------------------------------------- template

def test_taps_spread_eight_layers_over_the_depth():
    assert taps_for(36) == (4, 8, 12, 16, 20, 24, 28, 32)
    assert taps_for(9) == (1, 2, 3, 4, 5, 6, 7, 8)
    assert taps_for(18) == (2, 4, 6, 8, 10, 12, 14, 16)
    with pytest.raises(ModelFileError, match="at least 9"):
        taps_for(8)


def test_the_template_pieces_have_the_engines_ids(engine, hf_tokenizer):
    for encode in (engine.encode, lambda s: body_ids(hf_tokenizer, s)):
        assert list(encode(PREFIX)) == [151644, 872, 198] == list(PREFIX_IDS)
        assert list(encode(SUFFIX)) == [151645, 198, 151644, 77091, 198] == list(SUFFIX_IDS)


@pytest.mark.parametrize("text", PROMPTS)
def test_template_ids_equal_the_tokenizers_encoding_of_the_template_string(text, engine, hf_tokenizer):
    ids = engine.encode_chunks(PACK.student_chunks(text))
    assert ids == body_ids(hf_tokenizer, PREFIX + text + SUFFIX)
    assert ids == template_ids(hf_tokenizer, text)
    if text == "":
        assert len(ids) == 8                       # the empty prompt is the template alone, 8 real rows


def test_emphasis_syntax_is_stripped_before_tokenizing(engine, hf_tokenizer):
    from trainer_core.contract.prompt_attention import parse_prompt_attention
    assert [c for c, _ in parse_prompt_attention("(red:1.3) car")] == ["red", " car"]
    ids = engine.encode_chunks(PACK.student_chunks("(red:1.3) car"))
    assert ids == body_ids(hf_tokenizer, PREFIX + "red car" + SUFFIX)
    assert ids == engine.encode_chunks(PACK.student_chunks("red car"))
    # the literal parentheses would be other tokens: the parse matters
    assert ids != body_ids(hf_tokenizer, PREFIX + "(red:1.3) car" + SUFFIX)


# ---------------------------------------------------------------- teacher

def plain_taps(lm, token_lists: list[list[int]], length: int, taps: tuple[int, ...]) -> torch.Tensor:
    """[B, length, 8·H]: the samples right-padded with 151643 to `length`, real rows at positions 0…n−1,
    pads at 1 on the three M-RoPE axes and masked as keys; hidden_states[k] stacked for k in taps."""
    B = len(token_lists)
    ids = torch.full((B, length), PAD, dtype=torch.long)
    mask = torch.zeros(B, length, dtype=torch.long)
    pos = torch.ones(B, length, dtype=torch.long)
    for b, tokens in enumerate(token_lists):
        n = len(tokens)
        ids[b, :n] = torch.tensor(tokens)
        mask[b, :n] = 1
        pos[b, :n] = torch.arange(n)
    with torch.no_grad():
        out = lm(input_ids=ids, attention_mask=mask, position_ids=pos[None].expand(3, B, length),
                 output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[k] for k in taps], dim=-1)


@pytest.fixture(scope="module")
def teacher_tokens(hf_tokenizer):
    texts = ("", "a sheep in sunglasses", "a red fox, oil painting, golden hour, 35mm, highly detailed")
    tokens = [template_ids(hf_tokenizer, t) for t in texts]
    assert len({len(t) for t in tokens}) == 3
    return tokens


def test_the_teacher_is_the_plain_forwards_stacked_taps(teacher, plain_lm, teacher_tokens):
    assert teacher.taps == (1, 2, 3, 4, 5, 6, 7, 8) and teacher.out_dim == 8 * 64
    got = teacher.hidden(teacher_tokens)
    longest = max(len(t) for t in teacher_tokens)
    want = plain_taps(plain_lm, teacher_tokens, longest + 1, teacher.taps)
    for b, tokens in enumerate(teacher_tokens):
        assert got[b].shape == (len(tokens) + 1, 512) and got[b].dtype == torch.float32
        torch.testing.assert_close(got[b], want[b, :len(tokens) + 1], atol=1e-5, rtol=1e-5)
    # tap-major: dims [64·i, 64·(i+1)) are hidden_states[taps[i]], and the deepest tap differs from the first
    assert not torch.allclose(got[0][:, :64], got[0][:, -64:], atol=1e-3)


def test_the_teacher_on_one_prompt_alone(teacher, plain_lm, teacher_tokens):
    for tokens in teacher_tokens:
        (got,) = teacher.hidden([tokens])
        want = plain_taps(plain_lm, [tokens], len(tokens) + 1, teacher.taps)[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_all_pads_of_a_sample_are_one_state_and_padding_leaves_the_real_rows(teacher, plain_lm, teacher_tokens):
    stored = teacher.hidden(teacher_tokens)
    full = plain_taps(plain_lm, teacher_tokens, 80, teacher.taps)                  # every sample < 80 rows
    for b, tokens in enumerate(teacher_tokens):
        n = len(tokens)
        pads = full[b, n:]
        assert pads.shape[0] == 80 - n >= 2
        torch.testing.assert_close(pads, pads[:1].expand_as(pads), atol=1e-6, rtol=0)
        torch.testing.assert_close(stored[b][n], pads[0], atol=1e-5, rtol=1e-5)   # storing one pad is lossless
        alone = plain_taps(plain_lm, [tokens], n, teacher.taps)[0]                  # no pad at all
        torch.testing.assert_close(full[b, :n], alone, atol=1e-5, rtol=1e-5)
    # the pad state depends on the sample (it attends to the sample's real rows)
    assert not torch.allclose(full[0, -1], full[1, -1], atol=1e-3)


def test_the_pad_position_matters(plain_lm, teacher_tokens, teacher):
    """Pads at their index instead of position 1 give other states: the contract's position 1 is tested."""
    tokens = teacher_tokens[1]
    n, L = len(tokens), 80
    ids = torch.tensor([tokens + [PAD] * (L - n)])
    mask = torch.tensor([[1] * n + [0] * (L - n)])
    with torch.no_grad():
        out = plain_lm(input_ids=ids, attention_mask=mask, position_ids=torch.arange(L)[None, None].expand(3, 1, L),
                       output_hidden_states=True, use_cache=False)
    at_index = torch.cat([out.hidden_states[k] for k in teacher.taps], -1)[0]
    (stored,) = teacher.hidden([tokens])
    assert not torch.allclose(at_index[n], stored[n], atol=1e-3)


# ---------------------------------------------------------------- student

def _cat_prompt(engine, n_real: int) -> str:
    """A prompt whose template is exactly n_real tokens ("cat" + k × " cat")."""
    text = "cat" + " cat" * (n_real - 9)
    assert len(engine.encode_chunks(PACK.student_chunks(text))) == n_real
    return text


@pytest.mark.parametrize("n_real", [None, 80, 81])
def test_student_states_are_the_engines_padded_rows(student, engine, n_real):
    text = "a sheep in sunglasses" if n_real is None else _cat_prompt(engine, n_real)
    ids = engine.encode_chunks(PACK.student_chunks(text))
    n = len(ids)
    rows = PACK.student_states(student, text)
    assert isinstance(rows, np.ndarray) and rows.shape == (math.ceil(n / 80) * 80, 64)
    alone = student.hidden(torch.tensor([ids]), torch.ones(1, n, dtype=torch.bool))[0].numpy()
    np.testing.assert_allclose(rows[:n], alone, atol=1e-5, rtol=1e-5)
    pads = rows[n:]
    if n % 80 == 0:
        assert pads.shape[0] == 0
    else:
        assert pads.shape[0] >= 2
        np.testing.assert_allclose(pads, np.broadcast_to(pads[:1], pads.shape), atol=1e-6, rtol=0)
        # what make_shard stores for the sample (padded to n + 1) is that same pad row
        batch = torch.tensor([ids + [PAD]])
        positions = torch.tensor([list(range(n)) + [1]])
        stored = student.hidden(batch, batch != PAD, positions)[0, n].numpy()
        np.testing.assert_allclose(pads[0], stored, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- shards

def test_make_shard_stores_the_real_rows_and_one_pad_row(student, hf_tokenizer):
    taps = (1, 2, 3, 4, 5, 6, 7, 8)
    teacher = MockTapsTeacher(8 * 16, taps)
    prompts = ["a red fox, oil painting, golden hour", "", "(red:1.3) car", "a sheep in sunglasses", "x"]
    budgets = Budgets(teacher_batch=2, tok_budget=4096, student_batch=3, student_tok_budget=4096)
    tensors, extra = PACK.make_shard(prompts, student, teacher, budgets)
    order = extra["prompts"]
    assert sorted(order) == sorted(prompts)
    body = {p: body_ids(hf_tokenizer, "red car" if p == "(red:1.3) car" else p) for p in prompts}
    want_ids = [[*PREFIX_IDS, *body[p], *SUFFIX_IDS] for p in order]
    n_real = [len(t) for t in want_ids]
    assert n_real == sorted(n_real)                                         # sorted by length
    assert tensors["n_real"].tolist() == n_real
    assert tensors["len"].tolist() == tensors["t_len"].tolist() == [n + 1 for n in n_real]
    assert tensors["ids"].tolist() == [i for t in want_ids for i in (*t, PAD)]
    T = sum(n + 1 for n in n_real)
    assert tensors["t_pack"].shape == (T, 128) and tensors["q_pack"].shape == (T, 64)
    assert tensors["t_pack"].dtype == tensors["q_pack"].dtype == torch.bfloat16
    assert tensors["pad_multiple"].tolist() == [80] and tensors["n_taps"].tolist() == [8]
    t64 = tensors["t_pack"].double()
    assert torch.equal(tensors["stat_s"], t64.sum(0)) and torch.equal(tensors["stat_s2"], (t64 * t64).sum(0))
    assert tensors["stat_n"].tolist() == [T]
    assert extra["meta"]["taps"] == list(taps) and extra["meta"]["pad_id"] == PAD
    assert extra["meta"]["pad_position"] == 1
    offset = 0
    for ids in want_ids:
        n = len(ids)
        t_rows = tensors["t_pack"][offset:offset + n + 1].float()
        # the mock teacher: one-hot(id mod 64) @ basis, + position/100 in column 1 on the real rows
        basis = torch.randn(64, 128, generator=torch.Generator().manual_seed(1234)) / 4
        onehot = torch.nn.functional.one_hot(torch.tensor([*ids, PAD]) % 64, 64).float()
        onehot[:n, 1] += torch.arange(n) / 100
        torch.testing.assert_close(t_rows, (onehot @ basis).to(torch.bfloat16).float(), atol=0, rtol=0)
        q_rows = tensors["q_pack"][offset:offset + n + 1].float()
        alone = student.hidden(torch.tensor([ids]), torch.ones(1, n, dtype=torch.bool))[0]
        torch.testing.assert_close(q_rows[:n], alone, atol=0.02, rtol=0.01)        # bf16 storage
        padded = student.hidden(torch.tensor([ids + [PAD] * (80 - n)]),
                                torch.tensor([[True] * n + [False] * (80 - n)]),
                                torch.tensor([list(range(n)) + [1] * (80 - n)]))[0]
        torch.testing.assert_close(q_rows[n], padded[-1], atol=0.02, rtol=0.01)
        offset += n + 1


def _layerwise_shard(path, n_real: list[int], in_dim: int = 4, out_dim: int = 6) -> tuple[torch.Tensor, ...]:
    """A layerwise shard whose rows say where they come from: sample s, real row r → 1000·s + r + col/100;
    the stored pad row of sample s → −(s + 1) − col/100."""
    q_rows, t_rows = [], []
    for s, n in enumerate(n_real):
        for width, rows in ((in_dim, q_rows), (out_dim, t_rows)):
            col = torch.arange(width) / 100
            rows.append(torch.cat([1000 * s + torch.arange(n, dtype=torch.float32)[:, None] + col,
                                   (-(s + 1) - col)[None]]))
    q, t = torch.cat(q_rows), torch.cat(t_rows)
    lens = torch.tensor([n + 1 for n in n_real], dtype=torch.int32)
    t64 = t.double()
    write_shard(path, {"ids": torch.zeros(len(q), dtype=torch.int32), "len": lens, "t_len": lens.clone(), "q_pack": q,
                       "t_pack": t, "n_real": torch.tensor(n_real, dtype=torch.int32),
                       "pad_multiple": torch.tensor([80], dtype=torch.int32),
                       "n_taps": torch.tensor([2], dtype=torch.int32), "stat_s": t64.sum(0),
                       "stat_s2": (t64 * t64).sum(0), "stat_n": torch.tensor([len(t)])},
                {"pack": "qwen3vl_flux3", "kind": "token_aligned_layerwise", "samples": len(n_real)},
                [f"p{i}" for i in range(len(n_real))])
    return q, t


def test_the_reader_repeats_the_stored_pad_row_to_a_multiple_of_80(tmp_path):
    n_real = [3, 80, 81]
    path = tmp_path / "val-00000.safetensors"
    _layerwise_shard(path, n_real)
    (batch,) = list(val_batches([path], 8))
    rows = [80, 80, 160]
    assert batch.h.shape == (3, 160, 4) and batch.target.shape == (3, 160, 6)
    assert batch.mask.sum(1).tolist() == rows and batch.tmask.sum(1).tolist() == rows
    assert batch.pad.sum(1).tolist() == [77, 0, 79]
    sums = batch.weight.sum(1)
    torch.testing.assert_close(sums, torch.tensor([4.0, 80.0, 82.0]))
    for s, n in enumerate(n_real):
        R = rows[s]
        col_q, col_t = torch.arange(4) / 100, torch.arange(6) / 100
        real = torch.arange(n, dtype=torch.float32)[:, None] + 1000 * s
        torch.testing.assert_close(batch.h[s, :n], real + col_q)
        torch.testing.assert_close(batch.target[s, :n], real + col_t)
        assert (batch.weight[s, :n] == 1).all() and not batch.pad[s, :n].any()
        if R > n:
            torch.testing.assert_close(batch.h[s, n:R], (-(s + 1) - col_q).expand(R - n, 4))
            torch.testing.assert_close(batch.target[s, n:R], (-(s + 1) - col_t).expand(R - n, 6))
            torch.testing.assert_close(batch.weight[s, n:R], torch.full((R - n,), 1 / (R - n)))
            assert batch.pad[s, n:R].all()
        # past the sample's rows: nothing (zero rows, no weight, not kept)
        assert (batch.h[s, R:] == 0).all() and (batch.target[s, R:] == 0).all()
        assert (batch.weight[s, R:] == 0).all() and not batch.mask[s, R:].any() and not batch.pad[s, R:].any()
    # one sample alone is its own rows, whatever the others in a batch
    src = ShardRows(path)
    for s, R in enumerate(rows):
        alone = collate(src, [s])
        assert alone.h.shape == (1, R, 4)
        torch.testing.assert_close(alone.target[0], batch.target[s, :R])
        torch.testing.assert_close(alone.weight[0], batch.weight[s, :R])


def test_a_shard_without_pads_and_with_sup_start_weighs_only_the_rows_the_engine_keeps(tmp_path):
    """pad_multiple 1 and only the real rows stored; sup_start names the first row the DiT reads: the rows
    before it come back (the adapter runs over them) with weight 0, and the metrics skip them."""
    n_real, sup = [40, 35, 60], 34
    rows_q, rows_t = [], []
    for s, n in enumerate(n_real):
        rows_q.append(1000 * s + torch.arange(n, dtype=torch.float32)[:, None] + torch.arange(4) / 100)
        rows_t.append(1000 * s + torch.arange(n, dtype=torch.float32)[:, None] + torch.arange(6) / 100)
    q, t = torch.cat(rows_q), torch.cat(rows_t)
    lens = torch.tensor(n_real, dtype=torch.int32)
    path = tmp_path / "val-00000.safetensors"
    write_shard(path, {"ids": torch.zeros(len(q), dtype=torch.int32), "len": lens, "t_len": lens.clone(), "q_pack": q,
                       "t_pack": t, "n_real": lens.clone(), "pad_multiple": torch.tensor([1], dtype=torch.int32),
                       "n_taps": torch.tensor([2], dtype=torch.int32),
                       "sup_start": torch.full((3,), sup, dtype=torch.int32), "stat_s": t.double().sum(0),
                       "stat_s2": (t.double() ** 2).sum(0), "stat_n": torch.tensor([len(t)])},
                {"pack": "test", "kind": "token_aligned_layerwise", "samples": 3}, ["a", "b", "c"])
    (batch,) = list(val_batches([path], 8))
    assert batch.mask.sum(1).tolist() == n_real and not batch.pad.any()
    for s, n in enumerate(n_real):
        torch.testing.assert_close(batch.h[s, :n], rows_q[s])
        assert (batch.weight[s, :sup] == 0).all() and (batch.weight[s, sup:n] == 1).all()
        assert (batch.weight[s, n:] == 0).all()
    from trainer_core.contract.tap_losses import LayerwiseMetrics
    mu, sigma = torch.zeros(6), torch.ones(6)
    metrics = LayerwiseMetrics(mu, sigma, (1, 2))
    wrong_before = batch.target.clone()
    wrong_before[:, :sup] = -wrong_before[:, :sup]          # a prediction wrong only where the engine drops rows
    metrics.update(wrong_before, batch.target, weight=batch.weight, pad=batch.pad)
    assert metrics.result()["cos"] == pytest.approx(1.0)
    # without sup_start the same prediction scores the dropped rows too
    path2 = tmp_path / "val-00001.safetensors"
    write_shard(path2, {"ids": torch.zeros(len(q), dtype=torch.int32), "len": lens, "t_len": lens.clone(),
                        "q_pack": q, "t_pack": t, "n_real": lens.clone(),
                        "pad_multiple": torch.tensor([1], dtype=torch.int32), "n_taps": torch.tensor([2], dtype=torch.int32),
                        "stat_s": t.double().sum(0), "stat_s2": (t.double() ** 2).sum(0), "stat_n": torch.tensor([len(t)])},
                {"pack": "test", "kind": "token_aligned_layerwise", "samples": 3}, ["a", "b", "c"])
    (plain,) = list(val_batches([path2], 8))
    assert (plain.weight[plain.mask] == 1).all()
    metrics = LayerwiseMetrics(mu, sigma, (1, 2))
    metrics.update(wrong_before, plain.target, weight=plain.weight, pad=plain.pad)
    assert metrics.result()["cos"] < 0.9


# ---------------------------------------------------------------- statistics and loss

def test_relative_sigma_floors_each_tap_at_a_fraction_of_its_lower_median():
    rng = np.random.default_rng(3)
    n_taps, layer_dim, n = 3, 6, 50
    scales = np.array([[1.0, 0.01, 2.0, 3.0, 0.4, 5.0],       # median pair (1.0, 2.0): lower 1.0
                       [10.0, 20.0, 0.1, 30.0, 40.0, 50.0],
                       [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]]).reshape(-1)
    x = rng.normal(size=(n, n_taps * layer_dim)) * scales + rng.normal(size=n_taps * layer_dim) * 3
    s, s2 = x.sum(0), (x * x).sum(0)
    mu, sigma, floored = relative_sigma(torch.from_numpy(s), torch.from_numpy(s2), n, 0.5, n_taps)
    want_mu = s / n
    raw = np.sqrt(np.maximum(s2 / n - want_mu ** 2, 1e-6)).reshape(n_taps, layer_dim)
    lower_median = np.sort(raw, axis=1)[:, (layer_dim - 1) // 2]          # torch.median: the lower middle
    floor = 0.5 * lower_median[:, None]
    want = np.maximum(raw, floor)
    assert mu.dtype == sigma.dtype == torch.float32
    np.testing.assert_allclose(mu.numpy(), want_mu, rtol=1e-6)
    np.testing.assert_allclose(sigma.numpy(), want.reshape(-1), rtol=1e-6)
    assert floored == int((raw < floor).sum()) == 3                 # 0.01·, 0.4·, 0.1· dims; the flat tap none
    # the median convention is visible: the mean of the two middle values would floor tap 0 at 0.75
    mean_median = np.sort(raw, axis=1)[:, 2:4].mean(1)
    assert not np.allclose(np.maximum(raw, 0.5 * mean_median[:, None]), want)
    with pytest.raises(ValueError):
        relative_sigma(torch.from_numpy(s), torch.from_numpy(s2), 0, 0.5, n_taps)


def _numpy_layerwise_loss(p, t, mu, sigma, w, n_taps, cos_weight=0.5):
    t_std = (t - mu) / sigma
    D = p.shape[-1]
    mse = (w * ((p - t_std) ** 2).sum(-1)).sum() / (w.sum() * D)
    ps, ts = p.reshape(*p.shape[:-1], n_taps, -1), t_std.reshape(*t.shape[:-1], n_taps, -1)
    cos_tap = (ps * ts).sum(-1) / (np.linalg.norm(ps, axis=-1) * np.linalg.norm(ts, axis=-1))
    cos = (w * cos_tap.mean(-1)).sum() / w.sum()
    return mse + cos_weight * (1 - cos), mse, cos


def test_the_layerwise_loss_weighs_rows_and_averages_cosines_per_tap():
    rng = np.random.default_rng(7)
    B, R, n_taps, layer_dim = 2, 5, 4, 8
    D = n_taps * layer_dim
    tap_scale = np.repeat([0.1, 1.0, 10.0, 100.0], layer_dim)                 # deep taps dwarf shallow ones
    t = rng.normal(size=(B, R, D)) * tap_scale + 5
    mu = t.reshape(-1, D).mean(0) + rng.normal(size=D) * 0.1
    sigma = tap_scale * rng.uniform(0.5, 1.5, size=D)
    p = rng.normal(size=(B, R, D)) + (t - mu) / sigma
    w = np.array([[1, 1, 1, 0.5, 0.5], [1, 1 / 3, 1 / 3, 1 / 3, 0]])
    want_loss, want_mse, want_cos = _numpy_layerwise_loss(p, t, mu, sigma, w, n_taps)
    f = torch.from_numpy
    loss, parts = layerwise_loss(f(p), f((t - mu) / sigma), f(w), n_taps)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-9)
    np.testing.assert_allclose(float(parts["mse"]), want_mse, rtol=1e-9)
    np.testing.assert_allclose(float(parts["cos"]), want_cos, rtol=1e-9)
    # the per-tap average is not the full-width cosine here (that one follows the deep tap)
    full = (p * ((t - mu) / sigma)).sum(-1) / (np.linalg.norm(p, axis=-1) * np.linalg.norm((t - mu) / sigma, axis=-1))
    assert abs((w * full).sum() / w.sum() - want_cos) > 1e-2
    unweighted = _numpy_layerwise_loss(p, t, mu, sigma, np.ones_like(w), n_taps)[0]
    assert abs(unweighted - want_loss) > 1e-3                                  # the weights matter
    # the train objective standardizes the raw target itself and scores the same number
    config = AdapterConfig("token_aligned_layerwise", in_dim=4, out_dim=D, width=64, depth=1, taps=(1, 2, 3, 4))
    batch = Batch(torch.zeros(B, R, 4), f(w > 0), f(t).float(), f(w > 0), None, None,
                  weight=f(w).float(), pad=torch.zeros(B, R, dtype=torch.bool))
    got, parts = batch_loss(config, batch, f(p).float(), f(mu).float(), f(sigma).float(), 0.5)
    np.testing.assert_allclose(float(got), want_loss, rtol=1e-4)
    np.testing.assert_allclose(float(parts["cos"]), want_cos, rtol=1e-4)
    pred_raw = p * sigma + mu
    want_rel = (w * ((pred_raw - t) ** 2).sum(-1)).sum() / (w * (t * t).sum(-1)).sum()
    np.testing.assert_allclose(float(parts["rel_mse"]), want_rel, rtol=1e-4)


def test_an_empty_batch_scores_zero_not_nan():
    p = torch.randn(1, 3, 16)
    loss, parts = layerwise_loss(p, torch.randn(1, 3, 16), torch.zeros(1, 3), 2)
    assert torch.isfinite(loss) and float(parts["cos"]) == 0.0


# ---------------------------------------------------------------- export

TAPS = (4, 8, 12, 16, 20, 24, 28, 32)
IN_DIM, WIDTH, LAYER_DIM = 48, 128, 32
CONFIG = AdapterConfig("token_aligned_layerwise", in_dim=IN_DIM, out_dim=8 * LAYER_DIM, width=WIDTH, depth=2,
                       taps=TAPS)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random layerwise adapter (out_proj non-zero, non-trivial norms) written with μ/σ folded in."""
    torch.manual_seed(21)
    model = build_adapter(CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("ln_"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    assert model.out_proj.weight.abs().sum() > 0
    mu = torch.randn(8 * LAYER_DIM) * 2
    sigma = torch.rand(8 * LAYER_DIM) * 3 + 0.2
    path = tmp_path_factory.mktemp("export") / "layerwise.gguf"
    write_adapter_gguf(path, model, CONFIG, name="layerwise", pack=PACK.id, provenance=Provenance(7, 7, "best"),
                       pack_kvs=dict(PACK.export_contents(None, CONFIG).kvs), mu=mu, sigma=sigma)
    return path, model.eval(), mu, sigma


def test_the_layerwise_gguf_has_the_engines_layout(exported):
    path, model, _, _ = exported
    reader = gguf.GGUFReader(str(path), "r")
    tensors = {t.name: t for t in reader.tensors}
    assert reader.tensors[0].name == "adapter.layer_map"
    for absent in ("query", "query.weight", "vision_proj.weight", "vis_in.weight", "slot_query", "cap_query",
                   "bank_query"):
        assert "adapter." + absent not in tensors
    lm = tensors["adapter.layer_map"]
    assert lm.tensor_type == gguf.GGMLQuantizationType.F32 and [int(n) for n in lm.shape] == [8]
    assert np.asarray(lm.data).tolist() == [4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0]
    assert [int(n) for n in tensors["adapter.out_proj.weight"].shape] == [WIDTH, 8 * LAYER_DIM]
    assert [int(n) for n in tensors["adapter.skip.weight"].shape] == [IN_DIM, 8 * LAYER_DIM]
    assert tensors["adapter.skip.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["adapter.skip.bias"].tensor_type == gguf.GGMLQuantizationType.F32
    assert len(tensors) == 1 + 2 + 16 * 2 + 2 + 4 == len(model.state_dict())
    assert [t.name for t in reader.tensors] == ["adapter." + n for n in model.state_dict()]

    fields = reader.fields
    out_layers = fields["adapter.out_layers"]
    assert out_layers.types[0] == gguf.GGUFValueType.ARRAY and out_layers.types[1] == gguf.GGUFValueType.INT32
    assert [int(out_layers.parts[i][0]) for i in out_layers.data] == list(TAPS)

    def scalar(key):
        f = fields[key]
        return f.types[0], f.parts[f.data[0]]
    kind_type, kind = scalar("adapter.kind")
    assert kind_type == gguf.GGUFValueType.STRING and bytes(kind).decode() == "token_aligned_layerwise"
    for key, value in (("adapter.layer_dim", LAYER_DIM), ("adapter.n_out_layers", 8)):
        kind_type, data = scalar(key)
        assert kind_type == gguf.GGUFValueType.UINT32 and int(data[0]) == value
    assert "adapter.num_queries" not in fields

    back = read_adapter_gguf(path)
    assert back.config == CONFIG and back.config.taps == TAPS and back.config.spec.layer_dim(back.config) == LAYER_DIM
    assert not back.problems
    assert back.kvs["adapter.out_layers"] == list(TAPS)
    assert back.kvs["adapter.teacher_tap"] == "layers 4,8,12,16,20,24,28,32 (hidden_states[k], stacked ascending)"


def test_the_files_numpy_forward_is_the_readers_and_the_folded_checkpoints(exported):
    path, model, mu, sigma = exported
    h = torch.randn(37, IN_DIM, generator=torch.Generator().manual_seed(2))
    weights = gguf_tensors(path)
    ours = layerwise_forward(weights, h.numpy())
    with torch.no_grad():
        reader = read_adapter_gguf(path).model(h[None])[0].double().numpy()
        checkpoint = (model(h[None])[0] * sigma + mu).double().numpy()
    assert ours.shape == (37, 8 * LAYER_DIM)
    np.testing.assert_allclose(reader, ours, atol=1e-4, rtol=1e-5)

    # the fold done by hand, in float64 and without f16 rounding: μ once (out_proj), σ on both heads
    state = {k: v.double().numpy() for k, v in model.state_dict().items()}
    s, m = sigma.double().numpy(), mu.double().numpy()
    folded = dict(state)
    folded["out_proj.weight"], folded["out_proj.bias"] = state["out_proj.weight"] * s[:, None], state["out_proj.bias"] * s + m
    folded["skip.weight"], folded["skip.bias"] = state["skip.weight"] * s[:, None], state["skip.bias"] * s
    np.testing.assert_allclose(layerwise_forward(folded, h.numpy()), checkpoint, atol=1e-4, rtol=1e-5)

    # The file's weights are f16: each rounded with a relative error ≤ 2⁻¹¹ ≈ 4.9e-4, independently, so
    # the output moves by a few 1e-4 of its size (errors add in quadrature); 3e-3 of the output's norm
    # about μ leaves a margin of ~10x and is still ~100x below what a wrong fold gives (μ twice, an
    # unscaled skip: errors of the order of the output itself, checked below).
    scale = np.linalg.norm(checkpoint - m)
    assert np.linalg.norm(ours - checkpoint) / scale < 3e-3
    wrong = dict(folded, **{"skip.bias": folded["skip.bias"] + m})
    assert np.linalg.norm(layerwise_forward(wrong, h.numpy()) - checkpoint) / scale > 0.1
    assert np.abs(ours - checkpoint).max() > 0                                  # the rounding is really there


def _layout(path) -> dict[str, tuple[tuple[int, ...], str]]:
    reader = gguf.GGUFReader(str(path), "r")
    return {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name) for t in reader.tensors}


def test_detect_layout_counts_the_layer_map_as_the_engine_does(exported):
    path, *_ = exported
    layout = _layout(path)
    config, problems = detect_layout(layout, np.array(TAPS, dtype=np.float32))
    assert config == CONFIG and problems == []

    one = dict(layout, **{"adapter.layer_map": ((1,), "F32")})
    config, problems = detect_layout(one, np.array([4.0], dtype=np.float32))
    assert config is None and any(p.fatal and "layer_map" in p.message for p in problems)

    stored_2d = dict(layout, **{"adapter.layer_map": ((8, 1), "F32")})
    config, problems = detect_layout(stored_2d, np.array(TAPS, dtype=np.float32).reshape(1, 8))
    assert config == CONFIG
    assert problems and all(isinstance(p, LayoutProblem) and not p.fatal for p in problems)

    wrong_width = dict(layout, **{"adapter.layer_map": ((7,), "F32")})         # 256 outputs are not 7 layers
    config, problems = detect_layout(wrong_width, np.arange(7, dtype=np.float32))
    assert config is None and any(p.fatal for p in problems)

    no_skip = {k: v for k, v in layout.items() if not k.startswith("adapter.skip.")}
    config, problems = detect_layout(no_skip, np.array(TAPS, dtype=np.float32))
    assert config is None and any(p.fatal and "skip" in p.message for p in problems)


def _rewrite(src, dst, layer_map: np.ndarray) -> None:
    """A copy of the GGUF `src` with another adapter.layer_map (KVs left out: the engine reads none)."""
    reader = gguf.GGUFReader(str(src), "r")
    writer = gguf.GGUFWriter(str(dst), arch="pig")
    for t in reader.tensors:
        data = layer_map if t.name == "adapter.layer_map" else np.asarray(t.data)
        writer.add_tensor(t.name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_one_entry_layer_map_file_is_refused(exported, tmp_path):
    path, *_ = exported
    bad = tmp_path / "one.gguf"
    _rewrite(path, bad, np.array([4.0], dtype=np.float32))
    assert _layout(bad)["adapter.layer_map"] == ((1,), "F32")
    with pytest.raises(ModelFileError, match="layer_map"):
        read_adapter_gguf(bad)


def test_a_two_dimensional_layer_map_file_still_reads(exported, tmp_path):
    path, *_ = exported
    odd = tmp_path / "two_d.gguf"
    _rewrite(path, odd, np.array(TAPS, dtype=np.float32).reshape(1, 8))
    assert _layout(odd)["adapter.layer_map"] == ((8, 1), "F32")
    back = read_adapter_gguf(odd)
    assert back.config == CONFIG and back.problems and not any(p.fatal for p in back.problems)
