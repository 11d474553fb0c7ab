"""Z-Image (qwen3_zimage, engine-adapter-families §1.1): what is its own beyond the conformance suite — the
template ids with the real Qwen BPE and the emphasis removed, the tap from the engine's rule (out_layers {N−1}: the
pre-norm output of the last layer but one, not the normed final state), the token-aligned shard without images,
and what its export says of itself."""
from __future__ import annotations

import torch

import demo_cache
from conftest import cli
from trainer_core.packs.base import Budgets
from trainer_core.packs.common.qwen3.teacher import MockQwen3Teacher, Qwen3Teacher
from trainer_core.packs.common.qwen3.tiny import write_tiny_qwen3
from trainer_core.packs.common.token_aligned_text import last_but_one
from trainer_core.packs.qwen3_zimage import PACK

PROMPTS = ("", "a sheep in sunglasses", "(red:1.3) car at night")


def test_the_template_is_the_engines_with_the_emphasis_removed(engine, hf_tokenizer):
    for text in PROMPTS:
        plain = text.replace("(red:1.3)", "red")
        want = hf_tokenizer.encode("<|im_start|>user\n" + plain + "<|im_end|>\n<|im_start|>assistant\n",
                                   add_special_tokens=False).ids
        assert engine.encode_chunks(PACK.student_chunks(text)) == want


def test_the_tap_is_the_last_layer_but_one_not_the_normed_state(tmp_path, hf_tokenizer):
    """Qwen3-4B's 36 layers, out_layers {35} ("-2"); any depth: N − 1; a plain forward's hidden_states[N − 1]."""
    from transformers import AutoModel
    assert last_but_one(36) == (35,) and PACK.export_kvs["adapter.teacher_tap"].startswith("layer 35 ")
    root = write_tiny_qwen3(tmp_path / "qwen3")
    teacher = Qwen3Teacher(root, taps_of=last_but_one, family="Z-Image", repo=PACK.teacher_repo, dtype=torch.float32)
    ids = hf_tokenizer.encode("<|im_start|>user\na fox<|im_end|>\n", add_special_tokens=False).ids
    with torch.no_grad():
        out = AutoModel.from_pretrained(root, dtype=torch.float32)(input_ids=torch.tensor([ids]),
                                                                     output_hidden_states=True)
    rows = teacher.hidden([ids])[0]
    assert teacher.taps == (3,) and rows.shape == (len(ids), 48)
    torch.testing.assert_close(rows, out.hidden_states[3][0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(rows, out.last_hidden_state[0], atol=1e-2)


def test_the_shard_is_token_aligned_without_images_every_row_supervised(student):
    budgets = Budgets(teacher_batch=4, tok_budget=8192, student_batch=4, student_tok_budget=8192)
    tensors, _ = PACK.make_shard(list(PROMPTS), student, MockQwen3Teacher(40), budgets)
    n = tensors["len"].tolist()
    assert n == sorted(n) and tensors["t_len"].tolist() == n and tensors["t_pack"].shape == (sum(n), 40)
    assert tensors["v_pack"].shape[0] == 0 and tensors["vis_len"].numel() == 0 and tensors["n_images"].sum() == 0
    assert tensors["sup_start"].tolist() == [0] * len(n) and int(tensors["stat_n"]) == sum(n)


def test_the_export_names_its_target_and_has_a_skip_path_and_no_vision(tmp_path):
    gguf = demo_cache.copy_trained(PACK.id, tmp_path).parent / "pig_qwen3_4b_zimage_adapter-f16.gguf"
    r = cli("inspect", str(gguf))
    assert r.returncode == 0 and "z_image caption features" in r.stdout and "layout: OK" in r.stdout
    from numpy_adapters import gguf_tensors
    names = gguf_tensors(gguf)
    assert "skip.weight" in names and not any(k.startswith(("query", "layer_map", "vision_proj", "vis_in"))
                                              for k in names)
