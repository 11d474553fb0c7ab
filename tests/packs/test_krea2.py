"""Krea 2 / Iris-3B (qwen3vl_krea2, engine-adapter-families §1.2–1.3): the figures the engine holds only
implicitly (34 dropped rows, Iris' 300-token caption) computed from its rules with the real Qwen BPE, the
teacher against a plain transformers forward of a tiny random Qwen3-VL of the real depth at the 12 taps,
batched precompute against one prompt at a time, and the demo (trained once per session by
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
from trainer_core.packs.qwen3vl_krea2 import PACK
from trainer_core.packs.qwen3vl_flux3.teacher import MockKleinTeacher
from trainer_core.packs.qwen3vl_krea2.teacher import Krea2Teacher
from trainer_core.packs.qwen3vl_krea2.template import TAPS
from trainer_core.project import Project
from trainer_core.packs.lookup import format_prompt

SYSTEM_TURN = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
               "spatial relationships of the objects and background:<|im_end|>\n")
USER, MARKER = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = ("", "a sheep in sunglasses", "a red fox, oil painting, golden hour, 35mm, highly detailed",
           "(red:1.3) car at night")


def hf_ids(hf, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------- the engine's figures

def test_the_engine_drops_the_system_turn_and_the_user_header_34_rows(hf_tokenizer):  # noqa: F811
    """Iris and Krea 2 compute the prefix by tokenizing the system turn and the user header."""
    dropped = len(hf_ids(hf_tokenizer, SYSTEM_TURN + USER))
    assert dropped == 34 == PACK.t2i_start
    assert format_prompt(PACK, "a cat") == SYSTEM_TURN + USER + "a cat" + MARKER


def test_the_taps_are_the_engines_twelve():
    taps = tuple(k for k in range(36) if k % 3 == 2)          # {2, 5, …, 35}, as conditioner.hpp lists them
    assert TAPS == taps and len(taps) == 12
    assert PACK.reference_dims["out_dim"] == 12 * 2560 == 30720


def test_the_caption_is_capped_as_iris_caps_it(engine, hf_tokenizer):  # noqa: F811
    """Iris: prompt tokens + the 5-token marker at most 300, the marker reserved before the cut."""
    marker = hf_ids(hf_tokenizer, MARKER)
    prefix = hf_ids(hf_tokenizer, SYSTEM_TURN + USER)
    long_text = " ".join(f"word{i}" for i in range(400))
    body = hf_ids(hf_tokenizer, long_text)
    assert len(body) > 300
    cap = 300
    want = prefix + body[:cap - len(marker)] + marker                  # what Iris hands its adapter
    got = PACK.template_ids(_Student(engine), long_text)
    assert got == want and len(got) == len(prefix) + cap
    assert PACK.max_len_student == len(prefix) + cap
    short = PACK.template_ids(_Student(engine), "a sheep in sunglasses")
    assert short == prefix + hf_ids(hf_tokenizer, "a sheep in sunglasses") + marker


class _Student:
    """What template_ids needs of a student: the engine's piecewise ids."""

    def __init__(self, bpe):
        self.bpe = bpe

    def ids(self, chunks):
        return self.bpe.encode_chunks(chunks)


def test_the_output_tab_prints_the_krea2_and_the_iris_command(tmp_path):
    project = Project.create(tmp_path / "k", PACK.id)
    krea, iris = PACK.ggk_command(project).splitlines()
    assert "--diffusion-model krea2-turbo" in krea and "--vae" in krea and "--cfg-scale 1" in krea
    assert "--diffusion-model iris-3b" in iris and "--vae" not in iris and "--cfg-scale 3" in iris
    for line in (krea, iris):
        assert f"--llm-adapter {project.gguf_path()}" in line


# ---------------------------------------------------------------- teacher

@pytest.fixture(scope="module")
def qwen3vl36(tmp_path_factory):
    from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
    return write_tiny_qwen3vl(tmp_path_factory.mktemp("qwen3vl36"), hidden=32, layers=36)


@pytest.fixture(scope="module")
def teacher(qwen3vl36):
    return Krea2Teacher(qwen3vl36, device="cpu", mode="auto", dtype=torch.float32)


def plain_taps(root, token_lists, taps) -> list[torch.Tensor]:
    """Hugging Face's own Qwen3-VL text stack (all 36 layers), one prompt at a time, no pads: the stacked
    hidden_states[k] of the real rows."""
    from transformers import AutoModel
    lm = AutoModel.from_pretrained(root, dtype=torch.float32).language_model.eval()
    out = []
    for tokens in token_lists:
        with torch.no_grad():
            states = lm(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False).hidden_states
        assert len(states) == 37
        out.append(torch.cat([states[k][0] for k in taps], dim=-1))
    return out


def test_the_teacher_is_the_plain_forwards_twelve_taps(teacher, qwen3vl36, hf_tokenizer):  # noqa: F811
    assert teacher.taps == TAPS and teacher.out_dim == 12 * 32
    tokens = [hf_ids(hf_tokenizer, format_prompt(PACK, p)) for p in PROMPTS]
    got = teacher.hidden(tokens)
    want = plain_taps(qwen3vl36, tokens, TAPS)
    for g, w, t in zip(got, want, tokens):
        assert g.shape == (len(t) + 1, 12 * 32)              # the real rows, then the pad row the shard drops
        torch.testing.assert_close(g[:len(t)], w, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got[1][:, :32], got[1][:, -32:], atol=1e-3)    # tap 2 is not tap 35


def test_a_teacher_too_shallow_for_tap_35_is_refused(tmp_path):
    from trainer_core.base.errors import ModelFileError
    from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
    root = write_tiny_qwen3vl(tmp_path / "q", hidden=32, layers=35)
    with pytest.raises(ModelFileError, match="at least 36"):
        Krea2Teacher(root, device="cpu", mode="auto", dtype=torch.float32)


def test_batched_precompute_equals_one_prompt_at_a_time(teacher, student):  # noqa: F811
    budgets = Budgets(teacher_batch=4, tok_budget=8192, student_batch=4, student_tok_budget=8192)
    tensors, extra = PACK.make_shard(list(PROMPTS), student, teacher, budgets)
    order = extra["prompts"]
    n = tensors["n_real"].tolist()
    assert n == sorted(n) and tensors["len"].tolist() == tensors["t_len"].tolist() == n
    assert tensors["pad_multiple"].tolist() == [1] and tensors["sup_start"].tolist() == [34] * len(n)
    assert int(tensors["stat_n"]) == sum(k - 34 for k in n)             # statistics over the rows the DiT reads
    t64 = torch.cat([rows[34:] for rows in torch.split(tensors["t_pack"], n)]).double()
    torch.testing.assert_close(tensors["stat_s"], t64.sum(0))
    assert tensors["t_pack"].shape[0] == tensors["q_pack"].shape[0] == tensors["ids"].shape[0] == sum(n)
    offsets = np.cumsum([0, *n])
    for i, prompt in enumerate(order):
        alone, _ = PACK.make_shard([prompt], student, teacher, budgets)
        rows = slice(offsets[i], offsets[i + 1])
        torch.testing.assert_close(tensors["t_pack"][rows].float(), alone["t_pack"].float(), atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(tensors["q_pack"][rows].float(), alone["q_pack"].float(), atol=2e-2, rtol=1e-2)
        assert tensors["ids"][rows].tolist() == alone["ids"].tolist()
    mock, _ = PACK.make_shard(list(PROMPTS), student, MockKleinTeacher(12 * 16, TAPS), budgets)
    assert mock["t_pack"].shape == (sum(n), 12 * 16)


# ---------------------------------------------------------------- the demo

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return Project.open(demo_cache.copy_trained(PACK.id, tmp_path_factory.mktemp("krea2")))


def test_the_krea2_demo_trains_exports_and_reads_back(demo, tmp_path):
    ev = json.loads(demo.eval_json.read_text())
    assert ev["pack"] == PACK.id and ev["kind"] == "token_aligned_layerwise"
    assert ev["config"]["taps"] == list(TAPS) and ev["config"]["out_dim"] == 12 * 64
    for name in PACK.metric_names:
        assert name in ev, name
    assert ev["roundtrip_cos"] >= 0.999 and ev["trained_steps"] == demo_cache.STEPS
    assert ev["cos"] > 0.3
    assert "cos_pads" not in ev and ev["cos_tokens"] == pytest.approx(ev["cos"])      # no pads in this family

    gguf_path = demo.gguf_path()
    r = cli("inspect", str(gguf_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "layout: OK" in r.stdout and f"kv adapter.out_layers = {list(TAPS)!r}" in r.stdout
    assert "kv adapter.n_out_layers = 12" in r.stdout and "krea2 / iris" in r.stdout

    weights = gguf_tensors(gguf_path)
    infer_prompt_matches_numpy(demo, PACK, weights, tmp_path, "a sheep in sunglasses")     # no pads: a row a token
