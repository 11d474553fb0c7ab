"""Krea 2 / Iris-3B (qwen3vl_krea2, engine-adapter-families §1.2–1.3): what is its own beyond the conformance suite
— the figures the engine holds only implicitly (34 dropped rows, Iris' 300-token caption, the 12 taps) computed
from its rules with the real Qwen BPE, a teacher too shallow for tap 35, the shard without pads supervised from row
34, and the two engine commands of the Output tab."""
from __future__ import annotations

import pytest
import torch

from trainer_core.packs.base import Budgets
from trainer_core.packs.common.qwen3vl.taps_teacher import MockTapsTeacher
from trainer_core.packs.common.qwen_chat import fit_template
from trainer_core.packs.lookup import format_prompt
from trainer_core.packs.qwen3vl_krea2 import PACK
from trainer_core.packs.qwen3vl_krea2.template import TAPS
from trainer_core.project import Project

SYSTEM_TURN = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
               "spatial relationships of the objects and background:<|im_end|>\n")
USER, MARKER = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = ("", "a sheep in sunglasses", "a red fox, oil painting, golden hour, 35mm, highly detailed",
           "(red:1.3) car at night")


def hf_ids(hf, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


def test_the_engine_drops_the_system_turn_and_the_user_header_34_rows(hf_tokenizer):
    """Iris and Krea 2 compute the prefix by tokenizing the system turn and the user header."""
    assert len(hf_ids(hf_tokenizer, SYSTEM_TURN + USER)) == 34 == PACK.t2i_start
    assert format_prompt(PACK, "a cat") == SYSTEM_TURN + USER + "a cat" + MARKER


def test_the_taps_are_the_engines_twelve():
    taps = tuple(k for k in range(36) if k % 3 == 2)          # {2, 5, …, 35}, as conditioner.hpp lists them
    assert TAPS == taps and PACK.taps_of(36) == taps
    assert PACK.reference_dims["out_dim"] == 12 * 2560 == 30720


def test_the_caption_is_capped_as_iris_caps_it(engine, hf_tokenizer):
    """Iris: prompt tokens + the 5-token marker at most 300, the marker reserved before the cut."""
    marker, prefix = hf_ids(hf_tokenizer, MARKER), hf_ids(hf_tokenizer, SYSTEM_TURN + USER)
    long_text = " ".join(f"word{i}" for i in range(400))
    body = hf_ids(hf_tokenizer, long_text)
    want = prefix + body[:300 - len(marker)] + marker                  # what Iris hands its adapter
    got = fit_template(engine.encode_chunks(PACK.student_chunks(long_text)), PACK.max_len_student)
    assert len(body) > 300 and got == want and PACK.max_len_student == len(prefix) + 300


def test_a_teacher_too_shallow_for_tap_35_is_refused(tmp_path):
    from trainer_core.base.errors import ModelFileError
    with pytest.raises(ModelFileError, match="at least 36"):
        PACK.taps_of(35)


def test_the_shard_keeps_no_pad_rows_and_supervises_from_row_34(student):
    budgets = Budgets(teacher_batch=4, tok_budget=8192, student_batch=4, student_tok_budget=8192)
    tensors, extra = PACK.make_shard(list(PROMPTS), student, MockTapsTeacher(12 * 16, TAPS), budgets)
    n = tensors["n_real"].tolist()
    assert n == sorted(n) and tensors["len"].tolist() == tensors["t_len"].tolist() == n
    assert tensors["pad_multiple"].tolist() == [1] and tensors["sup_start"].tolist() == [34] * len(n)
    assert tensors["t_pack"].shape == (sum(n), 12 * 16) == (tensors["q_pack"].shape[0], 12 * 16)
    assert int(tensors["stat_n"]) == sum(k - 34 for k in n)             # statistics over the rows the DiT reads
    t64 = torch.cat([rows[34:] for rows in torch.split(tensors["t_pack"], n)]).double()
    torch.testing.assert_close(tensors["stat_s"], t64.sum(0))
    assert extra["meta"]["sup_start"] == 34 and extra["meta"]["caption_cap"] == 300


def test_the_output_tab_prints_the_krea2_and_the_iris_command(tmp_path):
    project = Project.create(tmp_path / "k", PACK.id)
    krea, iris = PACK.ggk_command(project).splitlines()
    assert "--diffusion-model krea2-turbo" in krea and "--vae" in krea and "--cfg-scale 1" in krea
    assert "--diffusion-model iris-3b" in iris and "--vae" not in iris and "--cfg-scale 3" in iris
    for line in (krea, iris):
        assert f"--llm-adapter {project.gguf_path()}" in line
