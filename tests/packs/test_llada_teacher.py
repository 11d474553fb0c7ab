"""The LLaDA teacher on a tiny snapshot in the real layout: a `trust_remote_code` backbone whose
rotary table is a non-persistent buffer, QueryFormer and text_projection weights loaded strictly,
the masking and positions of packs-contract §B.1, placement plans, and the mock teacher."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.packs.llada_image import PACK
from trainer_core.packs.llada_image.teacher import (WEIGHTS_FILE, LLaDATeacher, MockLLaDATeacher, build_masks,
                                              load_queryformer, load_text_projection, placement_plan, placement_summary,
                                              sequential_device_map, teacher_dims)
from trainer_core.packs.common.rope_guard import RopeError, default_rope_init, table_problem
from trainer_core.packs.llada_image.tiny import write_tiny_llada
from trainer_core.packs.lookup import format_prompt

NQ, PROJ, HIDDEN = 256, 48, 32
PROMPTS = [format_prompt(PACK, t) for t in
           ("a cat", "", "an old lighthouse on a misty morning, oil painting with dramatic lighting and gulls")]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_tiny_llada(tmp_path_factory.mktemp("llada") / "LLaDA-Image-Turbo", hidden=HIDDEN,
                            num_queries=NQ, proj_dim=PROJ)


@pytest.fixture(scope="module")
def teacher(snapshot):
    return LLaDATeacher(snapshot, dtype=torch.float32)


def copy_of(snapshot, tmp_path):
    return shutil.copytree(snapshot, tmp_path / "LLaDA-Image-Turbo")


def rename_key(path, old, new):
    state = load_file(str(path))
    state[new] = state.pop(old)
    save_file(state, str(path))


# ---------------------------------------------------------------- strict module loading

def test_the_small_modules_load_strictly_from_the_diffusers_layout(snapshot, tmp_path):
    qf, tp = load_queryformer(snapshot / "queryformer"), load_text_projection(snapshot / "text_projection")
    assert set(qf.state_dict()) == set(load_file(str(snapshot / "queryformer" / WEIGHTS_FILE)))
    assert qf.meta_queries.shape == (NQ, HIDDEN) and tp.projector.out_features == PROJ
    assert teacher_dims(snapshot) == {"out_dim": PROJ, "num_queries": NQ, "hidden": HIDDEN}

    root = copy_of(snapshot, tmp_path)
    rename_key(root / "queryformer" / WEIGHTS_FILE, "layers.0.mlp.fc1.weight", "layers.0.mlp.fc_1.weight")
    with pytest.raises(ModelFileError, match=r"QueryFormer weights .* \(missing layers\.0\.mlp\.fc1\.weight; "
                                             r"unexpected layers\.0\.mlp\.fc_1\.weight"):
        load_queryformer(root / "queryformer")
    rename_key(root / "text_projection" / WEIGHTS_FILE, "projector.weight", "proj_out.weight")
    with pytest.raises(ModelFileError, match=r"text_projection weights .* \(missing projector\.weight"):
        load_text_projection(root / "text_projection")


def test_a_config_that_disagrees_with_the_weights_is_refused(snapshot, tmp_path):
    root = copy_of(snapshot, tmp_path)
    config = json.loads((root / "text_projection" / "config.json").read_text())
    (root / "text_projection" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ModelFileError, match=r"missing layers\.2\."):
        load_text_projection(root / "text_projection")
    (root / "text_projection" / "config.json").write_text(json.dumps({**config, "projection_dim": 40}))
    with pytest.raises(ModelFileError, match=r"wrong shape projector\.bias \[48\] \(expected \[40\]\), "
                                             r"projector\.weight \[48, 32\] \(expected \[40, 32\]\)"):
        load_text_projection(root / "text_projection")
    (root / "queryformer" / "config.json").unlink()
    with pytest.raises(ModelFileError, match=r"QueryFormer config .*config\.json is missing"):
        load_queryformer(root / "queryformer")


def test_the_queryformer_is_the_documented_block(snapshot):
    """Against an independent formulation: nn.MultiheadAttention with the packed weights, affine-free
    LayerNorms, residuals on the normalized queries, tanh-GELU."""
    qf = load_queryformer(snapshot / "queryformer")
    block = qf.layers[0]
    mha = torch.nn.MultiheadAttention(HIDDEN, 4, batch_first=True)
    mha.load_state_dict({"in_proj_weight": block.cross_attn.in_proj_weight,
                         "in_proj_bias": block.cross_attn.in_proj_bias,
                         "out_proj.weight": block.cross_attn.out_proj.weight,
                         "out_proj.bias": block.cross_attn.out_proj.bias})
    enc = torch.randn(2, 7, HIDDEN, generator=torch.Generator().manual_seed(0))
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3]).bool()
    q = F.layer_norm(qf.meta_queries.expand(2, -1, -1), (HIDDEN,), eps=1e-6)
    q = q + mha(q, F.layer_norm(enc, (HIDDEN,), eps=1e-6), F.layer_norm(enc, (HIDDEN,), eps=1e-6), key_padding_mask=~keep,
                need_weights=False)[0]
    q = F.layer_norm(q, (HIDDEN,), eps=1e-6)
    want = q + block.mlp.fc2(F.gelu(block.mlp.fc1(q), approximate="tanh"))
    with torch.no_grad():
        torch.testing.assert_close(qf(enc, keep), want, atol=1e-5, rtol=1e-5)


def test_the_text_projection_is_the_documented_stack(snapshot):
    """Against a loop written from the contract: RMSNorm without affine, per-head RMSNorm on q and k,
    unmasked softmax attention, tanh-GELU MLP, no final norm before the projector."""
    tp = load_text_projection(snapshot / "text_projection")
    x = torch.randn(2, 5, HIDDEN, generator=torch.Generator().manual_seed(1))

    def rms(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)
    h = x
    for layer in tp.layers:
        a = layer.self_attn
        n = rms(h)
        q, k, v = (p(n).view(2, 5, 4, 8).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        weights = torch.softmax(rms(q) @ rms(k).transpose(-1, -2) / math.sqrt(8), dim=-1)
        h = h + a.out_proj((weights @ v).transpose(1, 2).reshape(2, 5, HIDDEN))
        h = h + layer.mlp.fc2(F.gelu(layer.mlp.fc1(rms(h)), approximate="tanh"))
    with torch.no_grad():
        torch.testing.assert_close(tp(x), tp.projector(h), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the teacher forward

class Capture:
    """The inner model's keyword inputs and output of the last call."""

    def __init__(self, module):
        self.kwargs, self.out = None, None
        module.register_forward_pre_hook(self.pre, with_kwargs=True)
        module.register_forward_hook(self.post, with_kwargs=True)

    def pre(self, module, args, kwargs):
        self.kwargs = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}

    def post(self, module, args, kwargs, output):
        self.out = output.last_hidden_state.clone()


def test_the_output_is_one_block_of_query_rows_per_prompt(teacher):
    assert teacher.num_queries == NQ and teacher.out_dim == PROJ
    out = teacher.forward_prompts(PROMPTS)
    assert out.shape == (3, NQ, PROJ) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert teacher.forward_prompts([]).shape == (0, NQ, PROJ)


def test_query_positions_start_at_each_samples_real_length_and_text_cannot_see_queries(teacher):
    capture = Capture(teacher.inner)
    teacher.forward_prompts(PROMPTS)
    lens = teacher.text_lens(PROMPTS)
    longest = max(lens)
    positions, mask = capture.kwargs["position_ids"], capture.kwargs["attention_mask"]
    assert mask.shape == (3, 1, longest + NQ, longest + NQ) and capture.kwargs["inputs_embeds"].shape[1] == longest + NQ
    low = torch.finfo(mask.dtype).min
    for b, n in enumerate(lens):
        assert positions[b, :n].tolist() == list(range(n))                      # real text 0..n-1
        assert positions[b, n:longest].tolist() == [n - 1] * (longest - n)       # right pads repeat n-1
        assert positions[b, longest:].tolist() == list(range(n, n + NQ))        # queries right after the text
        m = mask[b, 0]
        assert (m[:, n:longest] == low).all() and (m[:, :n] == 0).all()         # pad keys blocked for every row
        assert (m[:longest, longest:] == low).all()                              # text rows never see the queries
        assert (m[longest:, longest:] == 0).all()                                # queries see each other (no causal)


def test_text_rows_are_independent_of_the_queries(teacher):
    capture = Capture(teacher.inner)
    length = max(teacher.text_lens(PROMPTS))
    teacher.forward_prompts(PROMPTS)
    before = capture.out
    saved = teacher.queryformer.meta_queries.detach().clone()
    try:
        with torch.no_grad():
            teacher.queryformer.meta_queries.mul_(-3.0).add_(1.0)
        teacher.forward_prompts(PROMPTS)
    finally:
        with torch.no_grad():
            teacher.queryformer.meta_queries.copy_(saved)
    assert torch.equal(capture.out[:, :length], before[:, :length])
    assert not torch.allclose(capture.out[:, length:], before[:, length:], atol=1e-3)   # the queries did change


def test_a_padded_batch_equals_per_prompt_runs(teacher):
    """Tolerance: 1e-5 absolute on rows of mean |x| ≈ 1.25 in float32 (measured 1.7e-6: SDPA on the
    CPU reduces over a different number of keys). Every prompt but the longest is padded."""
    batched = teacher.forward_prompts(PROMPTS)
    lens = teacher.text_lens(PROMPTS)
    assert len(set(lens)) == 3
    for i, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(batched[i], teacher.forward_prompts([prompt])[0], atol=1e-5, rtol=0)


def test_masks_for_a_batch_without_padding_leave_everything_open_but_text_to_queries():
    positions, mask = build_masks(torch.ones(1, 3, dtype=torch.long), 2, torch.bfloat16)
    assert positions.tolist() == [[0, 1, 2, 3, 4]]
    low = torch.finfo(torch.bfloat16).min
    assert mask.dtype == torch.bfloat16
    assert mask[0, 0].tolist() == [[0, 0, 0, low, low]] * 3 + [[0] * 5] * 2


# ---------------------------------------------------------------- the rotary guard on a real load

def test_loading_leaves_the_rotary_table_uninitialised_and_the_teacher_repairs_it(snapshot, teacher):
    from transformers import AutoModel

    from trainer_core.packs.common.rope_guard import default_rope
    with default_rope():
        plain = AutoModel.from_pretrained(snapshot / "text_encoder", trust_remote_code=True, dtype=torch.float32)
    assert table_problem(plain.model.rotary_emb.inv_freq) is not None, \
        "transformers now initialises non-persistent buffers: the guard's premise changed"
    assert any("model.rotary_emb" in note and "rebuilt from its config" in note for note in teacher.notes)
    config = teacher.backbone.config
    torch.testing.assert_close(teacher.backbone.model.rotary_emb.inv_freq, default_rope_init(config)[0])


def test_a_table_that_cannot_be_repaired_makes_the_teacher_refuse(snapshot, monkeypatch):
    from transformers import modeling_rope_utils
    monkeypatch.setitem(modeling_rope_utils.ROPE_INIT_FUNCTIONS, "default",
                        lambda config, device=None: (torch.full((2,), math.nan), 1.0))
    with pytest.raises(RopeError, match=r"model\.rotary_emb: not finite.*refuses to run"):
        LLaDATeacher(snapshot, dtype=torch.float32)


def test_a_snapshot_without_its_modules_is_named(snapshot, tmp_path):
    root = copy_of(snapshot, tmp_path)
    shutil.rmtree(root / "text_projection")
    with pytest.raises(ModelFileError, match=r"has no text_projection/ folder"):
        LLaDATeacher(root, dtype=torch.float32)


# ---------------------------------------------------------------- placement

def test_sequential_placement_fills_the_chosen_card_then_the_others_then_the_cpu():
    device_map, memory = placement_plan(torch.device("cuda", 1), "sequential", 0.0, 20.0, [24.0, 80.0, 3.0])
    assert device_map == "sequential"
    assert list(memory.items()) == [(1, "78.5GiB"), (0, "22.5GiB"), ("cpu", "20.0GiB")]  # 3 GiB − 1.5 is too small
    _, memory = placement_plan(torch.device("cuda", 0), "balanced", 10.0, 8.0, [24.0])
    assert memory == {0: "10.0GiB", "cpu": "8.0GiB"}
    assert placement_plan(torch.device("cpu"), "sequential", 0.0, 0.0) == (None, None)
    with pytest.raises(UsageError, match='placement "spread"'):
        placement_plan(torch.device("cpu"), "spread", 0.0, 0.0)


def test_the_placement_summary_counts_offloaded_weights_as_cpu_ram():
    model = torch.nn.Sequential(torch.nn.Linear(32768, 8192, bias=False, device="meta", dtype=torch.bfloat16),
                                torch.nn.Linear(8192, 8192, bias=False, dtype=torch.bfloat16))
    assert placement_summary(model) == "0.62 GiB in CPU RAM"        # 0.5 GiB offloaded (meta) + 0.125 GiB


def test_a_cpu_budget_of_zero_is_available_ram_minus_six_gib(monkeypatch):
    import psutil
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 40 * 2**30})())
    assert placement_plan(torch.device("cuda", 0), "sequential", 0.0, 0.0, [2.0])[1] == {0: "1.0GiB",
                                                                                       "cpu": "34.0GiB"}


# ---------------------------------------------------------------- mock

def test_the_mock_has_the_real_shape_and_offset_and_a_prompt_part_bf16_keeps():
    mock = MockLLaDATeacher(2560, 256)
    prompts = [format_prompt(PACK, t) for t in ("a red fox", "a glass teapot in the rain", "", "pixel art of a violin")]
    rows = mock.forward_prompts(prompts)
    assert rows.shape == (4, 256, 2560) and rows.dtype == torch.bfloat16
    assert torch.equal(rows, MockLLaDATeacher(2560, 256).forward_prompts(prompts))          # deterministic
    assert torch.equal(rows[1], mock.forward_prompts(prompts[1:2])[0])                        # batch-independent
    per_dim = rows.float().mean(dim=(0, 1))
    assert 1900 < float(per_dim.mean()) < 2100 and float(per_dim.std()) > 20                 # a shared offset per dim
    spread = rows.float().std(dim=0).mean()                                                   # across prompts
    assert float(spread) > 20 * 8 / math.sqrt(12)       # far above bf16 rounding at ~2000 (step 8)
    assert mock.text_lens(prompts) == [len(p) // 4 + 1 for p in prompts]


def test_a_sequential_map_starts_on_the_chosen_card(snapshot):
    """accelerate sorts GPU indices (it would start on cuda:0); the explicit map fills the chosen card
    first, then the others in order. Planned on the meta device, so no GPU is needed. The tiny backbone
    is 9.3 MB of bf16 embedding plus small layers."""
    fits = sequential_device_map(snapshot / "text_encoder", {1: "12MB", 0: "20MB", "cpu": "1GB"}, torch.bfloat16)
    assert set(fits.values()) == {1}
    too_small = sequential_device_map(snapshot / "text_encoder", {1: "9MB", 0: "20MB", "cpu": "1GB"}, torch.bfloat16)
    assert set(too_small.values()) == {0}                    # the chosen card cannot take the embedding: next card
