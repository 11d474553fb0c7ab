"""The Qwen3.5 bridge demo, trained once per session by the stage processes (tests/demo_cache.py) as `gguf-trainer demo --pack qwen35_bridge`,
`gguf-trainer run` (a tiny random Qwen3.5 with a Qwen3.5-format tokenizer, a tiny Qwen3-VL for the
Klein bank), then the exported GGUF through `inspect` and `infer` (--seed-ids, --vis/--vis-pos,
--bank, --prompt), checked against an independent numpy reading of the file; and the export refusing
to write an adapter without the Qwen3.5 vocabulary."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from numpy_adapters import bridge_forward, engine_bank_hidden, engine_bank_rows, gguf_tensors
import demo_cache
from conftest import cli, cli_here
from trainer_core.contract.gguf_io import read_gguf_kvs, read_gguf_string_array
from trainer_core.packs.qwen35_bridge import PACK
from trainer_core.packs.qwen35_bridge.teacher import tokenizer_arrays
from trainer_core.packs.qwen35_bridge.template import IMAGE_PAD, build_prompt_ids
from trainer_core.project import Project
from trainer_core.packs.lookup import resolve_material

STEPS = demo_cache.STEPS


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The session's trained demo (tests/demo_cache.py: the stage processes), this module's copy."""
    return Project.open(demo_cache.copy_trained("qwen35_bridge", tmp_path_factory.mktemp("bridge")))


def test_the_bridge_demo_trains_exports_and_evaluates(demo):
    ev = json.loads(demo.eval_json.read_text())
    assert ev["pack"] == "qwen35_bridge" and ev["kind"] == "qwen35_bridge"
    c = ev["config"]
    assert c["n_bank"] == 80 and c["bank_align"] and c["seed_vocab"] == 248320 and c["seed_rank"] == 16
    for name in PACK.metric_names:
        assert name in ev, name
    assert ev["roundtrip_cos"] >= 0.999
    assert ev["trained_steps"] == STEPS and ev["klein_batches"] > 0
    assert ev["cos_centered_moss"] > 0.3 and ev["cos_centered_klein"] > 0.1     # an untrained adapter: ~0
    # the seed table precompute fitted is the one in the file, bit for bit
    import torch
    table = torch.load(demo.root / "seed_table.pt", weights_only=True)["table"]
    assert np.array_equal(gguf_tensors(demo.gguf_path())["seed_embed.weight"], table.numpy().astype(np.float64))


def test_the_export_carries_a_usable_qwen35_vocabulary(demo):
    gguf_path = demo.gguf_path()
    r = cli("inspect", str(gguf_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "variant: qwen35_bridge" in r.stdout and "layout: OK" in r.stdout
    kvs = read_gguf_kvs(gguf_path)
    assert kvs["tokenizer.ggml.pre"] == "qwen35" and kvs["tokenizer.ggml.model"] == "gpt2"
    tokens = read_gguf_string_array(gguf_path, "tokenizer.ggml.tokens")
    merges = read_gguf_string_array(gguf_path, "tokenizer.ggml.merges")
    want = tokenizer_arrays(resolve_material(demo, "teacher") / "tokenizer.json", 248320)
    assert (tokens, merges) == want and merges and len(tokens) == 248320
    # the engine rebuilds token → id from the array: the template's specials resolve to their ids
    index = {t: i for i, t in enumerate(tokens)}
    assert index["<|im_start|>"] == 248045 and index["<|image_pad|>"] == IMAGE_PAD and index["<think>"] == 248068


def test_infer_equals_the_numpy_engine_on_the_trained_file(demo, tmp_path):
    from tokenizers import Tokenizer
    gguf_path = demo.gguf_path()
    w = gguf_tensors(gguf_path)
    tok = Tokenizer.from_file(str(resolve_material(demo, "teacher") / "tokenizer.json"))
    ids, runs = build_prompt_ids(lambda s: tok.encode(s, add_special_tokens=False).ids, "make it night", [64, 16])
    rng = np.random.default_rng(0)
    h = rng.normal(size=(7, 64)).astype(np.float32)
    vis = rng.normal(size=(80, 64)).astype(np.float32)
    np.save(tmp_path / "H.npy", h)
    np.save(tmp_path / "V.npy", vis)
    (tmp_path / "seed_ids.txt").write_text("".join(f"{i}\n" for i in ids))
    vis_pos = ",".join(f"{s}:{n}" for s, n in runs)
    common = ("infer", "--adapter", str(gguf_path), "--hidden", str(tmp_path / "H.npy"), "--seed-ids",
              str(tmp_path / "seed_ids.txt"), "--vis", str(tmp_path / "V.npy"), "--vis-pos", vis_pos)
    r = cli_here(*common, "--out", str(tmp_path / "S.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    _, slots = bridge_forward(w, h, ids, vis, runs)
    np.testing.assert_allclose(np.load(tmp_path / "S.npy"), slots, atol=1e-4, rtol=1e-5)
    r = cli_here(*common, "--bank", "--out", str(tmp_path / "B.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    bank, _ = bridge_forward(w, h, ids, vis, runs, bank_hidden=engine_bank_hidden(w, h))
    rows = engine_bank_rows(w, len(h))
    assert rows == 80
    np.testing.assert_allclose(np.load(tmp_path / "B.npy"), bank[:rows], atol=1e-4, rtol=1e-5)

    # from a prompt: the student reads the raw text, as the engine's bridge path
    materials = demo.materials_dir
    r = cli_here("infer", "--adapter", str(gguf_path), "--student", str(materials / "pig_clip-demo-f16.gguf"),
            "--tokenizer", str(materials / "pig-clip-tokenizer"), "--pack", "qwen35_bridge",
            "--prompt", "a sheep in sunglasses", "--seed-ids", str(tmp_path / "seed_ids.txt"), "--vis",
            str(tmp_path / "V.npy"), "--vis-pos", vis_pos, "--out", str(tmp_path / "P.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    from trainer_core.contract.student import load_student
    student = load_student(materials / "pig_clip-demo-f16.gguf", materials / "pig-clip-tokenizer")
    rows = PACK.student_states(student, "a sheep in sunglasses")
    assert rows.shape[0] == len(student.tokenize("a sheep in sunglasses"))
    np.testing.assert_allclose(np.load(tmp_path / "P.npy"), bridge_forward(w, rows, ids, vis, runs)[1], atol=1e-4,
                               rtol=1e-5)


def test_export_fails_without_the_teachers_tokenizer(demo, tmp_path):
    """The engine cannot build the MOSS template without the vocabulary: no file is written (the old
    export is kept as it was), one sentence, a non-zero exit."""
    tokenizer = resolve_material(demo, "teacher") / "tokenizer.json"
    before = demo.gguf_path().read_bytes()
    shutil.move(tokenizer, tmp_path / "tokenizer.json")
    try:
        r = cli("run", "--project", str(demo.root), "--only", "export", "--force", timeout=300)
    finally:
        shutil.move(tmp_path / "tokenizer.json", tokenizer)
    assert r.returncode != 0
    assert "tokenizer.json is missing" in r.stdout + r.stderr
    assert demo.gguf_path().read_bytes() == before
    assert not list(demo.gguf_path().parent.glob(".*.tmp"))


def test_image_slots_of_a_shard_are_the_engines(demo):
    """Every stored reference sits on a `<|image_pad|>` run of its sample's slot ids, as the engine indexes
    it (the count of tokens through `<|vision_start|>`)."""
    from trainer_core.contract.shards import Shard, valid_shards
    shard = Shard(valid_shards(demo, "train")[0])
    ids, lens = shard["slot_ids"].tolist(), shard["t_len"].tolist()
    offsets = np.cumsum([0, *lens])
    found = 0
    for s, start, n in zip(shard["vis_sample"].tolist(), shard["vis_start"].tolist(), shard["vis_len"].tolist()):
        sample = ids[offsets[s]:offsets[s + 1]]
        assert sample[start - 1] == 248053 and set(sample[start:start + n]) == {IMAGE_PAD}
        assert sample[start + n] == 248054
        found += 1
    assert found > 0 and shard["has_bank_target"].sum() > 0
