"""The Chroma pack (trainer_core/packs/t5xxl_chroma/): what is its own beyond the conformance suite (which runs its
demo, holds its teacher to a plain unmasked T5 forward and batched precompute to one prompt at a time) — the
512-slot window rule and its supervised rows, the mock's window, the budgets that fit whole windows, its hooks.

The engine facts the expectations are built from (ggk 0.9.7's T5CLIPEmbedder for Chroma): the window is the
prompt's T5 ids + EOS (1), cut to 511 ids + EOS, padded with 0 to 512; T5 runs over all 512 slots with no
key mask; the DiT reads the real slots, EOS and the first pad slot.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import pytest
import torch

import demo_cache
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.base import Budgets
from trainer_core.project import Project
from trainer_core.packs.lookup import resolve_material
from trainer_core.packs.estimates import teacher_need_gib

PACK_ID = "t5xxl_chroma"
WINDOW, EOS, PAD = 512, 1, 0


def expected_window(tokenizer, prompt: str) -> tuple[list[int], int, int]:
    """(512 ids, real slots, supervised rows) of a prompt by the engine's rule, from the tokenizer's pieces alone."""
    pieces = [i for chunk, _ in parse_prompt_attention(prompt) for i in tokenizer.encode(chunk)]
    real = pieces[:WINDOW - 1] + [EOS]
    return real + [PAD] * (WINDOW - len(real)), len(real), min(len(real) + 1, WINDOW)


def single_piece_word(tokenizer) -> str:
    """A word of the demo vocabulary that is one piece alone and n pieces repeated n times."""
    for word in ("photo", "painting", "sketch", "render", "drawing", "lighting", "morning"):
        if len(tokenizer.encode(word)) == 1 and len(tokenizer.encode(" ".join([word] * 9))) == 9:
            return word
    raise AssertionError("no single-piece word in the demo's tiny T5 vocabulary")


class _StubStudent:
    """A student of one 8-wide row per character (the mock teacher's test needs no real one)."""

    def ids(self, chunks: list[str]) -> list[int]:
        return [ord(c) for chunk in chunks for c in chunk] or [0]

    def rows(self, token_lists, max_len, max_batch, tok_budget):
        tokens = [t[:max_len] for t in token_lists]
        return tokens, [torch.tensor(t, dtype=torch.bfloat16)[:, None].expand(-1, 8) for t in tokens], 0


@pytest.fixture(scope="module")
def demo():
    """The cached demo project of the pack, built and not run (its tiny real T5 and student)."""
    from trainer_core.project import Project
    return Project.open(demo_cache.built(PACK_ID))


@pytest.fixture(scope="module")
def teacher_dir(demo):
    return resolve_material(demo, "teacher")


@pytest.fixture(scope="module")
def teacher(teacher_dir):
    from trainer_core.packs.common.t5.teacher import T5Teacher
    return T5Teacher(teacher_dir, window=WINDOW, key_mask=False, dit_pad_slots=1)


@pytest.fixture(scope="module")
def prompts(teacher):
    """Demo-like prompts, the empty prompt, and one of more than 511 pieces."""
    from trainer_core.packs.common.tiny_models import demo_prompts
    texts = demo_prompts()
    long = " ".join(texts[:60])
    assert len(teacher.tokenizer.encode(long)) > WINDOW - 1
    return [texts[0], "", texts[1], long, "(masterpiece:1.2) " + texts[2], texts[3], texts[4]]


# ---------------------------------------------------------------- 1. the demo's run, read back through the CLI

def test_real_rows_are_the_supervised_rows_and_no_prompts_give_none(teacher, prompts):
    rows = teacher.real_rows(prompts)
    assert [r.shape[0] for r in rows] == [expected_window(teacher.tokenizer, p)[2] for p in prompts]
    ids, lens = teacher.seed_windows([])
    assert ids.shape == (0, WINDOW) and lens.shape == (0,)
    assert teacher.forward(ids, lens).shape == (0, 0, teacher.out_dim)


def test_teacher_refuses_windows_of_another_length(teacher):
    ids, lens = teacher.seed_windows(["a photo"])
    with pytest.raises(ValueError, match=r"ids \[B, 512\]"):
        teacher.forward(ids[:, :120], lens.clamp(max=120))
    with pytest.raises(ValueError, match="every len must be in 1..512"):
        teacher.forward(ids, torch.tensor([0]))


# ---------------------------------------------------------------- 3. the window rule

@pytest.mark.parametrize("case", ["empty", "short", "attention", "pieces_510", "pieces_511", "pieces_600"])
def test_window_rule(teacher, case):
    tok = teacher.tokenizer
    word = single_piece_word(tok)
    text = {"empty": "", "short": "a photo of a cat", "attention": "a (red:1.3) fox, [sketch]",
            "pieces_510": " ".join([word] * 510), "pieces_511": " ".join([word] * 511),
            "pieces_600": " ".join([word] * 600)}[case]
    ids, lens = teacher.seed_windows([text])
    window, real, supervised = expected_window(tok, text)
    assert ids.dtype == torch.long and ids.shape == (1, WINDOW) and ids[0].tolist() == window
    assert lens.tolist() == [supervised]
    expected = {"empty": (2, 3), "pieces_510": (511, 512), "pieces_511": (512, 512), "pieces_600": (512, 512)}
    if case in expected:
        assert (real, supervised) == expected[case]
    if case == "empty":          # the engine's empty prompt is [▁, EOS]; the DiT also reads the pad after it
        assert window[:4] == [tok.piece_id("▁"), EOS, PAD, PAD]
    if case == "pieces_600":     # cut to 511 pieces + EOS, no pad slot left
        assert window == tok.encode(word) * 511 + [EOS]


def test_mock_window_rule_and_rows():
    from trainer_core.packs.common.t5.teacher import MockT5Teacher
    mock = MockT5Teacher(out_dim=16, vocab_size=500, window=WINDOW, dit_pad_slots=1)
    texts = ["a  red\tfox", "", " ".join(f"w{i}" for i in range(700))]
    ids, lens = mock.seed_windows(texts)
    fox = 2 + zlib.crc32(b"fox") % 498
    assert ids.shape == (3, WINDOW) and lens.tolist() == [5, 2, 512]
    assert ids[0, :5].tolist() == [2 + zlib.crc32(b"a") % 498, 2 + zlib.crc32(b"red") % 498, fox, EOS, PAD]
    assert ids[1, :2].tolist() == [EOS, PAD] and int(ids[2, 511]) == EOS
    assert int(ids[2, 510]) == 2 + zlib.crc32(b"w510") % 498
    out = mock.forward(ids, lens)
    assert out.shape == (3, WINDOW, 16)
    torch.testing.assert_close(mock.real_rows(texts[:1])[0], out[0, :5], rtol=1e-6, atol=1e-6)


def test_budgets_fit_whole_windows(demo, tmp_path):
    from trainer_core.project import Project
    project = Project.open(demo_cache.copy_built(PACK_ID, tmp_path))
    auto = project.pack.budgets(project, torch.device("cpu"))      # CPU auto: 64 prompts, 8192 tokens
    assert (auto.teacher_batch, auto.tok_budget) == (8192 // WINDOW, 8192)
    project.update_settings(["precompute.teacher_batch=3", "precompute.tok_budget=4096"])
    assert project.pack.budgets(project, torch.device("cpu")).teacher_batch == 3
    project.update_settings(["precompute.teacher_batch=0", "precompute.tok_budget=700"])
    assert project.pack.budgets(project, torch.device("cpu")).teacher_batch == 1


def test_pack_dims_mock_and_plan_hooks(demo, teacher):
    pack = demo.pack
    dims = pack.teacher_dims(demo)
    assert dims == {"out_dim": teacher.out_dim, "seed_vocab": teacher.vocab_size, "num_queries": WINDOW}
    config = pack.adapter_config(demo, 64, dims)
    assert (config.kind, config.num_queries, config.seed_vocab) == ("seeded_resampler", WINDOW, teacher.vocab_size)
    mock = pack.build_mock_teacher(demo)
    assert (mock.out_dim, mock.vocab_size, mock.window) == (teacher.out_dim, teacher.vocab_size, WINDOW)
    student = _StubStudent()
    tensors, meta = pack.make_shard(["a red fox", "", "w " * 40], student, mock, Budgets(2, 2 * WINDOW, 2, 64))
    assert meta["prompts"] == ["", "a red fox", "w " * 40] and tensors["seed_len"].tolist() == [2, 5, 42]
    assert tensors["t_pack"].shape == (49, teacher.out_dim) and tensors["seed_ids"].shape == (3, WINDOW)
    weights = (Path(resolve_material(demo, "teacher")) / "model.safetensors").stat().st_size / 2**30
    assert teacher_need_gib(demo) == pytest.approx(weights + 2.5)
    command = pack.ggk_command(demo)
    assert "--diffusion-model chroma1-hd-Q8_0.gguf --vae ae.safetensors" in command
    assert f"--llm-adapter {demo.gguf_path()}" in command and "pig_clip-demo-f16.gguf" in command


def test_a_shards_estimate_follows_the_prompt_files_length(tmp_path):
    """Per sample: a student row a token and the real T5 slots + EOS + the first pad (bf16), the window's seed
    ids (int32); the tokens at 4 characters each of the prompts the corpus reads, 50 when none can be read."""
    project = Project.create(tmp_path / "c", "t5xxl_chroma")
    dims = {"out_dim": 4096, "num_queries": WINDOW}
    assert project.pack.shard_bytes(project, dims, 1024) == 50 * 1024 * 2 + 52 * 4096 * 2 + WINDOW * 4
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("x" * 40 + "\n" + "y" * 80 + "\n", encoding="utf-8")       # 60 characters: 15 tokens
    project.update_settings(["corpus.mode=files", f"corpus.train_file={prompts}", f"corpus.val_file={prompts}"])
    project = Project.open(project.root)
    assert project.pack.shard_bytes(project, dims, 1024) == 15 * 1024 * 2 + 17 * 4096 * 2 + WINDOW * 4
