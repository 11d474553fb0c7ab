"""The Ming-Image template and image rule (packs-contract-more §D.1 2, 7) against the engine.

The expected values come from ggk 0.9.7's own code: `bench/engine_ming_fixture.py` cuts smart_resize,
vision_input_size, preprocess_vision_image, build_prompt_tokens and parse_ming_image_layers out of
the sdist unchanged, compiles them behind bench/engine_driver/ming_image.cpp and writes
tests/data/engine_ming_images.json. The patch layout is checked against transformers' own Qwen2-VL
image processor; the tokenizer is a byte-level BPE stand-in built here with the specials at their ids.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.ming_image.template import (FACTOR, IMAGE_END, IMAGE_PATCH, IMAGE_START, LOADER_MAX_PIXELS,
                                                    LOADER_MIN_PIXELS, NUM_QUERIES, SUFFIX,
                                                    SYSTEM_PREFIX, VISION_PIXELS, build_prompt_ids, check_template,
                                                    encoder, image_grid, image_tokens, layer_count, layer_prompt,
                                                    pad_id, patchify, preprocess_image, preprocess_pixels,
                                                    prompt_string, smart_resize, thinker_ids)

FIXTURE = json.loads((Path(__file__).resolve().parent.parent / "data" / "engine_ming_images.json")
                     .read_text(encoding="utf-8"))
# The stand-in tokenizer's specials: the image ids and BOS/EOS are the engine's (ming_image_te.hpp:40-42,
# ling_tokenizer.cpp:191-194); <role>, </role>, <|role_end|> the published mock's guesses (the real
# ids come from the real tokenizer.json).
SPECIAL_IDS = {"<|startoftext|>": 156891, "<|endoftext|>": 156892, "<|role_end|>": 156895, "<role>": 157151,
               "</role>": 157152, "<imagePatch>": IMAGE_PATCH, "<image>": IMAGE_START, "</image>": IMAGE_END}
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073])
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711])


def png_bytes(array: np.ndarray) -> bytes:
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def byte_level_bpe(specials: dict[str, int], added: tuple[str, ...] | None = None, rstrip: tuple[str, ...] = ()):
    """A byte-level BPE (GPT-2 byte order, a few merges) with `specials` in the vocabulary at their
    ids and the names of `added` (default: all of them) registered as special tokens (those in
    `rstrip` swallowing the whitespace after them)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    # sorted by code point = GPT-2's byte order (printable bytes as themselves, the rest at 256 + n)
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("r", "o"), ("l", "e"), ("ro", "le"), ("i", "n"), ("Ġ", "a")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    names = tuple(specials) if added is None else added
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False, rstrip=name in rstrip) for name in names])
    return tok


@pytest.fixture(scope="module")
def tokenizer():
    tok = byte_level_bpe(SPECIAL_IDS)
    assert [tok.token_to_id(name) for name in SPECIAL_IDS] == list(SPECIAL_IDS.values())
    return tok


# ---------------------------------------------------------------- image sizes

def test_the_constants_are_the_engines():
    ids = FIXTURE["ids"]
    assert (ids["image_start"], ids["image_patch"], ids["image_end"]) == (IMAGE_START, IMAGE_PATCH, IMAGE_END)
    assert (ids["factor"], ids["pixels"], ids["loader_min"], ids["loader_max"]) == (
        FACTOR, VISION_PIXELS, LOADER_MIN_PIXELS, LOADER_MAX_PIXELS)


def test_image_sizes_and_token_counts_equal_the_engine():
    assert len(FIXTURE["sizes"]) >= 24
    wrong = []
    for case in FIXTURE["sizes"]:
        h, w = case["h"], case["w"]
        ours = (smart_resize(h, w), image_grid(h, w), image_tokens(h, w))
        if ours != (tuple(case["first"]), (case["h_bar"], case["w_bar"]), case["n_tokens"]):
            wrong.append((case["label"], ours))
    assert wrong == []
    counts = {c["label"]: c["n_tokens"] for c in FIXTURE["sizes"]}
    assert (counts["flickr_landscape"], counts["flickr_333"], counts["vga"], counts["full_hd"]) == (609, 600, 588, 558)


def test_the_first_rounding_is_half_to_even():
    # 70 / 28 = 2.5 → 2 (nearbyint), where llround would give 3; the engine's fixture case shows
    # the final size follows the even choice
    assert smart_resize(70, 300) == (56, 308)
    case = next(c for c in FIXTURE["sizes"] if c["label"] == "half_even_300x70")
    assert image_grid(70, 300) == (case["h_bar"], case["w_bar"])
    with pytest.raises(ValueError):
        smart_resize(0, 10)


# ---------------------------------------------------------------- layer prompts

def test_layer_counts_equal_the_engine():
    assert len(FIXTURE["layers"]) >= 10
    assert [(c["label"], layer_count(c["prompt"])) for c in FIXTURE["layers"]] == [
        (c["label"], c["layers"]) for c in FIXTURE["layers"]]


@pytest.mark.parametrize("style", ["decompose", "number"])
def test_layer_prompt_round_trips(style):
    texts = ["", "a cat on a sofa", "Layer 1: background\nLayer 2: the cat", "sunset, 3 boats, 2 birds"]
    for n in (1, 2, 3, 5, 8, 12):
        for text in texts:
            prompt = layer_prompt(text, n, style)
            assert layer_count(prompt) == n
            assert text in prompt and (text == "" or "\n" in prompt)


def test_layer_prompt_refuses_what_the_engine_would_misread():
    with pytest.raises(ValueError, match="already names"):
        layer_prompt("Decompose this image into 4 layers", 3, "number")
    with pytest.raises(ValueError, match="already names"):
        layer_prompt("Number of layers: 2", 6, "number")        # the first such line wins
    with pytest.raises(ValueError):
        layer_prompt("a cat", 0)
    with pytest.raises(ValueError):
        layer_prompt("a cat", 3, "lines")


# ---------------------------------------------------------------- prompt ids

def test_the_prompt_layout_equals_the_engine():
    for case in FIXTURE["prompts"]:
        calls: list[str] = []

        def encode(text: str) -> list[int]:
            calls.append(text)
            return list(text.encode("utf-8"))

        ids, image_start = build_prompt_ids(encode, case["text"], case["n_image"])
        assert (ids, calls, image_start) == (case["ids"], case["encode_calls"], case["block_start"]), case["label"]


def test_prompt_ids_on_a_tokenizer(tokenizer):
    encode = encoder(tokenizer)
    prefix, newline = encode(SYSTEM_PREFIX), tokenizer.token_to_id("Ċ")
    assert prefix[0] == SPECIAL_IDS["<role>"] and SPECIAL_IDS["<|startoftext|>"] not in prefix   # no BOS

    ids, start = build_prompt_ids(encode, "make it night", 5)
    assert start == len(prefix) + 1
    assert ids[:len(prefix)] == prefix and ids[start - 1] == IMAGE_START
    assert ids[start:start + 5] == [IMAGE_PATCH] * 5 and ids[start + 5] == IMAGE_END
    assert ids[start + 6] == newline and ids[start + 6:] == encode("\nmake it night" + SUFFIX)
    assert ids[-1] != SPECIAL_IDS["<|endoftext|>"]

    plain, none = build_prompt_ids(encode, "a sheep in sunglasses")
    assert none == -1 and IMAGE_PATCH not in plain and newline not in plain[len(prefix):]
    assert plain == encode(prompt_string("a sheep in sunglasses"))
    empty, _ = build_prompt_ids(encode, "")                        # not replaced by anything
    assert empty == prefix + encode(SUFFIX)

    full = thinker_ids(ids)
    assert len(full) == len(ids) + NUM_QUERIES + 2
    assert full[len(ids)] == IMAGE_START and full[-1] == IMAGE_END
    assert full[len(ids) + 1:-1] == [IMAGE_PATCH] * NUM_QUERIES


def test_check_template_and_pad_on_a_good_tokenizer(tokenizer):
    encode = encoder(tokenizer)
    check_template(encode)
    assert pad_id(encode) == SPECIAL_IDS["<|role_end|>"]


def test_tokenizers_that_break_the_template_are_refused():
    cases = {
        "no specials": byte_level_bpe(SPECIAL_IDS, added=()),
        "<image> elsewhere": byte_level_bpe({**SPECIAL_IDS, "<image>": 157160}),
        "<|role_end|> split": byte_level_bpe(SPECIAL_IDS, added=tuple(n for n in SPECIAL_IDS if n != "<|role_end|>")),
        "</image> eats the newline": byte_level_bpe(SPECIAL_IDS, rstrip=("</image>",)),
    }
    for label, broken in cases.items():
        with pytest.raises(ModelFileError, match="tokenizer of the Ming teacher") as error:
            check_template(encoder(broken))
        if label == "</image> eats the newline":       # only the whole string loses the "\n"
            assert "piece by piece" in str(error.value)
    with pytest.raises(ModelFileError, match="splits <\\|role_end\\|>"):
        pad_id(lambda s: list(s.encode("utf-8")))


# ---------------------------------------------------------------- pixels

def pattern_image(width: int, height: int, channels: int) -> np.ndarray:
    """The fixture's pixel formula (its `pixel_formula` field)."""
    y = np.arange(height)[:, None, None]
    x = np.arange(width)[None, :, None]
    c = np.arange(channels)[None, None, :]
    return ((7 * x + 13 * y + 101 * c + (x * y) % 251 + ((x ^ y) % 17) * 9) % 256).astype(np.uint8)


def test_preprocessing_equals_the_engine():
    assert "7*x + 13*y + 101*c" in FIXTURE["pixel_formula"]
    for case in FIXTURE["images"]:
        image = pattern_image(case["w"], case["h"], case["channels"])
        if case["channels"] == 1:
            image = image[..., 0]
        out = preprocess_image(png_bytes(image))
        assert out.shape == (case["h_bar"], case["w_bar"], 3) and out.dtype == np.float32, case["label"]
        where = np.array([s[:3] for s in case["samples"]])
        want = np.array([s[3] for s in case["samples"]], dtype=np.float32)
        np.testing.assert_allclose(out[where[:, 0], where[:, 1], where[:, 2]], want, rtol=0, atol=1e-6,
                                   err_msg=case["label"])
        np.testing.assert_allclose(out.reshape(-1, 3).mean(0, dtype=np.float64), case["channel_mean"], atol=1e-7)


def test_alpha_is_dropped_not_composited():
    rng = np.random.default_rng(5)
    rgba = rng.integers(0, 256, (60, 90, 4), dtype=np.uint8)
    rgba[..., 3] = rng.integers(0, 256, (60, 90), dtype=np.uint8)
    from_rgba = preprocess_image(png_bytes(rgba))
    assert np.array_equal(from_rgba, preprocess_image(png_bytes(np.ascontiguousarray(rgba[..., :3]))))
    alpha = rgba[..., 3:] / 255.0
    over_white = (rgba[..., :3] * alpha + 255 * (1 - alpha)).round().astype(np.uint8)
    assert not np.allclose(from_rgba, preprocess_image(png_bytes(over_white)))


def test_shape_and_normalization_computed_independently():
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, (448, 1008, 3), dtype=np.uint8)     # already the tower's size: no resample
    want = (image / 255.0 - CLIP_MEAN) / CLIP_STD
    np.testing.assert_allclose(preprocess_pixels(image.astype(np.float32) / 255.0), want, atol=1e-6)
    flat = np.full((375, 500, 3), 200, dtype=np.uint8)              # a resampled flat image stays flat
    out = preprocess_image(png_bytes(flat))
    assert out.shape == (588, 812, 3)
    np.testing.assert_allclose(out, np.broadcast_to((200 / 255.0 - CLIP_MEAN) / CLIP_STD, out.shape), atol=1e-5)
    bright = preprocess_pixels(np.ones((40, 50, 3), np.float32))     # bicubic overshoot is clamped to 1
    np.testing.assert_allclose(bright, np.broadcast_to((1 - CLIP_MEAN) / CLIP_STD, bright.shape), atol=1e-5)


def test_patchify_equals_transformers_qwen2_vl_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rng = np.random.default_rng(11)
    image = rng.integers(0, 256, (448, 1008, 3), dtype=np.uint8)
    assert image_grid(448, 1008) == (448, 1008)
    theirs = Qwen2VLImageProcessorPil(do_resize=False)(images=image, return_tensors="np")
    rows, grid = patchify(preprocess_pixels(image.astype(np.float32) / np.float32(255.0)))
    assert rows.shape == (32 * 72, 1176) and grid == (1, 32, 72)
    assert grid == tuple(theirs["image_grid_thw"][0])
    np.testing.assert_allclose(rows, theirs["pixel_values"], atol=1e-6)
    with pytest.raises(ValueError, match="multiple of 28"):
        patchify(np.zeros((42, 56, 3), np.float32))
