"""The adapter networks: names, order, geometry and block math of the engine contract."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from trainer_core.contract.adapter import count_parameters
from trainer_core.contract.kinds import AdapterConfig, build_adapter, expected_tensor_count

RESAMPLER_BLOCK = [
    "ln_self.weight", "ln_self.bias",
    *[f"self_attn.{p}.{w}" for p in "qkvo" for w in ("weight", "bias")],
    "ln_q.weight", "ln_q.bias", "ln_kv.weight", "ln_kv.bias",
    *[f"cross_attn.{p}.{w}" for p in "qkvo" for w in ("weight", "bias")],
    "ln_mlp.weight", "ln_mlp.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
]
TOKEN_BLOCK = [
    "ln_self.weight", "ln_self.bias",
    *[f"self_attn.{p}.{w}" for p in "qkvo" for w in ("weight", "bias")],
    "ln_mlp.weight", "ln_mlp.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
]
TAIL = ["ln_out.weight", "ln_out.bias", "out_proj.weight", "out_proj.bias"]

# the reference geometries of engine-contract §1–§4, with the tensor and parameter counts it quotes
REFERENCE = {
    "llada": (AdapterConfig("resampler", 1024, 2560, 1024, 6, num_queries=256), 175, 104.7e6),
    "pixart": (AdapterConfig("seeded_resampler", 1024, 4096, 1024, 6, num_queries=120, seed_vocab=32128), 176, 139e6),
    "mageflow": (AdapterConfig("token_aligned_vision", 1024, 2560, 1024, 4, vis_dim=2560), 74, 61.9e6),
    "qwenimage": (AdapterConfig("token_aligned_vision", 1024, 4096, 1024, 4, vis_dim=4096), 74, 68.2e6),
}


def expected_names(config: AdapterConfig) -> list[str]:
    if config.kind == "token_aligned_vision":
        head = ["vision_proj.weight", "in_proj.weight", "in_proj.bias", "vis_in.weight"]
        block, tail = TOKEN_BLOCK, TAIL + ["skip.weight", "skip.bias"]
    else:
        head = ["query"] + (["t5_embed.weight"] if config.kind == "seeded_resampler" else []) + \
               ["in_proj.weight", "in_proj.bias"]
        block, tail = RESAMPLER_BLOCK, TAIL
    return head + [f"blocks.{i}.{n}" for i in range(config.depth) for n in block] + tail


@pytest.mark.parametrize("which", list(REFERENCE))
def test_reference_geometry_names_counts(which):
    config, n_tensors, n_params = REFERENCE[which]
    with torch.device("meta"):
        model = build_adapter(config)
    names = list(model.state_dict())
    assert names == expected_names(config)
    assert len(names) == n_tensors == expected_tensor_count(config)
    assert count_parameters(model) == pytest.approx(n_params, rel=0.002)
    assert config.heads == 16 and config.mlp == 4096


def test_block_building_blocks():
    model = build_adapter(AdapterConfig("resampler", 32, 48, 128, 1, num_queries=4))
    block = model.blocks[0]
    assert all(ln.eps == 1e-5 and ln.elementwise_affine for ln in
               (block.ln_self, block.ln_q, block.ln_kv, block.ln_mlp, model.ln_out))
    assert isinstance(block.mlp[1], nn.GELU) and block.mlp[1].approximate == "none"
    assert block.self_attn.heads == 2
    assert all(getattr(block.cross_attn, p).bias is not None for p in "qkvo")


def _manual_attention(attn, x, kv, key_mask=None):
    """Head h uses channels [64h, 64h+64); softmax(q·k/8) over keys."""
    q, k, v = attn.q(x), attn.k(kv), attn.v(kv)
    outs = []
    for h in range(attn.heads):
        sl = slice(64 * h, 64 * h + 64)
        scores = q[..., sl] @ k[..., sl].transpose(-1, -2) / 8.0          # [B, Lq, Lk]
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask[:, None, :], float("-inf"))
        outs.append(scores.softmax(-1) @ v[..., sl])
    return attn.o(torch.cat(outs, -1))


def test_resampler_block_math_by_hand():
    torch.manual_seed(0)
    config = AdapterConfig("resampler", 32, 48, 128, 1, num_queries=5)
    model = build_adapter(config).eval()
    h = torch.randn(2, 7, 32)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    b = model.blocks[0]
    with torch.no_grad():
        kv = model.in_proj(h)
        q = model.query.expand(2, -1, -1)
        x = b.ln_self(q)
        q = q + _manual_attention(b.self_attn, x, x)
        q = q + _manual_attention(b.cross_attn, b.ln_q(q), b.ln_kv(kv), mask)
        m = b.ln_mlp(q)
        m = b.mlp[2](0.5 * b.mlp[0](m) * (1 + torch.erf(b.mlp[0](m) / 2 ** 0.5)))
        want = model.out_proj(model.ln_out(q + m))
        got = model(h, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_padding_never_changes_real_rows():
    torch.manual_seed(1)
    resampler = build_adapter(AdapterConfig("resampler", 32, 48, 64, 2, num_queries=3)).eval()
    tokens = build_adapter(AdapterConfig("token_aligned_vision", 32, 48, 64, 2, vis_dim=16)).eval()
    with torch.no_grad():
        for p in tokens.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    h = torch.randn(1, 5, 32)
    padded = torch.cat([h, torch.randn(1, 4, 32) * 50], 1)
    mask = torch.tensor([[True] * 5 + [False] * 4])
    vis = torch.zeros(1, 9, 16)
    vis[0, 1:3] = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(resampler(padded, mask), resampler(h), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(tokens(padded, mask, vis)[:, :5], tokens(h, None, vis[:, :5]),
                                   atol=1e-5, rtol=1e-5)


def test_token_aligned_real_rows_only_is_the_padded_forward_on_the_real_rows_with_its_gradients():
    """rows_only (the CPU default) runs the row-wise layers on the real rows alone: the same real rows,
    zeros on the pads, and the same parameter gradients for a loss over the real rows."""
    torch.manual_seed(7)
    config = AdapterConfig("token_aligned_vision", 32, 48, 64, 2, vis_dim=16)
    model = build_adapter(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    twin = build_adapter(config)
    twin.load_state_dict(model.state_dict())
    h = torch.randn(3, 7, 32)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3, [True] * 2 + [False] * 5])
    h[~mask] = 25.0                                  # pad rows the packed path never reads
    vis = torch.zeros(3, 7, 16)
    vis[0, 1:3], vis[1, 0] = torch.randn(2, 16), torch.randn(16)
    target = torch.randn(3, 7, 48)
    outs = []
    for net, rows_only in ((model, True), (twin, False)):
        out = net(h, mask, vis, rows_only=rows_only)
        ((out - target) ** 2 * mask[..., None]).sum().backward()
        outs.append(out.detach())
    torch.testing.assert_close(outs[0][mask], outs[1][mask], atol=1e-5, rtol=1e-5)
    assert not outs[0][~mask].any() and outs[1][~mask].abs().sum() > 0
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_token_aligned_starts_as_its_skip_path_and_vision_proj_is_frozen():
    torch.manual_seed(2)
    model = build_adapter(AdapterConfig("token_aligned_vision", 32, 48, 64, 2, vis_dim=16))
    assert torch.count_nonzero(model.out_proj.weight) == 0 and torch.count_nonzero(model.out_proj.bias) == 0
    assert not model.vision_proj.weight.requires_grad and model.vision_proj.bias is None
    assert model.vis_in.bias is None
    h, vis = torch.randn(2, 6, 32), torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(h, None, vis), model.skip(h))
    assert "vision_proj.weight" not in {n for n, p in model.named_parameters() if p.requires_grad}


def test_seed_is_added_per_slot():
    torch.manual_seed(3)
    model = build_adapter(AdapterConfig("seeded_resampler", 32, 48, 64, 1, num_queries=4, seed_vocab=10)).eval()
    h = torch.randn(1, 5, 32)
    ids = torch.tensor([[3, 1, 0, 0]])
    with torch.no_grad():
        out = model(h, None, ids)
        plain = build_adapter(AdapterConfig("resampler", 32, 48, 64, 1, num_queries=4)).eval()
        state = {k: v for k, v in model.state_dict().items() if k != "t5_embed.weight"}
        state["query"] = model.query + model.t5_embed.weight[ids[0]]
        plain.load_state_dict(state)
        torch.testing.assert_close(out, plain(h), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out, model(h, None, torch.tensor([[4, 1, 0, 0]])))
    with pytest.raises(ValueError, match="seed_ids"):
        model(h)


@pytest.mark.parametrize("bad", [
    dict(kind="resampler", in_dim=8, out_dim=8, width=100, num_queries=2),
    dict(kind="resampler", in_dim=8, out_dim=8, width=64, num_queries=0),
    dict(kind="seeded_resampler", in_dim=8, out_dim=8, width=64, num_queries=2, seed_vocab=0),
    dict(kind="mlp", in_dim=8, out_dim=8),
])
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError):
        AdapterConfig(**bad)


def test_config_round_trip_and_canonical_form():
    c = AdapterConfig("token_aligned_vision", 1024, 2560, 1024, 4, vis_dim=2560)
    assert AdapterConfig.from_dict(c.to_dict()) == c
    assert c.mlp_hidden == 4096 and c.vis_dim == 2560 and c.has_skip is True
    assert AdapterConfig("token_aligned_vision", 8, 8, 64, 1, has_vis_in=True).has_vis_in is False     # no vision
    layerwise = AdapterConfig("token_aligned_layerwise", 8, 8, 64, 1, taps=[1.0, 2], has_skip=False)
    assert layerwise.taps == (1, 2) and layerwise.has_skip is True                       # the kind fixes it
    with pytest.raises(AttributeError, match="no field 'num_queries'.*resampler"):      # strict: not its field
        c.num_queries
    assert getattr(c, "num_queries", None) is None


def test_a_field_the_kind_does_not_declare_is_refused_by_name():
    with pytest.raises(ValueError, match="a resampler adapter has no field 'has_skip' .*token_aligned_vision"):
        AdapterConfig("resampler", 1, 1, 64, 1, num_queries=2, has_skip=True)
    with pytest.raises(ValueError, match="no field 'petals' \\(no adapter kind declares it\\)"):
        AdapterConfig("resampler", 1, 1, 64, 1, num_queries=2, petals=3)
    # another kind's field at its neutral value is what records of the previous version hold: dropped
    assert AdapterConfig("resampler", 1, 1, 64, 1, num_queries=2, has_skip=False, taps=[]).kind_fields == (
        ("num_queries", 2),)


@pytest.mark.parametrize("config", [AdapterConfig("seeded_resampler", 32, 48, 64, 2, num_queries=6, seed_vocab=50),
                                    AdapterConfig("token_aligned_vision", 32, 48, 64, 1, vis_dim=40)])
def test_an_adapter_built_without_init_is_the_trained_one_once_loaded_and_init_is_restored(config):
    normal, kaiming = nn.init.normal_, nn.init.kaiming_uniform_
    torch.manual_seed(3)
    trained = build_adapter(config)
    for p in trained.parameters():               # no parameter left at a value an init would give
        p.data.normal_()
    bare = build_adapter(config, init=False)
    assert nn.init.normal_ is normal and nn.init.kaiming_uniform_ is kaiming
    bare.load_state_dict(trained.state_dict(), strict=True)
    h, mask = torch.randn(2, 5, 32), torch.ones(2, 5, dtype=torch.bool)
    extra = {"seed_ids": torch.randint(0, 50, (2, 6))} if hasattr(config, "seed_vocab") else {"vis": None}
    torch.testing.assert_close(bare.eval()(h, mask, **extra), trained.eval()(h, mask, **extra), rtol=0, atol=0)
    # and the normal build still initializes: two seeds give two different adapters
    torch.manual_seed(4)
    assert not torch.equal(build_adapter(config).in_proj.weight, trained.in_proj.weight)


# ---------------------------------------------------------------- records: what every kind writes
# eval.json's and the checkpoints' "config" as the version before kinds declared their fields wrote it (one
# union, zeroed where a kind does not use a field); tests/data/demo_hashes.json fingerprints it
ZEROED = dict(num_queries=0, seed_vocab=0, vis_dim=0, has_vis_in=False, has_skip=False, taps=[], max_slots=0,
              seed_rank=0, n_bank=0, bank_dim=0, bank_align=False)
SLOTS = dict(seed_vocab=40, seed_rank=8, vis_dim=16, max_slots=20, n_bank=6, bank_dim=24)
RECORDS = {  # kind: (its fields as given, the record the previous version wrote)
    "resampler": (dict(num_queries=8), dict(num_queries=8)),
    "seeded_resampler": (dict(num_queries=8, seed_vocab=50), dict(num_queries=8, seed_vocab=50)),
    "token_aligned_vision": (dict(vis_dim=16), dict(vis_dim=16, has_vis_in=True, has_skip=True)),
    "token_aligned_layerwise": (dict(taps=(1, 2, 3)), dict(taps=[1, 2, 3], has_skip=True)),
    "qwen35_bridge": (dict(**SLOTS, bank_align=True), dict(**SLOTS, has_vis_in=True, bank_align=True)),
    "ming_image": (dict(**SLOTS, bank_align=True), dict(**SLOTS, has_vis_in=True)),
}


@pytest.mark.parametrize("kind", list(RECORDS))
def test_every_kind_writes_the_records_of_the_previous_version_and_reads_them_back(kind):
    import json
    given, written = RECORDS[kind]
    want = {"kind": kind, "in_dim": 32, "out_dim": 48, "width": 64, "depth": 2, "mlp_hidden": 256, **ZEROED, **written}
    config = AdapterConfig(kind, 32, 48, 64, 2, **given)
    assert json.loads(json.dumps(config.to_dict())) == want          # the same keys and values in eval.json
    assert AdapterConfig.from_dict(want) == config == AdapterConfig.from_dict(config.to_dict())


def test_a_new_kind_declares_its_own_field_without_touching_the_others(monkeypatch):
    from trainer_core.contract.kinds import AdapterKind, KindField, register
    from trainer_core.contract.kinds import base
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))        # gone with the test

    class PetalKind(AdapterKind):
        name = "petal_test_kind"
        fields = (KindField("n_petals", 5, 0, "a field no other kind has"),)

    register(PetalKind())
    c = AdapterConfig("petal_test_kind", 8, 8, 64, 1, n_petals=7)
    assert c.n_petals == 7 and AdapterConfig("petal_test_kind", 8, 8, 64, 1).n_petals == 5
    assert c.to_dict()["n_petals"] == 7 and AdapterConfig.from_dict(c.to_dict()) == c
    plain = AdapterConfig("resampler", 8, 8, 64, 1, num_queries=2)
    assert plain.to_dict()["n_petals"] == 0 and AdapterConfig.from_dict(plain.to_dict()) == plain

    class ClashKind(AdapterKind):
        name = "clash_test_kind"
        fields = (KindField("vis_dim", 0, -1, "the same name with another neutral value"),)
    with pytest.raises(ValueError, match="'vis_dim' but with neutral values"):
        register(ClashKind())


@pytest.mark.parametrize("kind", list(RECORDS))
def test_the_parameter_count_is_the_layout_summed_at_any_depth(kind):
    """parameter_count takes the count from the layouts of depth 1 and 2 (the plan bisects depths of thousands);
    it equals every tensor of the full layout counted, at each depth."""
    import math
    given = RECORDS[kind][0]
    config = AdapterConfig(kind, 32, 48 if kind != "token_aligned_layerwise" else 48 * 3, 64, 1, **given)
    spec = config.spec
    for depth in range(1, 6):
        at = dataclasses.replace(config, depth=depth)
        assert spec.parameter_count(at) == sum(math.prod(ne) for ne in spec.expected_ne(at).values()), depth
