"""The PixArt T5 window as ggk 0.9.7 builds it (trainer_core/contract/engine_t5.py).

The expected windows are the engine's own: tests/data/engine_t5_windows.json holds what ggk's
tokenizer sources (the `ggk_tok` driver, compiled unchanged) gave over the tiny T5's vocabulary
for each prompt; bench/engine_t5_fixture.py wrote it. Here the tiny T5 is rebuilt from the same
texts and EngineT5 must give the same 120 slots for every prompt. The hand-made vocabularies
below pin the rules one at a time.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.engine_t5 import EOS_ID, PAD_ID, EngineT5
from trainer_core.packs.common.t5.tiny import write_tiny_t5

FIXTURE = json.loads((Path(__file__).resolve().parent.parent / "data" / "engine_t5_windows.json")
                     .read_text(encoding="utf-8"))
CASES = {case["label"]: case for case in FIXTURE["cases"]}
WINDOW = FIXTURE["window"]


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory) -> Path:
    return write_tiny_t5(tmp_path_factory.mktemp("t5"), FIXTURE["tiny_t5_texts"])


@pytest.fixture(scope="module")
def engine(tiny_t5) -> EngineT5:
    return EngineT5.from_folder(tiny_t5)


# ---------------------------------------------------------------- against the engine

def test_fixture_is_of_this_tiny_t5(tiny_t5, engine):
    spiece = hashlib.sha256((tiny_t5 / "spiece.model").read_bytes()).hexdigest()
    vocab = [[piece, float(score)] for piece, score in zip(engine.pieces, engine.scores)]
    text = json.dumps({"unk_id": engine.unk_id, "vocab": vocab}, ensure_ascii=False, separators=(",", ":"))
    regenerate = "; regenerate it with: python bench/engine_t5_fixture.py"
    assert spiece == FIXTURE["spiece_sha256"], "write_tiny_t5 no longer gives the fixture's spiece.model" + regenerate
    # the vocabulary read from spiece.model is the one the engine was handed (Hugging Face's conversion)
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == FIXTURE["vocab_sha256"], \
        "EngineT5's vocabulary differs from the one the engine tokenized with" + regenerate
    assert len(engine) == FIXTURE["vocab_size"] and FIXTURE["engine"] == "ggk 0.9.7"


def test_fixture_covers_the_issue_cases():
    assert len(CASES) >= 25
    assert {"empty", "round_brackets_only", "break", "tabs", "emoji", "cjk", "fullwidth", "ligatures",
            "ellipsis", "overflow_long", "escaped_brackets", "nested_weights"} <= set(CASES)
    assert CASES["overflow_long"]["t5_len"] == WINDOW and CASES["empty"]["t5_len"] == 2


@pytest.mark.parametrize("label", sorted(CASES))
def test_window_equals_the_engine(engine, label):
    case = CASES[label]
    ids, n = engine.window(case["prompt"], WINDOW)
    assert n == case["t5_len"], (case["prompt"], case["t5_pieces"])
    assert ids == case["t5_ids"], (case["prompt"], case["t5_pieces"], [engine.pieces[i] for i in ids[:n]])


def test_windows_batch_equals_the_engine(engine):
    prompts = [case["prompt"] for case in CASES.values()]
    ids, lens = engine.windows(prompts, WINDOW)
    assert ids.dtype == torch.long and lens.dtype == torch.long
    assert ids.shape == (len(prompts), WINDOW) and lens.shape == (len(prompts),)
    assert ids.tolist() == [case["t5_ids"] for case in CASES.values()]
    assert lens.tolist() == [case["t5_len"] for case in CASES.values()]
    empty_ids, empty_lens = engine.windows([], WINDOW)
    assert empty_ids.shape == (0, WINDOW) and empty_lens.shape == (0,)


# ---------------------------------------------------------------- the rules, by hand

# ids: 0 <pad>, 1 </s>, 2 <unk>, 3 ▁, 4 a, 5 b, 6 ▁a, 7 ab
HAND = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0), ("a", -3.0), ("b", -3.0),
        ("▁a", -2.0), ("ab", -3.0)]
SP, A, B, SP_A, AB, UNK = 3, 4, 5, 6, 7, 2


def hand() -> EngineT5:
    return EngineT5(HAND, unk_id=UNK)


def test_empty_prompt_is_the_metaspace_piece_then_eos():
    ids, n = hand().window("", WINDOW)
    assert n == 2 and ids == [SP, EOS_ID] + [PAD_ID] * (WINDOW - 2)
    assert hand().window("()", WINDOW) == (ids, n) == hand().window(" ", WINDOW)


def test_leading_space_adds_a_metaspace_piece_and_trailing_space_is_dropped():
    tok = hand()
    assert tok.encode("a") == [SP_A]
    assert tok.encode(" a") == [SP, SP_A]          # "▁▁a"
    assert tok.encode("  a") == [SP, SP_A]         # runs of spaces collapse first
    assert tok.encode("a ") == tok.encode("a  ") == [SP_A]


def test_tab_and_newline_are_unknown_characters_inside_the_word():
    tok = hand()
    assert tok.encode("a\tb") == [SP_A, UNK, B]    # "▁a\tb": the tab is not a space
    assert tok.encode("a\nb") == [SP_A, UNK, B]


def test_unknown_characters_are_not_fused():
    assert hand().encode("éü") == [SP, UNK, UNK]
    assert hand().encode("日本語") == [SP, UNK, UNK, UNK]


def test_unknown_scores_min_score_minus_10():
    # "▁q", q no piece: [▁q] against [▁, <unk>] = 20 + (−5 − 10) = 5, the min score −5 being z's
    def tok(score: float) -> EngineT5:
        return EngineT5([*HAND[:3], ("▁", 20.0), ("z", -5.0), ("▁q", score)], unk_id=UNK)
    assert tok(5.5).encode("q") == [5]
    assert tok(4.5).encode("q") == [SP, UNK]


def test_viterbi_takes_the_best_path_and_keeps_the_first_on_a_tie():
    tok = hand()
    # "▁ab": [▁a, b] and [▁, ab] both score −5; [▁, ab] ends at "b" first (it starts earlier)
    assert tok.encode("ab") == [SP, AB]
    better = EngineT5([*HAND, ("▁ab", -4.0)], unk_id=UNK)
    assert better.encode("ab") == [8]


def test_special_strings_split_the_text_and_each_segment_gets_its_metaspace():
    tok = hand()
    assert tok.encode("a</s>b") == [SP_A, EOS_ID, SP, B]
    assert tok.encode("<pad>") == [PAD_ID]
    assert tok.encode("a <unk> a") == [SP_A, UNK, SP, SP_A]


def test_attention_chunks_are_encoded_one_by_one_and_weights_do_not_change_ids():
    tok = hand()
    assert tok.window("(a:1.5)", WINDOW) == tok.window("a", WINDOW)
    assert tok.window("a(b)", WINDOW)[0][:3] == [SP_A, SP, B]   # "b" alone gets its own ▁


def test_overflow_keeps_the_first_pieces_and_ends_with_eos():
    tok = hand()
    ids, n = tok.window(" ".join(["a"] * 200), WINDOW)
    assert n == WINDOW and ids == [SP_A] * (WINDOW - 1) + [EOS_ID]
    ids, n = tok.window(" ".join(["a"] * 119), WINDOW)
    assert n == WINDOW and ids == [SP_A] * 119 + [EOS_ID]
    ids, n = tok.window("a", 300)                                # PixArt-Sigma's caption length
    assert n == 2 and len(ids) == 300


def test_sentinels_follow_the_spiece_pieces(engine, tiny_t5):
    import sentencepiece as spm
    pieces = spm.SentencePieceProcessor(model_file=str(tiny_t5 / "spiece.model")).get_piece_size()
    assert len(engine) == pieces + 100
    assert engine.piece_id("<extra_id_99>") == pieces and engine.piece_id("<extra_id_0>") == len(engine) - 1
    assert engine.scores[-1] == 0.0 and engine.encode("<extra_id_0>") == [engine.piece_id("▁"), len(engine) - 1]


def test_unreadable_spiece_model_is_a_model_file_error(tmp_path):
    (tmp_path / "spiece.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(ModelFileError, match="cannot be read"):
        EngineT5.from_folder(tmp_path)
    with pytest.raises(ModelFileError, match="neither spiece.model nor tokenizer.json"):
        EngineT5.from_folder(tmp_path / "missing")
