"""The MageFlow vision contract with the real Qwen BPE (offline): template token counts, image
slots, ggk 0.9.7's reference-image size for every long side, clip_preprocess and Qwen2-VL patches."""
from __future__ import annotations

import ctypes
import ctypes.util
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.tiny_models import write_qwen_tokenizer
from trainer_core.packs.common.qwen3vl.vision_data import (CLIP_MEAN, CLIP_STD, IMAGE_PAD, SUFFIX_IDS, VISION_END,
                                                    VISION_START, build_sample, check_templates, clip_preprocess,
                                                    image_tokens, patchify, preprocess, sample_string, target_size)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = write_qwen_tokenizer(tmp_path_factory.mktemp("qwen"))
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------- templates

def test_the_template_token_counts_are_the_engines(tokenizer):
    from trainer_core.packs.common.qwen3vl.vision_data import EDIT_PREFIX, SUFFIX, T2I_PREFIX, header
    assert len(encode(tokenizer, EDIT_PREFIX)) == 64 and len(encode(tokenizer, T2I_PREFIX)) == 34
    assert [len(encode(tokenizer, header(i))) for i in range(3)] == [6, 6, 6]
    assert encode(tokenizer, SUFFIX) == list(SUFFIX_IDS) == [151645, 198, 151644, 77091, 198]
    check_templates(tokenizer, "student")
    empty = build_sample(tokenizer, "")
    assert len(empty.ids) == 39 and empty.slots == [] and empty.sup_start == 34
    assert empty.ids[-5:] == list(SUFFIX_IDS)


@pytest.mark.parametrize("counts", [[144], [108, 144], [1, 2]])
def test_image_slots_start_at_70_and_follow_each_block(tokenizer, counts):
    sample = build_sample(tokenizer, "make it night", counts)
    want, start = [], 70
    for n in counts:
        want.append((start, n))
        start += 1 + n + 6                                  # <|vision_end|> + the next "Image N: <|vision_start|>"
    assert sample.slots == want and sample.sup_start == 64
    for start, n in sample.slots:
        assert sample.ids[start - 1] == VISION_START and sample.ids[start + n] == VISION_END
        assert sample.ids[start:start + n] == [IMAGE_PAD] * n
    assert sum(t == IMAGE_PAD for t in sample.ids) == sum(counts)
    text = encode(tokenizer, "make it night")
    assert sample.ids[-5 - len(text):] == text + list(SUFFIX_IDS)


def test_a_tokenizer_without_the_chat_markers_is_refused_with_the_numbers(tokenizer, tmp_path):
    data = json.loads(tokenizer.to_str())
    data["added_tokens"] = []                               # <|im_start|> etc. become plain BPE pieces
    broken = Tokenizer.from_str(json.dumps(data))
    with pytest.raises(ModelFileError, match=r"teacher tokenizer .*edit prefix \d+ tokens \(the engine's: 64\)"):
        check_templates(broken, "teacher")


def test_the_sample_string_has_no_separator_between_image_blocks():
    s = sample_string("x", [1, 1])
    assert "<|vision_end|>Image 2: <|vision_start|>" in s and s.endswith("x<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------- reference-image size

_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
for _name in ("round", "floor"):
    getattr(_LIBM, _name).restype = ctypes.c_double
    getattr(_LIBM, _name).argtypes = [ctypes.c_double]


def engine_size(w: int, h: int) -> tuple[int, int]:
    """ggk 0.9.7's arithmetic with the C library's round (half away from zero) and floor on doubles."""
    wb = max(32, int(_LIBM.round(w / 32.0)) * 32)
    hb = max(32, int(_LIBM.round(h / 32.0)) * 32)
    if max(w, h) > 384:
        beta = 384.0 / max(w, h)
        wb = max(32, int(_LIBM.floor(w * beta / 32.0)) * 32)
        hb = max(32, int(_LIBM.floor(h * beta / 32.0)) * 32)
    return wb, hb


def test_the_target_size_is_the_engines_for_every_long_side():
    ratios = (1.0, 0.75, 0.5625, 0.5, 0.3333, 0.1, 0.01)
    for side in range(1, 2049):
        for r in ratios:
            short = max(1, int(side * r))
            for w, h in ((side, short), (short, side)):
                assert target_size(w, h) == engine_size(w, h), (w, h)
                wb, hb = engine_size(w, h)
                assert image_tokens(w, h) == (wb // 32) * (hb // 32)


@pytest.mark.parametrize("size, want", [((500, 375), (384, 288)), ((640, 480), (384, 288)), ((384, 384), (384, 384)),
                                        ((535, 535), (352, 352)), ((80, 80), (96, 96)), ((1024, 1024), (384, 384)),
                                        ((10, 3000), (32, 384))])
def test_the_contract_examples(size, want):
    assert target_size(*size) == want
    if size == (500, 375):
        assert image_tokens(*size) == 108
    if size == (384, 384):
        assert image_tokens(*size) == 144


# ---------------------------------------------------------------- preprocessing and patches

def test_clip_preprocess_is_a_nearest_resize_with_an_integer_index_then_clip_normalisation():
    rng = np.random.default_rng(0)
    image = rng.random((5, 7, 3), dtype=np.float32)
    out = clip_preprocess(image, 14, 10)                    # scale 2 exactly: every pixel doubled
    want = np.empty((10, 14, 3), np.float32)
    for y in range(10):
        for x in range(14):
            want[y, x] = (image[(y * 5) // 10, (x * 7) // 14] - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
    cropped = clip_preprocess(image, 7, 3)                   # scale max(1, 0.6) = 1: centre crop of 5 rows to 3
    np.testing.assert_allclose(cropped, (image[1:4] - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD), atol=1e-6)


def test_preprocess_reads_a_file_to_the_engines_size(tmp_path):
    from PIL import Image
    path = tmp_path / "a.png"
    Image.new("RGBA", (500, 375), (255, 0, 0, 0)).save(path)      # a transparent red: alpha is dropped
    out = preprocess(path)
    assert out.shape == (288, 384, 3)
    np.testing.assert_allclose(out[0, 0], (np.float32([1, 0, 0]) - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD),
                               atol=1e-6)


def test_patches_are_qwen2_vls():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    image = np.random.default_rng(1).standard_normal((64, 96, 3)).astype(np.float32)
    processor = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2)
    want = processor(images=[image], do_resize=False, do_rescale=False, do_normalize=False, do_convert_rgb=False,
                     return_tensors="np", input_data_format="channels_last")
    rows, grid = patchify(image)
    assert grid == (1, 4, 6) and want["image_grid_thw"].tolist() == [[1, 4, 6]]
    np.testing.assert_array_equal(rows, want["pixel_values"])
    with pytest.raises(ValueError, match="multiple of 32"):
        patchify(image[:48])
