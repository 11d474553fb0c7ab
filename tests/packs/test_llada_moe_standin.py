"""The LLaDA2-MoE stand-in at a MoE config (what bench/gpu.py --size real builds at the real size):
grouped-query attention and BailingMoeV2-style routed experts against a per-token reference written
from packs-contract-more §D.1, loaded through the teacher like the dense tests' snapshot."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from trainer_core.packs.llada_image import PACK
from trainer_core.packs.llada_image.teacher import LLaDATeacher
from trainer_core.packs.llada_image.tiny import write_tiny_llada
from trainer_core.packs.llada_image.tiny_model.configuration_tiny_llada import TinyLLaDAConfig
from trainer_core.packs.llada_image.tiny_model.modeling_tiny_llada import TinyLLaDAMoE
from trainer_core.packs.lookup import format_prompt

MOE = {"num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 16,
       "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
       "routed_scaling_factor": 2.5}


def reference_moe(moe: TinyLLaDAMoE, config: TinyLLaDAConfig, h: torch.Tensor) -> torch.Tensor:
    """One token at a time, the routing as the contract words it."""
    out = []
    per_group = config.num_experts // config.n_group
    for row in h:
        scores = torch.sigmoid(moe.gate.weight.float() @ row.float())
        routing = scores + moe.gate.expert_bias.float()
        groups = [sorted(routing[g * per_group:(g + 1) * per_group].tolist(), reverse=True)[:2]
                  for g in range(config.n_group)]
        best = sorted(range(config.n_group), key=lambda g: -sum(groups[g]))[:config.topk_group]
        allowed = [e for e in range(config.num_experts) if e // per_group in best]
        chosen = sorted(allowed, key=lambda e: -routing[e].item())[:config.num_experts_per_tok]
        weights = scores[chosen] / (scores[chosen].sum() + 1e-20) * config.routed_scaling_factor
        y = sum(w * moe.experts[e](row[None])[0] for w, e in zip(weights, chosen))
        out.append(y + moe.shared_experts(row[None])[0])
    return torch.stack(out)


def test_routed_experts_match_a_per_token_reference():
    config = TinyLLaDAConfig(hidden_size=32, **MOE)
    torch.manual_seed(3)
    moe = TinyLLaDAMoE(config)
    for p in moe.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    moe.gate.expert_bias.normal_(0.0, 0.2)       # the bias moves the choice but not the weights
    h = torch.randn(2, 7, 32)
    with torch.no_grad():
        got = moe(h)
        want = reference_moe(moe, config, h.reshape(-1, 32)).view(2, 7, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the group limit matters: with every group allowed, some token picks other experts
    wide = TinyLLaDAConfig(hidden_size=32, **{**MOE, "topk_group": 4})
    moe.gate.keep = wide.topk_group
    with torch.no_grad():
        assert not torch.allclose(moe(h), got)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_tiny_llada(tmp_path_factory.mktemp("llada-moe") / "LLaDA-Image-Turbo", hidden=32, layers=3,
                            proj_dim=48, backbone=MOE)


def test_a_moe_snapshot_has_dense_then_moe_layers_and_gqa_shapes(snapshot):
    state = load_file(str(snapshot / "text_encoder" / "model.safetensors"))
    assert "model.layers.0.gate_proj.weight" in state and "model.layers.0.mlp.gate.weight" not in state
    for layer in (1, 2):
        assert state[f"model.layers.{layer}.mlp.gate.weight"].shape == (8, 32)
        assert state[f"model.layers.{layer}.mlp.experts.7.down_proj.weight"].shape == (32, 16)
        assert state[f"model.layers.{layer}.mlp.shared_experts.up_proj.weight"].shape == (16, 32)
    # 4 query heads and 2 kv heads of 8: q 32 + k 16 + v 16 rows
    assert state["model.layers.0.attention.query_key_value.weight"].shape == (64, 32)


def test_the_teacher_runs_the_moe_snapshot_and_a_padded_batch_equals_single_prompts(snapshot):
    teacher = LLaDATeacher(snapshot, dtype=torch.float32)
    prompts = [format_prompt(PACK, t) for t in ("a cat", "an old lighthouse on a misty morning, oil painting")]
    batched = teacher.forward_prompts(prompts)
    assert batched.shape == (2, 256, 48) and torch.isfinite(batched).all()
    for i, prompt in enumerate(prompts):
        torch.testing.assert_close(batched[i], teacher.forward_prompts([prompt])[0], atol=1e-5, rtol=0)


def test_grouped_query_attention_equals_attention_with_repeated_kv_heads():
    from trainer_core.packs.llada_image.tiny_model.modeling_tiny_llada import (TinyLLaDAAttention,
                                                                             TinyLLaDARotaryEmbedding)
    from trainer_core.packs.common.rope_guard import default_rope
    config = TinyLLaDAConfig(hidden_size=32, num_attention_heads=4, head_dim=8, num_key_value_heads=2)
    torch.manual_seed(5)
    attention = TinyLLaDAAttention(config)
    x = torch.randn(1, 5, 32)
    with default_rope():
        cos, sin = TinyLLaDARotaryEmbedding(config)(x, torch.arange(5)[None])
    with torch.no_grad():
        got = attention(x, None, cos, sin)
        q, k, v = attention.query_key_value(x).view(1, 5, 8, 8).transpose(1, 2).split([4, 2, 2], dim=1)
        rot = attention.rot

        def rope(t):
            r = t[..., :rot]
            a, b = r.chunk(2, dim=-1)
            return torch.cat([r * cos[:, None] + torch.cat([-b, a], -1) * sin[:, None], t[..., rot:]], -1)
        k, v = rope(k).repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        want = attention.dense(F.scaled_dot_product_attention(rope(q), k, v).transpose(1, 2).reshape(1, 5, 32))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
