"""The Ming-Image thinker (Ling-mini-2.0 port), its connector and the two targets on the tiny
snapshot: strict loading, batched = unpadded runs, the MoE against an independent numpy
reference, the video-rope positions and frequency axes by hand, a bidirectional connector."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.ming_image.connector import (ThinkerPrompt, load_connector, load_ming_parts, ming_targets,
                                                     read_mlp_config)
from trainer_core.packs.ming_image.ling import (LingConfig, LingMoE, load_thinker, read_ling_config, rope_tables,
                                                video_positions)
from trainer_core.packs.ming_image.template import IMAGE_PATCH, build_prompt_ids, encoder, pad_id
from trainer_core.packs.ming_image.tiny import write_tiny_ming

SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_tiny_ming(tmp_path_factory.mktemp("ming") / "Ming-Image-0.1-Design")


@pytest.fixture(scope="module")
def parts(snapshot):
    return load_ming_parts(snapshot, torch.float32)


@pytest.fixture(scope="module")
def encode(snapshot):
    from tokenizers import Tokenizer
    return encoder(Tokenizer.from_file(str(snapshot / "mllm" / "tokenizer.json")))


def edit_shard(folder, change):
    """Apply change(state) to a copied snapshot's single shard and keep its index in step."""
    state = load_file(str(folder / SHARD))
    change(state)
    save_file(state, str(folder / SHARD))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: SHARD for k in state}}))


# ---------------------------------------------------------------- (a) strict loading

def test_the_thinker_loads_strictly_and_refuses_missing_or_extra_thinker_keys(snapshot, tmp_path):
    thinker = load_thinker(snapshot / "mllm")
    file_keys = {k for k in load_file(str(snapshot / "mllm" / SHARD)) if k.startswith("model.model.")}
    assert {"model.model." + k for k in thinker.state_dict()} == file_keys
    assert not any(t.is_meta for t in thinker.state_dict().values())
    assert thinker.word_embeddings.weight.dtype == torch.bfloat16
    assert thinker.layers[1].mlp.image_gate.expert_bias.dtype == torch.float32
    assert thinker.layers[0].dense_mlp and not thinker.layers[1].dense_mlp

    mllm = shutil.copytree(snapshot / "mllm", tmp_path / "mllm")
    edit_shard(mllm, lambda s: s.update({"model.lm_head.weight": torch.zeros(3, 4)}))       # not the thinker's
    load_thinker(mllm)
    edit_shard(mllm, lambda s: s.pop("model.model.layers.2.mlp.image_gate.expert_bias"))
    with pytest.raises(ModelFileError, match=r"Ming thinker weights in .*mllm .*missing "
                                             r"model\.model\.layers\.2\.mlp\.image_gate\.expert_bias\); download"):
        load_thinker(mllm)
    edit_shard(mllm, lambda s: s.update({"model.model.layers.2.mlp.image_gate.expert_bias": torch.zeros(8),
                                         "model.model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    with pytest.raises(ModelFileError, match=r"unexpected model\.model\.layers\.0\.mlp\.extra\.weight"):
        load_thinker(mllm)
    edit_shard(mllm, lambda s: (s.pop("model.model.layers.0.mlp.extra.weight"),
                                s.update({"model.model.norm.weight": torch.zeros(65)})))
    with pytest.raises(ModelFileError, match=r"wrong shape model\.model\.norm\.weight \[65\] \(expected \[64\]\)"):
        load_thinker(mllm)


def test_a_config_without_a_key_names_the_key_and_the_file(snapshot, tmp_path):
    mllm = shutil.copytree(snapshot / "mllm", tmp_path / "mllm")
    config = json.loads((mllm / "config.json").read_text())
    del config["llm_config"]["n_group"]
    config["llm_config"]["topk_group"] = "two"
    (mllm / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=r"Ming config .*config\.json cannot be used \(llm_config\.n_group is "
                                             r"missing .*; llm_config\.topk_group is missing"):
        read_ling_config(mllm)
    (mllm / "config.json").write_text(json.dumps({"vision_config": {}}))
    with pytest.raises(ModelFileError, match="has no llm_config object"):
        read_ling_config(mllm)


def test_the_connector_and_mlp_load_strictly(snapshot, tmp_path):
    connector = load_connector(snapshot / "connector", torch.float32)
    assert connector.model.embed_tokens.weight.shape[0] == 1               # the file's 64-row table is skipped
    folder = shutil.copytree(snapshot / "connector", tmp_path / "connector")
    edit_shard(folder, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelFileError, match=r"Ming connector weights .*missing model\.layers\.1\.mlp\.up_proj"):
        load_connector(folder)
    edit_shard(folder, lambda s: s.update({"model.layers.1.mlp.up_proj.weight": torch.zeros(64, 32),
                                           "lm_head.weight": torch.zeros(64, 32)}))
    with pytest.raises(ModelFileError, match=r"unexpected lm_head\.weight"):
        load_connector(folder)
    assert read_mlp_config(snapshot / "mlp", 3).taps == (1, 2, 3)
    (tmp_path / "mlp").mkdir()
    (tmp_path / "mlp" / "config.json").write_text(json.dumps({"connector_norm": True}))
    with pytest.raises(ModelFileError, match="connector_norm is set"):
        read_mlp_config(tmp_path / "mlp", 20)
    (tmp_path / "mlp" / "config.json").write_text("{}")
    assert read_mlp_config(tmp_path / "mlp", 20).taps == (5, 12, 20)


# ---------------------------------------------------------------- (b) batching

def _prompts(encode, hidden):
    g = torch.Generator().manual_seed(3)
    out = []
    for text, grid in (("a red fox in the snow", None), ("make it night", (2, 3)), ("", None),
                       ("an old lighthouse on a cliff at dusk, oil painting, dramatic sky", (3, 1))):
        n = grid[0] * grid[1] if grid else 0
        ids, start = build_prompt_ids(encode, text, n)
        embeds = F.normalize(torch.randn(n, hidden, generator=g), dim=-1) if grid else None
        out.append(ThinkerPrompt(ids, embeds, start, grid))
    return out


def test_batched_targets_equal_each_prompt_run_alone(parts, encode):
    prompts = _prompts(encode, parts.thinker.config.hidden_size)
    pad = pad_id(encode)
    cap, direct = ming_targets(parts, prompts, pad)
    assert cap.shape == (4, 256, parts.mlp.cap_dim) and cap.dtype == torch.float32
    assert [d.shape for d in direct] == [(len(p.ids), parts.mlp.direct_dim) for p in prompts]
    for i, p in enumerate(prompts):
        cap1, (direct1,) = ming_targets(parts, [p], pad)
        torch.testing.assert_close(cap[i], cap1[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(direct[i], direct1, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(cap[0], cap[2], atol=1e-2)                    # the prompts do reach the caption


def test_bf16_targets_stay_close_to_float32(snapshot, parts, encode):
    prompt = _prompts(encode, parts.thinker.config.hidden_size)[1]
    cap, (direct,) = ming_targets(parts, [prompt], pad_id(encode))
    cap16, (direct16,) = ming_targets(load_ming_parts(snapshot, torch.bfloat16), [prompt], pad_id(encode))
    assert cap16.dtype == direct16.dtype == torch.bfloat16
    assert F.cosine_similarity(cap16.float(), cap, dim=-1).mean() > 0.98
    assert F.cosine_similarity(direct16.float(), direct, dim=-1).mean() > 0.98


def test_the_image_embeds_land_on_their_patch_run(parts, encode):
    p = _prompts(encode, parts.thinker.config.hidden_size)[1]
    other = ThinkerPrompt(p.ids, -p.image_embeds, p.image_start, p.image_grid)
    (cap_a, (dir_a,)), (cap_b, (dir_b,)) = (ming_targets(parts, [q], pad_id(encode)) for q in (p, other))
    start = p.image_start
    assert p.ids[start - 1] != IMAGE_PATCH and p.ids[start] == IMAGE_PATCH
    torch.testing.assert_close(dir_a[:start], dir_b[:start])                # causal: rows before the image agree
    assert (dir_a[start:] - dir_b[start:]).abs().amax(-1).min() > 1e-3       # every row from the image on moves
    assert (cap_a - cap_b).abs().max() > 1e-3
    with pytest.raises(ValueError, match="does not match the prompt's <imagePatch> run"):
        ming_targets(parts, [ThinkerPrompt(p.ids, p.image_embeds, start - 1, p.image_grid)], pad_id(encode))


# ---------------------------------------------------------------- (c) MoE against numpy

def _moe_config(**kw):
    base = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8, partial_rotary_factor=0.5,
                rms_norm_eps=1e-6, first_k_dense_replace=0, intermediate_size=32, moe_intermediate_size=8,
                num_experts=12, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                num_shared_experts=1, vocab_size=10, num_hidden_layers=1, rope_theta=1e4)
    return LingConfig(**{**base, **kw})


def _numpy_moe(x, image, w, c):
    """The facts of §D.1 2 row by row in float64; also how often the bias, the groups and the image
    router change which experts are chosen (so the data is known to exercise them)."""
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    silu = lambda v: v * sig(v)  # noqa: E731
    per_group = c.num_experts // c.n_group
    out, changed = np.zeros_like(x), {"bias": 0, "groups": 0, "router": 0}

    def choose(scores, bias):
        choice = scores + bias
        groups = choice.reshape(c.n_group, per_group)
        group_score = np.sort(groups, axis=1)[:, -2:].sum(1)
        kept = np.argsort(-group_score, kind="stable")[:c.topk_group]
        masked = np.where(np.isin(np.arange(c.num_experts) // per_group, kept), choice, -np.inf)
        return set(np.argsort(-masked, kind="stable")[:c.num_experts_per_tok]), choice

    for n in range(len(x)):
        router = "image_gate" if image[n] else "gate"
        scores = sig(w[f"{router}.weight"] @ x[n])
        top, choice = choose(scores, w[f"{router}.expert_bias"])
        changed["bias"] += top != choose(scores, 0.0)[0]
        changed["groups"] += top != set(np.argsort(-choice)[:c.num_experts_per_tok])
        other = "gate" if image[n] else "image_gate"
        changed["router"] += top != choose(sig(w[f"{other}.weight"] @ x[n]), w[f"{other}.expert_bias"])[0]
        top = sorted(top)
        weights = scores[top] / (scores[top].sum() + 1e-20) * c.routed_scaling_factor
        for e, wt in zip(top, weights):
            p = f"experts.{e}."
            h = silu(w[p + "gate_proj.weight"] @ x[n]) * (w[p + "up_proj.weight"] @ x[n])
            out[n] += wt * (w[p + "down_proj.weight"] @ h)
        s = "shared_experts."
        out[n] += w[s + "down_proj.weight"] @ (silu(w[s + "gate_proj.weight"] @ x[n]) * (w[s + "up_proj.weight"] @ x[n]))
    return out, changed


def test_the_moe_matches_an_independent_numpy_reference():
    c = _moe_config()
    moe = LingMoE(c)
    g = torch.Generator().manual_seed(11)
    state = {k: torch.randn(v.shape, generator=g) * (0.6 if k.endswith("expert_bias") else 0.5)
             for k, v in moe.state_dict().items()}
    moe.load_state_dict(state)
    x = torch.randn(96, c.hidden_size, generator=g)
    image = torch.rand(96, generator=g) < 0.4
    with torch.no_grad():
        got = moe(x, image).numpy()
    want, changed = _numpy_moe(x.double().numpy(), image.numpy(), {k: v.double().numpy() for k, v in state.items()}, c)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert min(changed.values()) >= 10, changed          # bias, group masking and the image router all matter here


def test_the_moe_in_bf16_stays_close_to_float32():
    c = _moe_config()
    moe = LingMoE(c)
    g = torch.Generator().manual_seed(5)
    moe.load_state_dict({k: torch.randn(v.shape, generator=g) * 0.5 for k, v in moe.state_dict().items()})
    x, image = torch.randn(40, c.hidden_size, generator=g), torch.zeros(40, dtype=torch.bool)
    with torch.no_grad():
        full = moe(x, image)
        half = moe.to(torch.bfloat16)(x.bfloat16(), image)
    assert half.dtype == torch.bfloat16
    assert F.cosine_similarity(half.float(), full, dim=-1).mean() > 0.98


# ---------------------------------------------------------------- (d) video rope

def test_video_positions_follow_the_rules_by_hand():
    # 0-2 text, 3 <image>, 4-9 a 3 × 2 image, 10 </image>, 11-12 text (P = 13), 13 <image>,
    # 14-17 a 1 × 4 query block, 18 </image>, 19-20 padding
    got = video_positions(19, [(14, 1, 4), (4, 3, 2)], padded_length=21)
    t = [0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 5, 6, 7, 8, 9, 9, 9, 9, 10, 1, 1]
    h = [0, 1, 2, 3, 3, 3, 4, 4, 5, 5, 5, 6, 7, 8, 9, 9, 9, 9, 10, 1, 1]
    w = [0, 1, 2, 3, 4, 5, 4, 5, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 10, 1, 1]
    assert got.tolist() == [t, h, w]
    # a 2 × 3 grid at the very start: (g − 1)//2 = 0 rows, 1 column back
    assert video_positions(7, [(0, 2, 3)]).tolist() == [[0] * 6 + [1], [0, 0, 0, 1, 1, 1, 1],
                                                        [-1, 0, 1, -1, 0, 1, 1]]
    with pytest.raises(ValueError):
        video_positions(5, [(2, 2, 2)])


def test_rope_frequencies_take_h_w_then_t():
    c = _moe_config(head_dim=128)                         # rope_dim 64: 32 frequencies, 24 spatial + 8 temporal
    positions = torch.tensor([[[3, 40]], [[5, 7]], [[11, 2]]])            # [3, B=1, L=2]: t, h, w
    cos, sin = rope_tables(positions, c)
    assert cos.shape == (1, 2, 32)
    j = np.arange(32)
    inv = 1.0 / c.rope_theta ** (2 * j / 64)
    axis = np.array([1 if k % 2 == 0 else 2 for k in range(24)] + [0] * 8)
    p = positions[:, 0].numpy()                                           # [3, L]
    angle = p[axis, :].T * inv                                            # [L, 32]
    np.testing.assert_allclose(cos[0].numpy(), np.cos(angle), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(sin[0].numpy(), np.sin(angle), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- (e) connector

def test_the_connector_is_bidirectional(parts):
    connector = parts.connector
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 256, connector.model.config.hidden_size, generator=g)
    later = x.clone()
    later[0, 250] += 1.0
    with torch.no_grad():
        a, b = connector(x), connector(later)
        causal = [connector.model(inputs_embeds=v, position_ids=torch.arange(256)[None]).last_hidden_state
                  for v in (x, later)]
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-3        # row 0 sees row 250
    torch.testing.assert_close(causal[0][0, 0], causal[1][0, 0])         # the model's own default would not
    assert (a[0, 0] - causal[0][0, 0]).abs().max() > 1e-3
