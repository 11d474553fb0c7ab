"""The Qwen3.5 bridge's teacher side (packs-contract-more §D.2 2-3, Part E 2): the engine's reference
resize, the MOSS template ids and image runs, the teacher against transformers' own Qwen3_5Model on a
tiny random snapshot, the patch layout against transformers' image processor, the mock, and the
vocabulary arrays the adapter GGUF carries."""
from __future__ import annotations

import io
import json
import math
import shutil
from typing import Callable

import numpy as np
import pytest
import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.qwen35_bridge.teacher import MockQwen35Teacher, Qwen35Teacher, tokenizer_arrays
from trainer_core.packs.qwen35_bridge.template import (IMAGE_PAD, SPECIAL_TOKENS, build_prompt_ids, check_template,
                                                       load_reference, merged_tokens, patchify, prompt_string,
                                                       smart_resize)
from trainer_core.packs.qwen35_bridge.tiny import write_tiny_qwen35

SUFFIX_TAIL = [248068, 198]


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_tiny_qwen35(tmp_path_factory.mktemp("qwen35") / "Qwen3.5-9B")


@pytest.fixture(scope="module")
def teacher(snapshot):
    return Qwen35Teacher(snapshot, device="cpu", mode="auto")


@pytest.fixture(scope="module")
def plain(snapshot):
    """transformers' own Qwen3_5Model from the same snapshot, float32."""
    from transformers import Qwen3_5Model
    return Qwen3_5Model.from_pretrained(snapshot, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def images():
    """References as the engine renders them: [64, 96, 3], [96, 64, 3] and [32, 160, 3] in −1…1 (6, 6, 5 tokens)."""
    rng = np.random.default_rng(3)
    return [rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((64, 96, 3), (96, 64, 3), (32, 160, 3))]


def png_bytes(array: np.ndarray) -> bytes:
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


# ---------------------------------------------------------------- smart_resize

@pytest.mark.parametrize("w, h, want_w, want_h, tokens", [
    (500, 375, 512, 384, 192), (512, 512, 512, 512, 256), (768, 768, 768, 768, 576),
    (1024, 1024, 1024, 1024, 1024), (1920, 1080, 1344, 768, 1008)])
def test_smart_resize_gives_the_contract_examples(w, h, want_w, want_h, tokens):
    assert smart_resize(h, w) == (want_h, want_w)
    assert merged_tokens(*smart_resize(h, w)) == tokens


def independent_resize(h: int, w: int, rounding: Callable[[float], int] | None = None) -> tuple[int, int]:
    """§D.2 2 written out again: sides to multiples of 32 by `rounding` of side/32 (None: llround, i.e.
    floor(side/32 + ½), computed on integers), β scaling when outside [65536, 1024²]."""
    def to32(side: int) -> int:
        k = (side + 16) // 32 if rounding is None else rounding(side / 32)
        return max(32, int(k) * 32)
    hb, wb = to32(h), to32(w)
    if hb * wb > 1024 * 1024:
        beta = math.sqrt(h * w / (1024 * 1024))
        hb, wb = max(32, math.floor(h / beta / 32) * 32), max(32, math.floor(w / beta / 32) * 32)
    elif hb * wb < 65536:
        beta = math.sqrt(65536 / (h * w))
        hb, wb = math.ceil(h * beta / 32) * 32, math.ceil(w * beta / 32) * 32
    return hb, wb


SIZES = [(375, 500), (1080, 1920), (80, 1200), (1200, 80), (144, 2000), (333, 777), (720, 1280), (1, 1),
         (32, 32), (48, 48), (80, 80), (200, 150), (600, 800), (1000, 1000), (1024, 1536), (3000, 4000), (2048, 64),
         (336, 336), (400, 1000), (1300, 1300), (99, 4567), (700, 525), (112, 1904), (2000, 2000), (1111, 999)]


def test_smart_resize_equals_an_independent_reading_of_the_rule_and_rounds_halves_away_from_zero():
    for h, w in SIZES:
        assert smart_resize(h, w) == independent_resize(h, w, rounding=None), (h, w)
    # 80 px is 2.5 × 32: llround gives 96 where Python's round (half to even) gives 64
    assert smart_resize(80, 1200) == (96, 1216)
    assert independent_resize(80, 1200, rounding=round) == (64, 1216)
    differ = [s for s in SIZES if smart_resize(*s) != independent_resize(*s, rounding=round)]
    assert (80, 1200) in differ and (1200, 80) in differ
    assert smart_resize(80, 80) == (256, 256)                      # below min_pixels: scaled up, ceiled


# ---------------------------------------------------------------- references

def test_load_reference_resizes_as_floats_and_drops_alpha_as_the_engines_pipeline_does():
    """FLUX.3 and MOSS, the versions that load the bridge, take 3 image channels (gk-diffuser.cpp:3731-3733): the
    pipeline slices a reference's alpha off before the conditioner (ensure_image_tensor_channels, :5892-5893,
    :5984-5987), so the colours under a transparent pixel reach the tower as they are, not white."""
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (375, 500, 4), dtype=np.uint8)
    rgba[:, :250, 3] = 0                                              # left half fully transparent
    got = load_reference(png_bytes(rgba))
    assert got.shape == (384, 512, 3) and got.dtype == np.float32
    x = torch.from_numpy(rgba[..., :3].astype(np.float32) / 255).permute(2, 0, 1)[None]
    x = torch.nn.functional.interpolate(x, size=(384, 512), mode="bilinear", antialias=True, align_corners=False)[0]
    np.testing.assert_allclose(got, (x * 2 - 1).permute(1, 2, 0).numpy(), atol=1e-6)
    np.testing.assert_allclose(got, load_reference(png_bytes(np.ascontiguousarray(rgba[..., :3]))), atol=0)
    assert got[:, :200].std() > 0.3                                   # transparent: the noise under it, not white
    assert got.min() >= -1.0 and got.max() <= 1.0


def test_load_reference_rescales_to_the_drawn_area_first(tmp_path):
    path = tmp_path / "ref.png"
    path.write_bytes(png_bytes(np.full((375, 500, 3), 128, dtype=np.uint8)))
    assert load_reference(path).shape == (384, 512, 3)
    assert load_reference(path, area=500 * 375 + 1000).shape == (384, 512, 3)      # within 2 %: the file's own
    assert load_reference(path, area=262144).shape == (448, 576, 3)                 # 591 × 443 → 576 × 448
    np.testing.assert_allclose(load_reference(path), 128 / 255 * 2 - 1, atol=1e-6)


def test_patchify_has_the_layout_of_transformers_image_processor(images):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    processor = Qwen2VLImageProcessorPil(do_resize=False, do_rescale=False, do_normalize=False, do_convert_rgb=False,
                                         patch_size=16, merge_size=2, temporal_patch_size=2)
    for image in images:
        rows, grid = patchify(image)
        hf = processor(images=[image], return_tensors="np")
        assert rows.shape == (grid[1] * grid[2], 1536) and grid == (1, image.shape[0] // 16, image.shape[1] // 16)
        np.testing.assert_array_equal(rows, hf["pixel_values"])
        assert hf["image_grid_thw"].tolist() == [list(grid)]


# ---------------------------------------------------------------- template

def test_the_template_ids_and_image_runs(teacher):
    encode = teacher.encode
    check_template(encode, "teacher")
    user, assistant = encode("user")[0], encode("assistant")[0]
    suffix = [248046, 198, 248045, assistant, 198, 248068, 198]
    ids, runs = build_prompt_ids(encode, "", [])
    assert ids == [248045, user, 198, *encode(" "), *suffix] and runs == []
    assert prompt_string("") == "<|im_start|>user\n <|im_end|>\n<|im_start|>assistant\n<think>\n"
    ids, runs = build_prompt_ids(encode, "a red fox", [6])                       # one 2 × 3 reference
    assert ids[:4] == [248045, user, 198, 248053] and runs == [(4, 6)] and ids[-2:] == SUFFIX_TAIL
    assert ids[4:10] == [IMAGE_PAD] * 6 and ids[10] == 248054
    assert ids == encode(prompt_string("a red fox", [(2, 3)])) == encode(prompt_string("a red fox", [np.int64(6)]))
    ids, runs = build_prompt_ids(encode, "the sea at night", [6, 5])
    assert runs == [(4, 6), (12, 5)] and ids[11] == 248053 and ids[17] == 248054 and ids[-7:] == suffix


def test_tokenizers_that_break_the_template_are_refused(teacher):
    with pytest.raises(ModelFileError, match="student tokenizer"):
        check_template(lambda s: [1, 2, 3], "student")
    no_end = lambda s: teacher.encode(s.replace("<|vision_end|>", ""))  # noqa: E731
    with pytest.raises(ModelFileError, match="image slots"):
        build_prompt_ids(no_end, "a cat", [6])
    with pytest.raises(ModelFileError, match=r"found runs \[12\]"):
        build_prompt_ids(lambda s: teacher.encode(s.replace("<|vision_end|><|vision_start|>", "")), "x", [6, 6])


# ---------------------------------------------------------------- the teacher against transformers

def plain_rows(plain, ids: list[int], refs: list[np.ndarray]) -> torch.Tensor:
    """Hugging Face's own forward of one unpadded sample, its patches from HF's image processor."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    x = torch.tensor([ids])
    kwargs = {}
    if refs:
        processor = Qwen2VLImageProcessorPil(do_resize=False, do_rescale=False, do_normalize=False,
                                             do_convert_rgb=False, patch_size=16, merge_size=2, temporal_patch_size=2)
        hf = processor(images=refs, return_tensors="pt")
        kwargs = {"pixel_values": hf["pixel_values"], "image_grid_thw": hf["image_grid_thw"]}
    plain.rope_deltas = None
    with torch.no_grad():
        return plain(input_ids=x, mm_token_type_ids=(x == IMAGE_PAD).int(), **kwargs).last_hidden_state[0]


def test_the_teacher_describes_itself(teacher):
    assert (teacher.out_dim, teacher.vis_dim, teacher.mode) == (64, 64, "cpu")
    assert teacher.embed_table().shape == (248320, 64)
    assert len(teacher.tokenizer.encode("user").ids) == 1


def test_rows_are_transformers_last_hidden_state_with_and_without_an_image(teacher, plain, images):
    for text, refs in (("a red fox in the snow", []), ("make it night", images[:1]), ("", images[1:])):
        ids, _ = build_prompt_ids(teacher.encode, text, [merged_tokens(*im.shape[:2]) for im in refs])
        got = teacher.hidden([(ids, refs)])[0]
        assert got.shape == (len(ids), 64) and got.dtype == torch.float32
        torch.testing.assert_close(got, plain_rows(plain, ids, refs), atol=1e-5, rtol=0)


def test_batched_rows_equal_unpadded_single_sample_runs(teacher, images):
    """Tolerance: 1e-5 absolute in float32 on the CPU."""
    samples = []
    for text, refs in (("make it night", images[:1]), ("a cat", []),
                       ("put the ball from the first image into the second one, at dusk", images[1:]),
                       ("", [])):
        ids, _ = build_prompt_ids(teacher.encode, text, [merged_tokens(*im.shape[:2]) for im in refs])
        samples.append((ids, refs))
    assert len({len(ids) for ids, _ in samples}) == 4
    batched = teacher.hidden(samples)
    for sample, got in zip(samples, batched):
        assert got.shape == (len(sample[0]), 64)
        torch.testing.assert_close(got, teacher.hidden([sample])[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="image pads"):
        teacher.hidden([(samples[0][0], [])])


def test_vision_rows_are_get_image_features_pooler_output(teacher, plain, images):
    rows = teacher.encode_images(images, budget=12)                   # 6 + 6 | 5: two tower batches
    assert [tuple(r.shape) for r in rows] == [(6, 64), (6, 64), (5, 64)] and rows[0].dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(rows, teacher.encode_images(images, budget=0)))
    for image, got in zip(images, rows):
        pixels, grid = patchify(image)
        with torch.no_grad():
            want = plain.get_image_features(torch.from_numpy(pixels), image_grid_thw=torch.tensor([grid]))
        assert isinstance(want.pooler_output, tuple)
        torch.testing.assert_close(got, want.pooler_output[0].bfloat16())


def test_offload_streams_the_decoder_layers_and_gives_the_same_rows(snapshot, teacher, images, monkeypatch):
    """The offload placement's code path, run on the CPU (the execution device is the teacher's device)."""
    import trainer_core.packs.qwen35_bridge.teacher as module
    monkeypatch.setattr(module, "resolve_mode", lambda *args: "offload")
    streamed = Qwen35Teacher(snapshot)
    assert streamed.mode == "offload" and all(hasattr(layer, "_hf_hook") for layer in streamed.model.language_model.layers)
    ids, _ = build_prompt_ids(teacher.encode, "make it night", [6])
    torch.testing.assert_close(streamed.hidden([(ids, images[:1])])[0], teacher.hidden([(ids, images[:1])])[0],
                               atol=1e-6, rtol=0)


def test_snapshots_the_engine_cannot_use_are_refused(snapshot, tmp_path):
    config = json.loads((snapshot / "config.json").read_text())
    for key, value, match in (("deepstack_visual_indexes", [0, 1], "deepstack"), ("patch_size", 14, "patch 14")):
        folder = tmp_path / key
        folder.mkdir()
        changed = json.loads(json.dumps(config))
        changed["vision_config"][key] = value
        (folder / "config.json").write_text(json.dumps(changed))
        with pytest.raises(ModelFileError, match=match):
            Qwen35Teacher(folder)
    with pytest.raises(ModelFileError, match="config"):
        Qwen35Teacher(tmp_path / "nothing")
    broken = tmp_path / "no_weights"
    shutil.copytree(snapshot, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(ModelFileError, match="download Qwen/Qwen3.5-9B"):
        Qwen35Teacher(broken)


# ---------------------------------------------------------------- the mock

def test_the_mock_is_deterministic_has_the_shapes_and_mixes_images_into_their_runs(images):
    mock, again = MockQwen35Teacher(out_dim=96, vis_dim=48), MockQwen35Teacher(out_dim=96, vis_dim=48)
    check_template(mock.encode, "teacher")
    ids, runs = build_prompt_ids(mock.encode, "", [])
    assert ids == [248045, 846, 198, 220, 248046, 198, 248045, 74455, 198, 248068, 198] and runs == []
    ids, runs = build_prompt_ids(mock.encode, "a red fox", [6])
    assert runs == [(4, 6)] and ids[-2:] == SUFFIX_TAIL
    assert all(1000 <= t < 241000 for t in ids[11:14])
    vis = mock.encode_images(images)
    assert [tuple(v.shape) for v in vis] == [(6, 48), (6, 48), (5, 48)] and vis[0].dtype == torch.bfloat16
    rows = mock.hidden([(ids, images[:1])])[0]
    assert rows.shape == (len(ids), 96)
    assert torch.equal(rows, again.hidden([(ids, images[:1])])[0])
    x = torch.nn.functional.one_hot(torch.tensor(ids) % 64, 64).float()
    x[:, 0] += torch.arange(len(ids)) / 100
    text_only = (x @ mock.tok_basis).bfloat16().float()
    pads = slice(4, 10)
    assert torch.equal(rows[:4], text_only[:4]) and torch.equal(rows[10:], text_only[10:])
    assert not torch.allclose(rows[pads], text_only[pads], atol=1e-2)
    assert mock.embed_table() is None and mock.mode == "mock"


def test_the_mock_reads_a_tokenizer_json_when_there_is_one(snapshot, teacher):
    mock = MockQwen35Teacher(64, 64, snapshot / "tokenizer.json")
    assert mock.encode(prompt_string("a cat", [6])) == teacher.encode(prompt_string("a cat", [6]))
    with pytest.raises(ModelFileError, match="tokenizer"):
        MockQwen35Teacher(64, 64, snapshot / "missing.json")


# ---------------------------------------------------------------- the vocabulary in the GGUF

def test_tokenizer_arrays_of_the_tiny_snapshot(snapshot):
    tokens, merges = tokenizer_arrays(snapshot / "tokenizer.json")
    assert len(tokens) == 248320
    assert tokens[198] == "Ċ" and tokens[220] == "Ġ"
    assert tokens[248044:248077] == list(SPECIAL_TOKENS)
    assert tokens[248077] == "[PAD248077]" and tokens[-1] == "[PAD248319]"
    assert merges and all(len(m.split(" ")) == 2 for m in merges)


@pytest.mark.parametrize("pairs", [True, False])
def test_tokenizer_arrays_fill_pads_append_audio_tokens_and_read_both_merge_formats(tmp_path, pairs):
    path = tmp_path / "tokenizer.json"
    merges = [["a", "b"], ["ab", "c"]] if pairs else ["a b", "ab c"]
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4},
                                          "merges": merges},
                                "added_tokens": [{"id": 6, "content": "<|endoftext|>"},
                                                 {"id": 7, "content": "<|audio_end|>"}]}))
    tokens, got = tokenizer_arrays(path, vocab_rows=20)
    assert got == ["a b", "ab c"]
    assert tokens[:8] == ["a", "b", "c", "ab", "abc", "[PAD5]", "<|endoftext|>", "<|audio_end|>"]
    assert tokens[8:14] == ["<|audio_start|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                            "<tts_text_bos_single>", "<|audio_pad|>"]
    assert tokens[14:] == [f"[PAD{i}]" for i in range(14, 20)]
    assert len(tokenizer_arrays(path, vocab_rows=4)[0]) == 14                # never fewer than the ids in use


def test_a_missing_or_broken_tokenizer_json_says_to_download_again(tmp_path):
    with pytest.raises(ModelFileError, match=r"tokenizer\.json.*download the teacher"):
        tokenizer_arrays(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFileError, match=r"tokenizer\.json.*download the teacher"):
        tokenizer_arrays(tmp_path / "tokenizer.json")
