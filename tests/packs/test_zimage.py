"""Z-Image (qwen3_zimage, engine-adapter-families §1.1): the template ids with the real Qwen BPE, the tap
from the engine's rule (out_layers {N−1}: the pre-norm output of the last layer but one) against a plain
transformers forward of a tiny random Qwen3 of the real architecture, batched precompute against one
prompt at a time, the token-aligned shard without images, and the demo (trained once per session by
tests/demo_cache.py) through `inspect` and `infer`."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import demo_cache
from conftest import cli
from packs.layerwise_numpy import gguf_tensors, infer_prompt_matches_numpy
from packs.test_flux3 import engine, hf_tokenizer, student, student_dir  # noqa: F401 — fixtures
from trainer_core.packs.base import Budgets
from trainer_core.packs.qwen3_zimage import PACK
from trainer_core.packs.qwen3_zimage.teacher import MockZImageTeacher, Qwen3Teacher
from trainer_core.packs.qwen3_zimage.template import tap_for
from trainer_core.packs.qwen3_zimage.tiny import write_tiny_qwen3
from trainer_core.project import Project
from trainer_core.packs.lookup import format_prompt

PROMPTS = ("", "a sheep in sunglasses", "a red fox, oil painting, golden hour, 35mm, highly detailed",
           "(red:1.3) car at night")


def hf_ids(hf, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


def test_the_template_is_the_engines_with_the_emphasis_removed(engine, hf_tokenizer):  # noqa: F811
    for text in PROMPTS:
        plain = text.replace("(red:1.3)", "red")
        want = hf_ids(hf_tokenizer, "<|im_start|>user\n" + plain + "<|im_end|>\n<|im_start|>assistant\n")
        assert engine.encode_chunks(PACK.student_chunks(text)) == want


def test_the_tap_is_the_last_layer_but_one():
    """Qwen3-4B's 36 layers, out_layers {35} ("-2"); any depth: N − 1."""
    assert tap_for(36) == 35 and tap_for(4) == 3
    assert PACK.export_kvs["adapter.teacher_tap"].startswith("layer 35 ")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return write_tiny_qwen3(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def teacher(qwen3):
    return Qwen3Teacher(qwen3, device="cpu", mode="auto", dtype=torch.float32)


def test_the_teacher_is_the_plain_forwards_pre_norm_hidden_state(teacher, qwen3, hf_tokenizer):  # noqa: F811
    from transformers import AutoModel
    plain = AutoModel.from_pretrained(qwen3, dtype=torch.float32).eval()
    assert teacher.n_layers == 4 and teacher.tap == 3 and teacher.out_dim == 48
    tokens = [hf_ids(hf_tokenizer, format_prompt(PACK, p)) for p in PROMPTS]
    got = teacher.hidden(tokens)
    for g, t in zip(got, tokens):
        with torch.no_grad():
            out = plain(input_ids=torch.tensor([t]), output_hidden_states=True, use_cache=False)
        assert len(out.hidden_states) == 5 and g.shape == (len(t), 48)
        torch.testing.assert_close(g, out.hidden_states[3][0], atol=1e-5, rtol=1e-5)
        # not the normed final state the stack ends with
        assert not torch.allclose(g, out.last_hidden_state[0], atol=1e-2)


def test_batched_precompute_equals_one_prompt_at_a_time(teacher, student):  # noqa: F811
    budgets = Budgets(teacher_batch=4, tok_budget=8192, student_batch=4, student_tok_budget=8192)
    tensors, extra = PACK.make_shard(list(PROMPTS), student, teacher, budgets)
    order = extra["prompts"]
    n = tensors["len"].tolist()
    assert n == sorted(n) and tensors["t_len"].tolist() == n
    assert tensors["v_pack"].shape[0] == 0 and tensors["vis_len"].numel() == 0 and tensors["n_images"].sum() == 0
    assert tensors["sup_start"].tolist() == [0] * len(n) and tensors["t_sparse"].tolist() == [0]
    assert int(tensors["stat_n"]) == sum(n)                 # every row goes to the DiT
    offsets = np.cumsum([0, *n])
    for i, prompt in enumerate(order):
        alone, _ = PACK.make_shard([prompt], student, teacher, budgets)
        rows = slice(offsets[i], offsets[i + 1])
        torch.testing.assert_close(tensors["t_pack"][rows].float(), alone["t_pack"].float(), atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(tensors["q_pack"][rows].float(), alone["q_pack"].float(), atol=2e-2, rtol=1e-2)
        assert tensors["ids"][rows].tolist() == alone["ids"].tolist()
    # and the teacher's float rows: batched equals alone to float32 precision
    tokens = [student.ids(PACK.student_chunks(p)) for p in PROMPTS]
    batched = teacher.hidden(tokens)
    for t, rows in zip(tokens, batched):
        torch.testing.assert_close(rows, teacher.hidden([t])[0], atol=1e-5, rtol=1e-5)
    mock, _ = PACK.make_shard(list(PROMPTS), student, MockZImageTeacher(40), budgets)
    assert mock["t_pack"].shape == (sum(n), 40)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return Project.open(demo_cache.copy_trained(PACK.id, tmp_path_factory.mktemp("zimage")))


def test_the_zimage_demo_trains_exports_and_reads_back(demo, tmp_path):
    ev = json.loads(demo.eval_json.read_text())
    assert ev["pack"] == PACK.id and ev["kind"] == "token_aligned_vision"
    assert ev["config"]["vis_dim"] == 0 and ev["config"]["out_dim"] == 48
    for name in PACK.metric_names:
        assert name in ev, name
    assert ev["roundtrip_cos"] >= 0.999 and ev["trained_steps"] == demo_cache.STEPS
    assert "cos_vis" not in ev
    # it learned: the first logged steps score about 0 (random weights); the trained adapter well above, and
    # its error an order of magnitude under theirs
    first = json.loads((demo.checkpoints_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert ev["cos"] > first["cos"] + 0.2 and ev["rel_mse"] < first["rel_mse"] / 10, (first, ev)

    gguf_path = demo.gguf_path()
    r = cli("inspect", str(gguf_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "layout: OK" in r.stdout and "z_image caption features" in r.stdout
    weights = gguf_tensors(gguf_path)         # token-aligned blocks are the layerwise ones: the same numpy forward
    assert not any(k.startswith(("query", "layer_map", "vision_proj", "vis_in")) for k in weights)
    assert "skip.weight" in weights

    infer_prompt_matches_numpy(demo, PACK, weights, tmp_path, "a sheep in sunglasses")     # no pads: a row a token
