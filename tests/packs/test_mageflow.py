"""MageFlow-Edit: the Qwen3-VL teacher on a tiny random Qwen3-VL (real architecture and special ids),
the token-aligned shards and stream, and the demo end to end to an engine-valid GGUF."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import demo_cache
from conftest import cli
from trainer_core.base.events import ListReport
from trainer_core.contract.gguf_io import read_gguf_tensors
from trainer_core.inspect_file import describe_gguf
from trainer_core.packs.common.qwen3vl.teacher import (MockVisionTeacher, Qwen3VLTeacher, auto_budgets, image_batches,
                                                resolve_mode)
from trainer_core.project import Project
from trainer_core.contract.shards import Shard, shard_files
from trainer_core.contract.stream import val_batches
from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
from trainer_core.packs.common.qwen3vl.vision_data import IMAGE_PAD, build_sample, patchify, preprocess


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_tiny_qwen3vl(tmp_path_factory.mktemp("qwen3vl") / "Qwen3-VL-4B-Instruct")


@pytest.fixture(scope="module")
def teacher(snapshot):
    return Qwen3VLTeacher(snapshot)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(3)
    out = []
    for i, size in enumerate([(500, 375), (96, 64), (130, 200)]):
        path = folder / f"{i}.png"
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        out.append(preprocess(path))
    return out


# ---------------------------------------------------------------- teacher

def test_the_vision_rows_are_the_mergers_main_output(teacher, images):
    rows = teacher.encode_images(images, budget=200)             # 108 + 6 + 24 tokens: two tower batches
    assert [r.shape for r in rows] == [(108, 64), (6, 64), (24, 64)] and rows[0].dtype == torch.bfloat16
    for image, got in zip(images, rows):
        pixels, grid = patchify(image)
        with torch.no_grad():
            out = teacher.model.visual(hidden_states=torch.from_numpy(pixels), grid_thw=torch.tensor([grid]))
        torch.testing.assert_close(got, out.pooler_output.bfloat16())
        assert all(d.shape == got.shape and not torch.allclose(d.bfloat16(), got, atol=1e-2)
                   for d in out.deepstack_features)                 # the deepstack rows are not used


def spliced(teacher, text, images, rows):
    sample = build_sample(teacher.tokenizer, text, [r.shape[0] for r in rows])
    return sample, [(start, r) for (start, _), r in zip(sample.slots, rows)]


def test_batched_rows_equal_unpadded_single_sample_runs(teacher, images):
    """Tolerance: 1e-5 absolute in float32 on the CPU (rows of std ≈ 1)."""
    rows = teacher.encode_images(images, budget=1024)
    samples = [spliced(teacher, "make it night", images[:1], rows[:1]),
               spliced(teacher, "a cat", [], []),
               spliced(teacher, "put the ball from Image 1 into Image 2", images[1:], rows[1:])]
    batched = teacher.hidden([s.ids for s, _ in samples], [v for _, v in samples])
    for (sample, vision), got in zip(samples, batched):
        assert got.shape == (len(sample.ids), 64)
        torch.testing.assert_close(got, teacher.hidden([sample.ids], [vision])[0], atol=1e-5, rtol=0)


def test_rows_are_the_final_norm_states_with_plain_positions_and_without_deepstack(teacher, images):
    """Against transformers' own text stack: without deepstack and with 1-D positions the rows are ours;
    feeding the deepstack features changes the rows from the image on (ggk ignores them)."""
    pixels, grid = patchify(images[1])
    with torch.no_grad():
        out = teacher.model.visual(hidden_states=torch.from_numpy(pixels), grid_thw=torch.tensor([grid]))
    sample, vision = spliced(teacher, "make it night", images[1:2], [out.pooler_output])
    ours = teacher.hidden([sample.ids], [vision])[0]
    ids = torch.tensor([sample.ids])
    with torch.no_grad():
        x = teacher.model.language_model.embed_tokens(ids)
        start, n = sample.slots[0]
        x[0, start:start + n] = out.pooler_output
        positions = torch.arange(len(sample.ids))[None]
        plain = teacher.model.language_model(inputs_embeds=x, position_ids=positions).last_hidden_state[0]
        deep = teacher.model.language_model(inputs_embeds=x, position_ids=positions,
                                            visual_pos_masks=ids == IMAGE_PAD,
                                            deepstack_visual_embeds=list(out.deepstack_features)).last_hidden_state[0]
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(deep[:start], plain[:start])                             # before the image: equal
    assert not torch.allclose(deep[start:], plain[start:], atol=1e-3)                   # from the image on: differs


def test_placement_modes():
    assert resolve_mode("auto", torch.device("cpu"), 0.0, 7.5) == "cpu"
    with pytest.raises(Exception, match="teacher mode 'fast'"):
        resolve_mode("fast", torch.device("cpu"), 0.0, 7.5)
    assert image_batches([108, 6, 24, 144], 120) == [[0, 1], [2], [3]]
    assert image_batches([300], 100) == [[0]]                      # one image always runs, alone
    assert auto_budgets(torch.device("cpu")) == {"teacher_batch": 128, "tok_budget": 12288, "student_batch": 64,
                                                 "student_tok_budget": 24576, "vis_tok_budget": 1024}
    assert auto_budgets(torch.device("cpu"), 0.5)["vis_tok_budget"] == 512


def test_the_mock_has_the_shapes_and_mixes_the_image_into_its_slots(images):
    mock = MockVisionTeacher(out_dim=96, vis_dim=48)
    rows = mock.encode_images(images[:2])
    assert [r.shape for r in rows] == [(108, 48), (6, 48)] and rows[0].dtype == torch.bfloat16
    ids = list(range(100, 300))
    with_image = mock.hidden([ids], [[(70, rows[0])]])[0]
    without = mock.hidden([ids], [[]])[0]
    assert with_image.shape == (200, 96)
    assert torch.equal(with_image[:70], without[:70]) and not torch.equal(with_image[70:178], without[70:178])


# ---------------------------------------------------------------- the demo end to end

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return Project.open(demo_cache.copy_trained("qwen3vl_mageflow", tmp_path_factory.mktemp("mageflow")))


def test_the_shards_hold_every_real_row_and_the_raw_vision_rows(demo):
    (path,) = shard_files(demo, "val")
    shard = Shard(path)
    lens, ids = shard["len"].tolist(), shard["ids"]
    total = sum(lens)
    assert shard["q_pack"].shape == (total, 64) and shard["t_pack"].shape == (total, 64)
    assert int(shard["stat_n"][0]) == total and shard["t_len"].tolist() == lens
    assert lens == sorted(lens) and len(shard) == 24
    starts = np.cumsum([0] + lens[:-1])
    images_per_sample = shard["n_images"].tolist()
    assert shard["sup_start"].tolist() == [64 if n else 34 for n in images_per_sample]
    assert sorted(images_per_sample) == [0] * 12 + [1] * 12         # the val split: 12 image + 12 text samples
    assert shard["v_pack"].shape == (int(shard["vis_len"].sum()), 64)
    for s, start, n in zip(shard["vis_sample"].tolist(), shard["vis_start"].tolist(), shard["vis_len"].tolist()):
        row = int(starts[s]) + start
        assert start == 70 and ids[row - 1] == 151652 and (ids[row:row + n] == IMAGE_PAD).all() and ids[row + n] == 151653
    assert shard.meta["vision_contract"] == "mageflow_edit" and shard.meta["tap"] == "final_norm"
    assert (demo.root / "vision_proj.pt").is_file()


def test_the_stream_gives_dense_raw_vision_rows_at_the_slots(demo):
    (path,) = shard_files(demo, "val")
    shard = Shard(path)
    batch = next(val_batches([path], 24))
    lens = shard["len"].tolist()
    starts = np.cumsum([0] + lens[:-1])
    for b in range(24):
        row_ids = shard["ids"][int(starts[b]):int(starts[b]) + lens[b]]
        assert torch.equal(batch.vision[b, :lens[b]], row_ids == IMAGE_PAD) and not batch.vision[b, lens[b]:].any()
    v_off = 0
    for s, start, n in zip(shard["vis_sample"].tolist(), shard["vis_start"].tolist(), shard["vis_len"].tolist()):
        torch.testing.assert_close(batch.vis[s, start:start + n], shard["v_pack"][v_off:v_off + n].float())
        v_off += n
    assert (batch.vis[~batch.vision] == 0).all()
    assert batch.sup_start.tolist() == shard["sup_start"].tolist()


def test_the_demo_exports_an_engine_valid_token_aligned_gguf_with_cos_slice(demo, tmp_path):
    gguf = demo.gguf_path()
    info = describe_gguf(gguf)
    assert info["kind"] == "adapter" and info["variant"] == "token_aligned_vision"
    assert not [p for p in info["problems"] if p["fatal"]]
    tensors = read_gguf_tensors(gguf)
    assert tensors["adapter.vision_proj.weight"].dtype == "F32" and tensors["adapter.vis_in.weight"].dtype == "F16"
    assert "adapter.skip.weight" in tensors and "adapter.query" not in tensors and "adapter.query.weight" not in tensors
    saved = torch.load(demo.root / "vision_proj.pt", weights_only=True)
    np.testing.assert_array_equal(tensors["adapter.vision_proj.weight"].to_torch().numpy(), saved["weight"].numpy())
    assert info["kvs"]["adapter.vis_dim"] == 64 and info["kvs"]["adapter.teacher_tap"] == "final_norm"
    ev = json.loads(demo.eval_json.read_text())
    for key in ("cos_slice", "cos_vis", "cos_txt", "cos_edit", "cos_t2i", "cos", "rel_mse", "worst_sample_cos_slice",
                "roundtrip_cos", "val_samples"):
        assert key in ev, key
    assert ev["roundtrip_cos"] >= 0.999 and ev["val_samples"] == 24
    assert ev["cos_slice"] > 0.5                     # the demo run learns the tiny teacher well past the skip-path start
    assert "mmproj-qwen3vl-4b-it-f16.gguf" in cli("status", "--project", str(demo.root)).stdout


def test_precompute_reuses_vision_proj_and_refuses_a_mismatched_teacher_tokenizer(demo, tmp_path):
    from tokenizers import Tokenizer

    from trainer_core.base.errors import ModelFileError
    from trainer_core.contract.student import load_student
    root = tmp_path / "copy"
    shutil.copytree(demo.root, root)
    project = Project.open(root)
    materials = root / "materials"
    student = load_student(materials / "pig_clip-demo-f16.gguf", materials / "pig-clip-tokenizer")
    report = ListReport()
    teacher = MockVisionTeacher(64, 64)
    session = project.pack.prepare(project, student, teacher, report)
    assert any("vision_proj reused" in e["message"] for e in report.of_type("log"))
    assert torch.equal(session.weight, torch.load(root / "vision_proj.pt", weights_only=True)["weight"])
    data = json.loads(student.tokenizer.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|image_pad|>"]
    teacher.tokenizer = Tokenizer.from_str(json.dumps(data))
    with pytest.raises(ModelFileError, match=r"The teacher tokenizer does not place image slots where the engine does"):
        project.pack.prepare(project, student, teacher, report)
