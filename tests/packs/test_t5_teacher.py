"""The PixArt teacher on a tiny real T5 encoder (written by trainer_core.packs.common.tiny_models) and the mock.

The windows are the engine's (contract/engine_t5.py; tests/packs/test_engine_t5.py checks them
against ggk's own tokenizer): here they are checked for their shape rules (pieces + EOS, pad 0 to
120, cut to 119 + EOS). Expected rows come from the HF model run over the full 120-slot window.
"""
from __future__ import annotations

import json
import random
import socket
import zlib
from types import SimpleNamespace

import pytest
import sentencepiece as spm
import torch

from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.common.t5.teacher import (
    T5_EOS, T5_PAD, T5_WINDOW, MockT5Teacher, T5Teacher, auto_budgets, greedy_batches,
    load_t5_tokenizer, resolve_teacher_mode, seed_windows, teacher_weights_gib,
)
from trainer_core.packs.common.t5.tiny import T5_EXTRA_IDS, write_tiny_t5

WORDS = ("cat dog sheep sunglasses portrait lady castle forest neon city night sunset river mountain "
         "cyberpunk watercolor oil painting glass bridge storm lantern desert robot close-up young "
         "highly detailed 8k trending on artstation by greg rutkowski, of a the in with and golden "
         "hour cinematic lighting 35mm photo dramatic clouds misty morning harbor boats reflections "
         "café crème brûlée naïve São Paulo München 東京 夜景 の 猫 ultra-wide "
         "(masterpiece:1.2)").split()
FILES = {"config.json", "model.safetensors", "spiece.model", "special_tokens_map.json",
         "tokenizer_config.json"}


def make_prompts(n: int, seed: int, max_words: int = 20) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words))) for _ in range(n)]


TEXTS = make_prompts(300, seed=1)


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return write_tiny_t5(tmp_path_factory.mktemp("t5"), TEXTS)


@pytest.fixture(scope="module")
def sp(t5_dir):
    return spm.SentencePieceProcessor(model_file=str(t5_dir / "spiece.model"))


@pytest.fixture(scope="module")
def teacher(t5_dir):
    return T5Teacher(t5_dir)


def single_piece_word(tok) -> str:
    """A word that is one piece alone and n pieces repeated n times."""
    for word in WORDS:
        if len(tok.encode(word)) == 1 and len(tok.encode(" ".join([word] * 7))) == 7:
            return word
    raise AssertionError("no single-piece word in the tiny vocabulary")


# ---------------------------------------------------------------- real teacher rows

def test_batched_rows_equal_full_window_runs_bit_for_bit(teacher):
    prompts = make_prompts(198, seed=7, max_words=25) + ["", "café au lait à São Paulo 東京 🐱🚀"]
    ids, lens = teacher.seed_windows(prompts)
    out = teacher.forward(ids, lens)
    longest = int(lens.max())
    assert out.dtype == torch.float32 and out.shape == (len(prompts), longest, teacher.out_dim)
    assert 2 == int(lens.min()) and longest < T5_WINDOW   # the batch really is cut short
    with torch.inference_mode():
        for i, text in enumerate(prompts):
            window, n = teacher.tokenizer.window(text, T5_WINDOW)
            full_ids = torch.tensor([window])                                  # [1, 120]
            full_mask = (torch.arange(T5_WINDOW) < n).long()[None]             # [1, 120]: pieces + EOS
            ref = teacher.model(input_ids=full_ids, attention_mask=full_mask).last_hidden_state
            assert int(lens[i]) == n and ids[i].tolist() == window
            assert torch.equal(out[i, :n], ref[0, :n]), (i, text)


def test_real_rows_are_the_real_slots(teacher):
    prompts = ["a cat", "", "golden hour cinematic lighting over the harbor"]
    rows = teacher.real_rows(prompts)
    ids, lens = teacher.seed_windows(prompts)
    out = teacher.forward(ids, lens)
    for i, text in enumerate(prompts):
        n = teacher.tokenizer.window(text, T5_WINDOW)[1]
        assert rows[i].shape == (n, teacher.out_dim)
        assert torch.equal(rows[i], out[i, :n])


# ---------------------------------------------------------------- seed windows

@pytest.mark.parametrize("case", ["empty", "long", "exactly_119", "exactly_118", "unicode", "spaces"])
def test_seed_window_table(teacher, case):
    tok = teacher.tokenizer
    word = single_piece_word(tok)
    text = {
        "empty": "",
        "long": " ".join(make_prompts(40, seed=3)),
        "exactly_119": " ".join([word] * 119),
        "exactly_118": " ".join([word] * 118),
        "unicode": "crème brûlée, naïve 東京の夜景 🐱🚀 Ωmega",
        "spaces": "  two  spaces\tand a tab ",
    }[case]
    pieces = [i for chunk, _ in parse_prompt_attention(text) for i in tok.encode(chunk)]
    ids, lens = seed_windows(tok, [text])
    n = int(lens[0])
    assert ids.dtype == torch.long and lens.dtype == torch.long and ids.shape == (1, T5_WINDOW)
    assert ids[0].tolist() == pieces[:n - 1] + [T5_EOS] + [T5_PAD] * (T5_WINDOW - n)
    assert n == min(len(pieces) + 1, T5_WINDOW)
    assert (ids < teacher.vocab_size).all()
    expected_len = {"empty": 2, "long": 120, "exactly_119": 120, "exactly_118": 119}
    if case in expected_len:
        assert n == expected_len[case]
    if case == "empty":   # the engine's empty prompt is [▁, EOS] (Hugging Face's T5 gave [EOS])
        assert ids[0, :3].tolist() == [tok.piece_id("▁"), T5_EOS, T5_PAD]
    if case == "long":
        assert len(pieces) > 119
    if case == "unicode":   # characters the tiny vocabulary never saw are one <unk> each, not fused
        assert tok.unk_id in pieces and tok.encode("🐱🚀") == [tok.piece_id("▁"), tok.unk_id, tok.unk_id]
    if case == "spaces":    # a leading space is a ▁ piece of its own; the tab stays, as <unk>
        assert pieces[0] == tok.piece_id("▁") and tok.unk_id in pieces


def test_sentinels_follow_the_pieces_like_t5(teacher, sp):
    tok = teacher.tokenizer
    assert teacher.vocab_size == sp.get_piece_size() + T5_EXTRA_IDS == len(tok)
    assert tok.piece_id("<extra_id_0>") == teacher.vocab_size - 1
    assert tok.piece_id("<extra_id_99>") == sp.get_piece_size()


def test_no_prompts_give_empty_windows(teacher):
    ids, lens = teacher.seed_windows([])
    assert ids.shape == (0, T5_WINDOW) and lens.shape == (0,)
    assert teacher.forward(ids, lens).shape == (0, 0, teacher.out_dim)


def test_tokenizer_folder_without_spiece_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match="spiece.model"):
        load_t5_tokenizer(tmp_path)


def test_tokenizer_without_t5_pad_and_eos_ids_is_refused(tmp_path):
    vocab = [["</s>", 0.0], ["<pad>", 0.0], ["<unk>", 0.0], ["▁", -1.0]]   # EOS and PAD swapped
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "unk_id": 2, "vocab": vocab}}))
    with pytest.raises(ModelFileError, match="</s> = 1 and <pad> = 0"):
        load_t5_tokenizer(tmp_path)


# ---------------------------------------------------------------- placement

def test_offload_streams_weights_and_matches_resident(t5_dir, teacher):
    resident = T5Teacher(t5_dir, mode="gpu")        # "resident on the device", here the CPU
    offload = T5Teacher(t5_dir, mode="offload")
    assert resident.mode == "cpu" and offload.mode == "offload"
    assert not hasattr(resident.model, "_hf_hook")
    assert type(offload.model._hf_hook).__name__ == "AlignDevicesHook"
    assert {p.device.type for p in offload.model.parameters()} == {"meta"}   # weights live in the hooks
    assert {p.device.type for p in resident.model.parameters()} == {"cpu"}
    prompts = make_prompts(24, seed=11)
    ids, lens = resident.seed_windows(prompts)
    assert torch.equal(resident.forward(ids, lens), offload.forward(ids, lens))
    assert torch.equal(resident.forward(ids, lens), teacher.forward(ids, lens))


def test_auto_mode_on_cpu_is_resident(teacher):
    assert teacher.mode == "cpu" and teacher.device == torch.device("cpu")
    assert {p.device.type for p in teacher.model.parameters()} == {"cpu"}


@pytest.mark.parametrize("mode, device, gpu_mem_gib, expected", [
    ("auto", "cuda:0", 12.0, "gpu"),        # 9.5 + 2.5 fits exactly
    ("auto", "cuda:0", 11.9, "offload"),
    ("auto", "cuda", 40.0, "gpu"),
    ("gpu", "cuda:0", 2.0, "gpu"),          # asked for: resident even on a small budget
    ("offload", "cuda:0", 80.0, "offload"),
    ("offload", "cpu", 0.0, "offload"),
    ("auto", "cpu", 0.0, "cpu"),
    ("gpu", "cpu", 0.0, "cpu"),
])
def test_teacher_mode_rule(mode, device, gpu_mem_gib, expected):
    assert resolve_teacher_mode(mode, torch.device(device), gpu_mem_gib, 9.5) == expected


def test_unknown_teacher_mode_is_refused():
    with pytest.raises(UsageError, match="auto, gpu, offload"):
        resolve_teacher_mode("resident", torch.device("cpu"), 0.0, 9.5)


def test_weights_size_is_measured_or_assumed(t5_dir, tmp_path):
    assert teacher_weights_gib(t5_dir) == (t5_dir / "model.safetensors").stat().st_size / 2**30
    assert teacher_weights_gib(tmp_path) == 9.5


# ---------------------------------------------------------------- budgets and batching

def test_auto_budgets_small_and_cpu():
    small = {"teacher_batch": 64, "tok_budget": 8192, "student_batch": 64}
    assert auto_budgets("cpu") == small
    assert auto_budgets(torch.device("cpu")) == small


@pytest.mark.parametrize("total, expected", [
    (25e9, {"teacher_batch": 256, "tok_budget": 24576, "student_batch": 256}),
    (24e9, {"teacher_batch": 64, "tok_budget": 8192, "student_batch": 64}),   # big means > 24e9
    (8e9, {"teacher_batch": 64, "tok_budget": 8192, "student_batch": 64}),
])
def test_auto_budgets_by_card_size(monkeypatch, total, expected):
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=total))
    assert auto_budgets("cuda:0") == expected


@pytest.mark.parametrize("lengths, max_count, tok_budget, expected", [
    ([], 4, 100, []),
    ([10, 10, 10, 10, 10], 2, 1000, [[0, 1], [2, 3], [4]]),           # the count cap
    ([10, 20, 30, 40], 10, 60, [[0, 1], [2], [3]]),                   # 2·20 ≤ 60 < 3·30
    ([50, 50, 50], 8, 100, [[0, 1], [2]]),                            # (count+1)·len == budget joins
    ([200], 4, 100, [[0]]),                                           # over budget: alone, still run
    ([1, 300, 300], 4, 100, [[0], [1], [2]]),
    ([3, 120, 120], 64, 8192, [[0, 1, 2]]),
])
def test_greedy_batches_rule(lengths, max_count, tok_budget, expected):
    assert greedy_batches(lengths, max_count, tok_budget) == expected


# ---------------------------------------------------------------- mock teacher

def test_mock_windows_follow_the_crc32_rule():
    mock = MockT5Teacher(out_dim=16, vocab_size=500)
    ids, lens = mock.seed_windows(["a  red\tfox", "", " ".join(f"w{i}" for i in range(300))])
    fox = 2 + zlib.crc32("fox".encode("utf-8")) % 498
    assert ids[0, :4].tolist() == [mock.word_id("a"), mock.word_id("red"), fox, T5_EOS]
    assert (ids[0, 4:] == T5_PAD).all() and int(lens[0]) == 4
    assert ids[1, :2].tolist() == [T5_EOS, T5_PAD] and int(lens[1]) == 1
    assert int(lens[2]) == 120 and int(ids[2, 119]) == T5_EOS
    assert int(ids[2, 118]) == 2 + zlib.crc32(b"w118") % 498
    assert ids.shape == (3, T5_WINDOW) and ((ids >= 0) & (ids < 500)).all()


def test_mock_rows_are_deterministic_and_per_prompt():
    prompts = ["a red fox", "", "a castle in the misty morning over the harbor with boats"]
    a, b = MockT5Teacher(24, 1000), MockT5Teacher(24, 1000)
    assert a.mode == "mock" and (a.out_dim, a.vocab_size) == (24, 1000)
    ids, lens = a.seed_windows(prompts)
    out = a.forward(ids, lens)
    assert out.dtype == torch.float32 and out.shape == (3, int(lens.max()), 24)
    assert torch.equal(out, b.forward(*b.seed_windows(prompts)))
    alone = a.real_rows(prompts[:1])[0]
    torch.testing.assert_close(alone, out[0, :int(lens[0])], rtol=1e-6, atol=1e-6)
    # the formula on the full window: x = table[ids] + pos, x + 0.5·roll(x, 1)
    table = a.embed_a @ a.embed_b / 8
    x = table[ids] + a.pos
    full = x + 0.5 * torch.roll(x, 1, dims=1)
    torch.testing.assert_close(out, full[:, :out.shape[1]], rtol=1e-5, atol=1e-5)
    assert not torch.equal(out[0], out[2, :out.shape[1]])


def test_mock_is_light_at_t5_xxl_size():
    mock = MockT5Teacher(4096, 32128)
    numel = sum(t.numel() for t in vars(mock).values() if isinstance(t, torch.Tensor))
    assert numel < 5e6
    rows = mock.real_rows(["close-up portrait of a young lady"])
    assert rows[0].shape == (7, 4096)


# ---------------------------------------------------------------- tiny snapshot

def test_write_tiny_t5_is_byte_identical(tmp_path, t5_dir):
    again = write_tiny_t5(tmp_path / "again", TEXTS)
    names = {p.name for p in again.iterdir()}
    assert names == {p.name for p in t5_dir.iterdir()} and FILES <= names
    for name in names:
        assert (again / name).read_bytes() == (t5_dir / name).read_bytes(), name


def test_tiny_t5_loads_offline(t5_dir, sp, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the teacher tried to reach the network")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    teacher = T5Teacher(t5_dir, device="cpu", mode="auto")
    assert (teacher.out_dim, teacher.vocab_size) == (64, sp.get_piece_size() + T5_EXTRA_IDS)
    assert teacher.mode == "cpu"
    assert [r.shape[0] for r in teacher.real_rows(["a cat", ""])] == [len(teacher.tokenizer.encode("a cat")) + 1, 2]
