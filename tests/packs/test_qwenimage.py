"""Qwen-Image 2.1: the contract with the real Qwen BPE, reference areas and sizes, the full teacher
against Hugging Face's own Qwen3VLModel (deepstack, M-RoPE, pre-norm tap) on a tiny random model,
consumed-row supervision, and the demo end to end."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

import demo_cache
from trainer_core.contract.gguf_io import read_gguf_kvs
from trainer_core.inspect_file import describe_gguf
from trainer_core.packs.common.qwen3vl.teacher import Qwen3VLFullTeacher, VisionOut, mrope_positions
from trainer_core.project import Project
from trainer_core.packs.common.qwen3vl.qwenimage_data import (SYSTEM, build_sample, check_templates, choose_area, preprocess,
                                         target_size)
from trainer_core.contract.shards import Shard, shard_files
from trainer_core.contract.stream import val_batches
from trainer_core.packs.common.tiny_models import write_qwen_tokenizer
from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
from trainer_core.packs.common.qwen3vl.vision_data import IMAGE_PAD, SUFFIX_IDS, patchify

AREAS = [[147456, 0.35], [262144, 0.35], [589824, 0.20], [1048576, 0.10]]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.from_file(str(write_qwen_tokenizer(tmp_path_factory.mktemp("qwen")) / "tokenizer.json"))


# ---------------------------------------------------------------- template

def test_the_template_with_the_real_bpe(tokenizer):
    assert len(tokenizer.encode(SYSTEM, add_special_tokens=False).ids) == 14
    check_templates(tokenizer, "student")
    empty = build_sample(tokenizer, "")
    assert len(empty.ids) == 23 and empty.sup_start == 14 and empty.ids[-5:] == list(SUFFIX_IDS)
    assert len(empty.ids) - 14 - 3 - 5 == 1 and tokenizer.decode([empty.ids[17]]) == " "   # "" becomes " "
    one = build_sample(tokenizer, "make it night", [144])
    assert one.slots == [(22, 144)] and one.ids[17:21] == [27, 1805, 16, 29]               # "<image1>"
    two = build_sample(tokenizer, "blend them", [144, 256])
    assert two.slots == [(22, 144), (22 + 144 + 6, 256)]
    second = 22 + 144 + 1                                                                 # after <|vision_end|>
    assert two.ids[second:second + 4] == [366, 1805, 17, 29]                              # " <image2>": the space merged
    assert sum(t == IMAGE_PAD for t in two.ids) == 400


# ---------------------------------------------------------------- references

@pytest.mark.parametrize("size, area, want", [((384, 384), 147456, (384, 384)), ((640, 480), 147456, (448, 320)),
                                              ((1024, 1024), 1048576, (1024, 1024)), ((500, 375), 262144, (576, 448)),
                                              ((100, 1000), 147456, (128, 1216)), ((7, 7), 1024, (32, 32))])
def test_the_render_size_table(size, area, want):
    w, h = size
    vw = (float((area * w) // h)) ** 0.5                        # written out: floor-divide first, then √ in double
    expected = (max(32, round(vw / 32) * 32), max(32, round(vw * h / w / 32) * 32))
    assert target_size(w, h, area) == expected == want


def test_the_area_is_a_deterministic_draw_per_sample_and_two_images_are_capped():
    keys = [([f"images/x{i}.png"], f"make it night {i}") for i in range(400)]
    drawn = [choose_area(paths, text, AREAS, 262144) for paths, text in keys]
    assert drawn == [choose_area(paths, text, AREAS, 262144) for paths, text in keys]          # deterministic
    for (paths, text), area in list(zip(keys, drawn))[:20]:                                     # the rule, by hand
        u = int.from_bytes(hashlib.sha1("|".join([*paths, text]).encode()).digest()[:8], "big") / 2**64
        want = 147456 if u < 0.35 else 262144 if u < 0.70 else 589824 if u < 0.90 else 1048576
        assert area == want
    share = {a: drawn.count(a) / len(drawn) for a, _ in AREAS}
    assert abs(share[147456] - 0.35) < 0.08 and abs(share[1048576] - 0.10) < 0.06            # roughly the weights
    pairs = [choose_area([f"a{i}.png", f"b{i}.png"], "blend", AREAS, 262144) for i in range(200)]
    assert set(pairs) == {147456, 262144}                                                      # capped at 512²
    assert choose_area(["a.png", "b.png"], "x", AREAS, 1000) == 147456                         # none fits: the smallest


def test_references_are_composited_over_white_resized_without_crop_and_mapped_to_minus_one_one(tmp_path):
    from PIL import Image
    rgba = np.zeros((30, 40, 4), dtype=np.uint8)
    rgba[:, :20] = (255, 0, 0, 255)                              # opaque red left half, transparent right half
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = preprocess(tmp_path / "a.png", 4096)                   # 40×30 rendered at 64²: 64×64
    w_bar, h_bar = target_size(40, 30, 4096)
    assert out.shape == (h_bar, w_bar, 3)
    np.testing.assert_allclose(out[0, 0], [1, -1, -1])           # red → (1, 0, 0) → 2x − 1
    np.testing.assert_allclose(out[0, -1], [1, 1, 1])            # transparent → white
    cols = (np.arange(w_bar) * 40) // w_bar                      # nearest, no crop: the left half stays red
    assert ((out[0, :, 1] == -1) == (cols < 20)).all()


# ---------------------------------------------------------------- the full teacher

@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return Qwen3VLFullTeacher(write_tiny_qwen3vl(tmp_path_factory.mktemp("vl8b") / "Qwen3-VL-8B-Instruct"))


@pytest.fixture(scope="module")
def batch(teacher):
    """A padded batch: one image (6×8 merged), text only, two images (4×4 and 2×6)."""
    rng = np.random.default_rng(5)
    images = [rng.uniform(-1, 1, (h, w, 3)).astype(np.float32) for h, w in ((192, 256), (128, 128), (64, 192))]
    encoded = teacher.encode_images(images, budget=1024)
    samples = [build_sample(teacher.tokenizer, "make it night", [48]), build_sample(teacher.tokenizer, "a red fox"),
               build_sample(teacher.tokenizer, "put Image 1 into Image 2", [16, 12])]
    vision = [[(samples[0].slots[0][0], encoded[0])], [],
              [(s, v) for (s, _), v in zip(samples[2].slots, encoded[1:])]]
    return images, encoded, samples, vision


def hf_forward(teacher, images, samples):
    """Hugging Face's Qwen3VLModel on the same padded batch, tapped at the input of the final norm."""
    length = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), length), 151643)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    for b, s in enumerate(samples):
        ids[b, :len(s.ids)] = torch.tensor(s.ids)
        mask[b, :len(s.ids)] = 1
    pixels, grids = zip(*(patchify(im) for im in images))
    captured = []
    hook = teacher.model.language_model.norm.register_forward_hook(lambda m, a, o: captured.append(a[0]))
    try:
        with torch.no_grad():
            teacher.model.rope_deltas = None
            teacher.model(input_ids=ids, attention_mask=mask, pixel_values=torch.from_numpy(np.concatenate(pixels)),
                          image_grid_thw=torch.tensor(grids), mm_token_type_ids=(ids == IMAGE_PAD).int())
            positions, _ = teacher.model.get_rope_index(ids, mm_token_type_ids=(ids == IMAGE_PAD).int(),
                                                        image_grid_thw=torch.tensor(grids), attention_mask=mask)
    finally:
        hook.remove()
    return captured[-1], positions, mask


def test_the_teacher_equals_hugging_faces_own_forward_pre_norm(teacher, batch):
    """Tolerance: 1e-4 absolute in float32 on the CPU on rows of std ≈ 0.04 (measured: 0.0, bit-identical)."""
    images, encoded, samples, vision = batch
    ours = teacher.hidden([s.ids for s in samples], vision)
    theirs, _, _ = hf_forward(teacher, images, samples)
    assert [r.shape for r in ours] == [(len(s.ids), 64) for s in samples]
    for b, rows in enumerate(ours):
        torch.testing.assert_close(rows, theirs[b, :rows.shape[0]], atol=1e-4, rtol=0)
        assert not torch.allclose(rows, teacher.model.language_model.norm(rows), atol=1e-2)   # not the normed states


def test_our_mrope_positions_are_get_rope_index(teacher, batch):
    images, encoded, samples, vision = batch
    _, positions, mask = hf_forward(teacher, images, samples)
    length = mask.shape[1]
    for b, (s, v) in enumerate(zip(samples, vision)):
        ours = mrope_positions(length, len(s.ids), [(start, out.grid) for start, out in v])
        assert torch.equal(ours[:, :len(s.ids)], positions[:, b, :len(s.ids)])
    assert [v.grid for v in encoded] == [(6, 8), (4, 4), (2, 6)]


def test_turning_deepstack_off_changes_the_text_rows_after_the_image(teacher, batch):
    images, encoded, samples, vision = batch
    off = [[(s, VisionOut(v.rows, [], v.grid)) for s, v in sample] for sample in vision]
    with_deepstack = teacher.hidden([s.ids for s in samples], vision)
    without = teacher.hidden([s.ids for s in samples], off)
    first = samples[0].slots[0][0]
    torch.testing.assert_close(with_deepstack[0][:first], without[0][:first])      # before the image: the same
    assert not torch.allclose(with_deepstack[0][first + 48:], without[0][first + 48:], atol=1e-3)
    torch.testing.assert_close(with_deepstack[1], without[1])                        # a text-only sample: the same


# ---------------------------------------------------------------- the demo

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return Project.open(demo_cache.copy_trained("qwen3vl_qwenimage", tmp_path_factory.mktemp("qwenimage")))


def test_supervision_and_statistics_cover_exactly_the_consumed_rows(demo):
    (path,) = shard_files(demo, "val")
    shard = Shard(path)
    lens = shard["len"].tolist()
    slots = [0] * len(lens)
    for s, n in zip(shard["vis_sample"].tolist(), shard["vis_len"].tolist()):
        slots[s] += n
    consumed = sum(n - 14 - v for n, v in zip(lens, slots))
    assert int(shard["stat_n"][0]) == consumed
    assert shard["t_pack"].shape[0] == sum(lens) - sum(slots) and shard["t_len"].tolist() == [
        n - v for n, v in zip(lens, slots)]
    assert int(shard["t_sparse"][0]) == 1 and set(shard["sup_start"].tolist()) == {14}
    stored = shard["t_pack"].double()
    starts = np.cumsum([0] + shard["t_len"].tolist()[:-1])
    sup = torch.cat([stored[int(a) + 14:int(a) + t] for a, t in zip(starts, shard["t_len"].tolist())])
    torch.testing.assert_close(shard["stat_s"], sup.sum(0))     # the stored system-turn rows are not in the stats
    batch = next(val_batches([path], 24))
    assert int(batch.tmask.sum()) == consumed
    assert not (batch.tmask & batch.vision).any() and not batch.tmask[:, :14].any()
    assert (batch.target[batch.vision] == 0).all()              # no teacher rows under the slots
    for b, (a, t) in enumerate(zip(starts, shard["t_len"].tolist())):   # the stored rows, scattered back in order
        off_slot = batch.mask[b] & ~batch.vision[b]
        torch.testing.assert_close(batch.target[b][off_slot], stored[int(a):int(a) + t].float())


def test_the_demo_exports_an_engine_valid_gguf_with_the_packs_kvs_and_eval(demo):
    gguf = demo.gguf_path()
    info = describe_gguf(gguf)
    assert info["variant"] == "token_aligned_vision" and not [p for p in info["problems"] if p["fatal"]]
    kvs = read_gguf_kvs(gguf)
    assert kvs["adapter.teacher_tap"] == "pre_norm_last_layer" and kvs["adapter.teacher_deepstack"] is True
    assert kvs["adapter.vision_contract"] == "qwen_image_2_1" and kvs["adapter.supervised_rows"] == "consumed_text"
    ev = json.loads(demo.eval_json.read_text())
    for key in ("cos_slice", "cos_edit", "cos_t2i", "cos", "rel_mse", "worst_sample_cos_slice", "roundtrip_cos"):
        assert key in ev, key
    assert "cos_vis" not in ev and ev["cos_txt"] == pytest.approx(ev["cos"])
    assert ev["roundtrip_cos"] >= 0.999 and ev["val_samples"] == 24
    val = json.loads((demo.checkpoints_dir / "best.json").read_text())["val"]
    assert "val_cos_edit" in val and "val_cos_t2i" in val
