"""The tiny T5 handed to the engine as a tokenizer pack, and tests/data/engine_t5_windows.json: PixArt T5 windows
computed by ggk's own tokenizer (bench/engine_t5_fixture.py writes it; the tests never run this, they read the
file).

Steps: build the tiny T5 with `write_tiny_t5(folder, TEXTS)`; convert its spiece.model the way
the engine's compiled-in T5 vocabulary was made (Hugging Face's T5 conversion: the pieces and
scores, then `<extra_id_99..0>` at 0.0), with the Metaspace pre-tokenizer the engine reads, into
a tokenizer pack `DIR/t5/tokenizer.json`; run `ggk_tok --version pixart --pack-dir DIR` (the driver
that compiles ggk 0.9.7's tokenizer sources unchanged, bench/engine_driver/build.sh) over PROMPTS once;
store each prompt with the engine's `t5_ids` (the 120 slots), `t5_len` and pieces. The file also records
the texts, the hashes of the tiny spiece.model and of the vocabulary handed to the engine, so the test
notices when write_tiny_t5 or sentencepiece change.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from pathlib import Path

from . import REPO

__all__ = ["ENGINE", "WINDOW", "T5_VERSION", "TEXTS", "PROMPTS", "OUT", "engine_pack", "run_driver", "write_fixture"]

ENGINE = "ggk 0.9.7"
WINDOW = 120
T5_VERSION = "pixart"     # the model version whose conditioner reads the T5 window this records
OUT = REPO / "tests" / "data" / "engine_t5_windows.json"

# the tiny T5's sentencepiece model is trained on these, in this order (character_coverage 1.0:
# every character here is a piece; emoji, ligatures, fullwidth forms, tabs and NBSP are not)
TEXTS = [
    "a cat sitting on a windowsill at sunset, warm light, highly detailed",
    "a red fox in a snowy forest, cinematic lighting, 35mm photo",
    "portrait of a young lady in a castle garden, oil painting by a master",
    "neon city at night, cyberpunk, rain reflections on the street, 8k",
    "a watercolor of a river between mountains, misty morning, soft colors",
    "golden hour over the harbor with boats and dramatic clouds",
    "close-up of a glass bridge in a storm, lantern light, ultra-wide",
    "a robot in the desert, trending on artstation, masterpiece, best quality",
    "café au lait and crème brûlée on a table, naïve style, São Paulo",
    "München and Zürich in winter, a small dog and a big cat",
    "東京の夜景 猫 桜 山",
    "a cat and a dog, a cat with a hat, cats and dogs everywhere",
    "the quick brown fox jumps over the lazy dog",
    "big bang theory poster, break time, fast food and breakfast",
    "aspect ratio 16:9, weight 1.2, version 0.8, 10:30 in the morning",
    "a small house (by the lake) with a [blue] door",
    "literal backslash and quotes, a dash - and a colon: here",
    "line one, line two, spaces and words and more words",
]

# (label, prompt): the attention syntax, whitespace and Unicode cases of issue 26
_WORDS_119 = " ".join(["cat"] * 119)
PROMPTS = [
    ("plain", "a cat sitting on a windowsill at sunset"),
    ("empty", ""),
    ("one_space", " "),
    ("spaces_only", "   "),
    ("round_brackets_only", "()"),
    ("square_brackets_only", "[]"),
    ("weight", "a (red:1.3) fox."),
    ("nested_weights", "((masterpiece)), [blurry], (best quality:1.2), ((a [small] cat):0.8) dog"),
    ("weight_at_start", "(red) fox"),
    ("chunk_trailing_space", "a (b) c"),
    ("unbalanced", "(unbalanced open and [a] ]b stray"),
    ("escaped_brackets", "\\(literal\\) \\[x\\] back\\\\slash"),
    ("aspect_weight", "aspect (16:9) photo"),
    ("stray_weight_closer", "10:30) x"),
    ("break", "cat BREAK dog"),
    ("break_only", "BREAK"),
    ("break_glued", "Big Bang xBREAK y BREAKfast"),
    ("trailing_space", "ends with space "),
    ("leading_spaces", "  two leading spaces"),
    ("single_leading_space", " single lead"),
    ("double_spaces", "double  spaces   inside"),
    ("tabs", "tab\there and\t\ttwo tabs"),
    ("newlines", "line one\nline two\n"),
    ("leading_newline", "\nleading newline"),
    ("crlf", "line\r\nbreak"),
    ("control_char", "bell\x07char"),
    ("emoji", "emoji ❤️ done 🐱🚀"),
    ("cjk", "東京の夜景 猫 日本語のテキスト"),
    ("accents", "café crème brûlée naïve São Paulo München"),
    ("decomposed_accent", "cafe\u0301 decomposed"),
    ("fullwidth", "１２３ fullwidth ＡＢＣ，。"),
    ("ligatures", "ﬁne ligature ﬂower"),
    ("ellipsis", "wait… what"),
    ("superscripts_fractions", "x² ½ Ⅻ"),
    ("nbsp_ideographic_space", "a\u00a0b nbsp a\u3000b ideographic"),
    ("typed_specials", "say </s> and <pad> and <unk> here"),
    ("typed_sentinels", "<extra_id_0> sentinel <extra_id_99>x"),
    ("quotes_dashes", "«quoted» “curly” ‘single’ — dash"),
    ("devanagari", "नमस्ते दुनिया"),
    ("fits_exactly_119", _WORDS_119),
    ("fits_118", " ".join(["cat"] * 118)),
    ("overflow_long", ", ".join(TEXTS[:8]) + ", (extra detail:1.1), " + ", ".join(TEXTS[8:])),
    ("overflow_unknowns", "日本語" * 60),
]


def vocab_hash(vocab: list, unk_id: int) -> str:
    """sha256 of the vocabulary the engine is handed: [[piece, score], …] and unk_id."""
    text = json.dumps({"unk_id": unk_id, "vocab": vocab}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def engine_pack(tiny: Path, pack_dir: Path) -> tuple[list, int]:
    """DIR/t5/tokenizer.json from Hugging Face's conversion of the tiny spiece.model (how the
    engine's own t5 tokenizer.json was made), with the pre-tokenizer keys the engine reads."""
    from transformers import T5Tokenizer

    converted = json.loads(T5Tokenizer.from_pretrained(tiny).backend_tokenizer.to_str())
    model = converted["model"]
    vocab, unk_id = [[p, float(s)] for p, s in model["vocab"]], int(model["unk_id"])
    pack = {"model": {"type": "Unigram", "unk_id": unk_id, "vocab": vocab},
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}}
    (pack_dir / "t5").mkdir(parents=True, exist_ok=True)
    (pack_dir / "t5" / "tokenizer.json").write_text(json.dumps(pack, ensure_ascii=False), encoding="utf-8")
    return vocab, unk_id


def run_driver(driver: str, pack_dir: Path, prompts: list[str], work: Path, version: str = T5_VERSION
               ) -> list[dict]:
    """ggk_tok over `prompts` with the tokenizer pack `pack_dir`, on `version`'s T5 path: one row each."""
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts), encoding="utf-8")
    done = subprocess.run([driver, "--version", version, "--pack-dir", str(pack_dir), "--prompts",
                           str(path), "--verbose", "--caption-length", str(WINDOW)],
                          capture_output=True, check=True)
    # one JSON object a line; split on "\n" only: the pieces may hold other line breaks
    rows = [json.loads(line) for line in done.stdout.split(b"\n") if line.strip()]
    if len(rows) != len(prompts):
        raise SystemExit(f"the driver answered {len(rows)} lines for {len(prompts)} prompts")
    for row, prompt in zip(rows, prompts):
        if "engine_error" in row:
            raise SystemExit(f"the engine would abort on {prompt!r}: {row['engine_error']}")
    return rows


def write_fixture(driver: str, out: Path = OUT) -> int:
    """Run ggk_tok at `driver` over PROMPTS and write the fixture to `out`; the number of windows."""
    from trainer_core.packs.common.t5.tiny import write_tiny_t5
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tiny = write_tiny_t5(work / "tiny_t5", TEXTS)
        vocab, unk_id = engine_pack(tiny, work / "pack")
        rows = run_driver(driver, work / "pack", [p for _, p in PROMPTS], work)
        spiece_sha = hashlib.sha256((tiny / "spiece.model").read_bytes()).hexdigest()
    cases = [{"label": label, "prompt": prompt, "t5_len": row["t5_len"], "t5_ids": row["t5_ids"],
              "t5_pieces": row.get("t5_pieces")} for (label, prompt), row in zip(PROMPTS, rows)]
    by_label = {c["label"]: c for c in cases}
    if by_label["fits_exactly_119"]["t5_len"] != WINDOW or by_label["fits_118"]["t5_len"] != WINDOW - 1:
        raise SystemExit("'cat' is no longer one piece of the tiny T5: pick another word for the "
                         "boundary cases")
    header = {
        "what": "PixArt T5 seed windows (120 slots) computed by the engine itself over the tiny T5's vocabulary",
        "engine": ENGINE,
        "driver": f"ggk_tok --version {T5_VERSION} --pack-dir DIR --verbose (the engine's tokenizer sources "
                  "compiled unchanged; bench/engine_driver)",
        "generated_by": "python bench/engine_t5_fixture.py",
        "tokenizer_pack": "DIR/t5/tokenizer.json = Hugging Face's T5 conversion of the tiny spiece.model "
                          "(pieces, then <extra_id_99..0> at 0.0), Metaspace ▁ with add_prefix_space",
        "tiny_t5": "trainer_core.packs.common.t5.tiny.write_tiny_t5(folder, tiny_t5_texts)",
        "spiece_sha256": spiece_sha,
        "vocab_sha256": vocab_hash(vocab, unk_id),
        "vocab_size": len(vocab),
        "window": WINDOW,
        "tiny_t5_texts": TEXTS,
    }
    # the header indented, then one case a line, so that a diff shows which windows moved
    head = json.dumps(header, ensure_ascii=False, indent=1)          # ends with "\n}"
    text = (head[:-2] + ',\n "cases": [\n'
            + ",\n".join(" " + json.dumps(c, ensure_ascii=False) for c in cases) + "\n ]\n}\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    json.loads(out.read_text(encoding="utf-8"))
    return len(cases)
