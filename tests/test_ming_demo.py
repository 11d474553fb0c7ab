"""The Ming-Image demo, trained once per session by the stage processes (tests/demo_cache.py) as `gguf-trainer demo --pack ming_image`, `gguf-trainer
run` (a tiny random Ling thinker, Qwen2 connector, Qwen2.5-VL tower and a Ling-format tokenizer), then
the exported adapter through `inspect` and `infer` (--seed-ids, --vis/--vis-pos, --bank, --prompt)
against an independent numpy reading of the file, the vision GGUF read back, the shards' slots and
layer prompts, precompute batched = one sample at a time, and the export refusing an adapter
without the Ling tokenizer."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from numpy_adapters import gguf_tensors, ming_forward
import demo_cache
from conftest import cli, cli_here
from trainer_core.packs.ming_image.extras import vision_path
from trainer_core.contract.adapter_layout import TOKENIZER_JSON
from trainer_core.packs.ming_image import PACK
from trainer_core.packs.ming_image.template import IMAGE_PATCH, image_tokens, layer_count, prompt_string
from trainer_core.project import Project
from trainer_core.packs.lookup import resolve_material

STEPS = demo_cache.STEPS


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The session's trained demo (tests/demo_cache.py: the stage processes), this module's copy."""
    return Project.open(demo_cache.copy_trained("ming_image", tmp_path_factory.mktemp("ming")))


def ling_tokenizer(project):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(resolve_material(project, "teacher") / "mllm" / "tokenizer.json"))


def test_the_demo_trains_exports_and_evaluates(demo):
    ev = json.loads(demo.eval_json.read_text())
    assert ev["pack"] == "ming_image" and ev["kind"] == "ming_image"
    c = ev["config"]
    assert (c["n_bank"], c["bank_dim"], c["out_dim"], c["seed_vocab"], c["seed_rank"]) == (256, 96, 128, 157184, 16)
    assert not c["bank_align"]
    for name in PACK.metric_names:
        assert name in ev, name
    assert ev["roundtrip_cos"] >= 0.999
    assert ev["trained_steps"] == STEPS and ev["cap_batches"] > 0
    assert ev["cos_centered_cap"] > 0.1 and ev["cos_centered_dir"] > 0.1           # an untrained adapter: ~0
    # the seed table precompute fitted is the one in the file, bit for bit
    table = torch.load(demo.root / "seed_table.pt", weights_only=True)["table"]
    w = gguf_tensors(demo.gguf_path())
    assert np.array_equal(w["seed_embed.weight"], table.numpy().astype(np.float64))


def test_the_export_carries_the_ling_tokenizer_and_passes_inspect(demo):
    r = cli("inspect", str(demo.gguf_path()))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "variant: ming_image" in r.stdout and "layout: OK" in r.stdout
    stored = gguf_tensors(demo.gguf_path())[TOKENIZER_JSON]
    want = (resolve_material(demo, "teacher") / "mllm" / "tokenizer.json").read_bytes()
    assert stored.astype(np.uint8).tobytes() == want


def test_the_vision_gguf_reads_back(demo):
    from trainer_core.packs.ming_image.export import check_vision_gguf
    path = vision_path(demo)
    assert path.name == "pig_ming_vision-f16.gguf" and path.parent == demo.gguf_path().parent
    check_vision_gguf(path, vis_dim=64)                    # the engine's requirements, at the adapter's vis_dim
    lines = PACK.ggk_command(demo).splitlines()
    assert len(lines) == 3 and f"--llm_vision {path}" in lines[1] and "design-layer" in lines[2]


def test_infer_equals_the_numpy_engine_on_the_trained_file(demo, tmp_path):
    gguf_path = demo.gguf_path()
    w = gguf_tensors(gguf_path)
    tok = ling_tokenizer(demo)
    n_image = image_tokens(480, 640)
    ids = tok.encode(prompt_string("make it night", n_image), add_special_tokens=False).ids
    start = ids.index(IMAGE_PATCH)
    rng = np.random.default_rng(0)
    h = rng.normal(size=(7, 64)).astype(np.float32)
    vis = rng.normal(size=(n_image, 64)).astype(np.float32)
    vis /= np.linalg.norm(vis, axis=1, keepdims=True)
    np.save(tmp_path / "H.npy", h)
    np.save(tmp_path / "V.npy", vis)
    (tmp_path / "seed_ids.txt").write_text("".join(f"{i}\n" for i in ids))
    common = ("infer", "--adapter", str(gguf_path), "--hidden", str(tmp_path / "H.npy"), "--seed-ids",
              str(tmp_path / "seed_ids.txt"), "--vis", str(tmp_path / "V.npy"), "--vis-pos", f"{start}:{n_image}")
    r = cli_here(*common, "--out", str(tmp_path / "O.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    want = ming_forward(w, h, ids, vis, start)
    got = np.load(tmp_path / "O.npy")
    assert got.shape == (256 + len(ids), 128)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)
    r = cli_here(*common, "--bank", "--out", str(tmp_path / "B.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "B.npy"), want[:256, :96], atol=1e-4, rtol=1e-5)
    r = cli_here(*common, "--vis-pos", f"{start}:10,{start + 20}:{n_image - 10}")
    assert r.returncode != 0 and "one input image" in r.stdout + r.stderr

    # from a prompt: the student reads the raw text and the Ling ids come from the file's tokenizer
    materials = demo.materials_dir
    r = cli_here("infer", "--adapter", str(gguf_path), "--student", str(materials / "pig_clip-demo-f16.gguf"),
            "--tokenizer", str(materials / "pig-clip-tokenizer"), "--pack", "ming_image",
            "--prompt", "make it night", "--vis", str(tmp_path / "V.npy"), "--out", str(tmp_path / "P.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    from trainer_core.contract.student import load_student
    student = load_student(materials / "pig_clip-demo-f16.gguf", materials / "pig-clip-tokenizer")
    rows = PACK.student_states(student, "make it night")
    assert rows.shape[0] == len(student.tokenize("make it night"))
    np.testing.assert_allclose(np.load(tmp_path / "P.npy"), ming_forward(w, rows, ids, vis, start), atol=1e-4,
                               rtol=1e-5)


def test_export_fails_without_the_ling_tokenizer(demo, tmp_path):
    """The engine cannot tokenize the Ming template without it: no file is written (the old export is kept
    as it was), one sentence, a non-zero exit."""
    tokenizer = resolve_material(demo, "teacher") / "mllm" / "tokenizer.json"
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


def test_the_shards_hold_the_engines_slots_and_the_layer_prompts(demo):
    """Every stored image sits on the `<imagePatch>` run of its sample's Ling ids with the engine's count
    for its size; the caption bank is 256 rows a sample; the corpus carries its layer prompts."""
    from PIL import Image

    from trainer_core.contract.shards import Shard, valid_shards
    samples = [json.loads(line) for line in (demo.data_dir / "train.jsonl").read_text().splitlines()]
    layered = [s for s in samples if "layers" in s["text"].lower()]
    assert len(layered) == 4 and all(2 <= layer_count(s["text"]) <= 8 and len(s["images"]) == 1 for s in layered)
    seen = 0
    for path in valid_shards(demo, "train"):
        shard = Shard(path)
        t = {key: shard[key] for key in shard.keys}
        n = len(t["len"])
        assert t["b_pack"].shape == (256 * n, 96) and t["bank_rows"].tolist() == [256] * n
        offsets = np.concatenate([[0], np.cumsum(t["t_len"].numpy())])
        images = shard.meta["images"]
        for i, s, v in zip(t["vis_sample"].tolist(), t["vis_start"].tolist(), t["vis_len"].tolist()):
            slots = t["slot_ids"][offsets[i] + s:offsets[i] + s + v]
            assert (slots == IMAGE_PATCH).all() and t["slot_ids"][offsets[i] + s - 1] != IMAGE_PATCH
            with Image.open(demo.data_dir / images[i][0]) as im:
                assert v == image_tokens(im.height, im.width)
            seen += 1
        assert t["t_pack"].shape[0] == offsets[-1] and t["v_pack"].shape[0] == t["vis_len"].sum()
    assert seen == 16


def test_precompute_batched_equals_one_sample_at_a_time(demo):
    """The real (tiny) teacher and the student over a padded batch give each sample's rows as when it runs
    alone (to one bf16 rounding step)."""
    from trainer_core.base.events import ListReport
    from trainer_core.contract.student import load_student
    from trainer_core.packs.base import Budgets
    materials = demo.materials_dir
    student = load_student(materials / "pig_clip-demo-f16.gguf", materials / "pig-clip-tokenizer")
    teacher = PACK.build_teacher(demo, "cpu")
    session = PACK.prepare(demo, student, teacher, ListReport())
    samples = PACK.corpus_kind.read_samples(demo, demo.data_dir / "val.jsonl")
    samples = [s for s in samples if s["images"]][:2] + [s for s in samples if not s["images"]][:3]
    together, _ = PACK.make_shard(samples, student, teacher, Budgets(8, 1 << 16, 8, 1 << 16, 1 << 16), session)
    alone, _ = PACK.make_shard(samples, student, teacher, Budgets(1, 1 << 16, 1, 1 << 16, 1), session)
    assert together.keys() == alone.keys()
    for key in together:
        a, b = together[key], alone[key]
        if a.is_floating_point():
            torch.testing.assert_close(a.float(), b.float(), rtol=8e-3, atol=1e-4, msg=key)
        else:
            assert torch.equal(a, b), key
    assert together["n_images"].tolist().count(1) == 2


def test_the_export_carries_the_fitted_vis_bridge(demo):
    """The demo picks a stock-layout mmproj (the tiny Ming tower written as llama.cpp writes Qwen2.5-VL):
    the export fits the bridge, keeps it in vis_bridge.pt and writes it beside adapter.* as the engine
    detects it; fitted, it maps the stock rows far closer to the Ling rows than an unfitted one."""
    from trainer_core.contract.vis_bridge import BridgeConfig, VisBridge, detect_bridge
    from trainer_core.packs.ming_image.bridge_fit import FILE, bridge_pairs, fitted_bridge
    from trainer_core.packs.ming_image.stock_vision import StockVision
    saved = torch.load(demo.root / FILE, weights_only=True)
    w = gguf_tensors(demo.gguf_path())
    config = detect_bridge({n: tuple(reversed(a.shape)) for n, a in w.items()})
    assert config == BridgeConfig(**saved["config"])
    assert (config.in_dim, config.out_dim, config.width, config.depth) == (48, 64, 64, 1)
    for name, value in saved["state"].items():
        np.testing.assert_allclose(w["vis_bridge." + name], value.numpy(), rtol=2e-3, atol=2e-4)
    from_file = VisBridge(config)
    from_file.load_state_dict({n: torch.from_numpy(w["vis_bridge." + n]).float() for n in saved["state"]})
    stock = StockVision.load(resolve_material(demo, "stock_mmproj"))
    pairs = bridge_pairs(demo, stock, 4)
    torch.manual_seed(0)
    unfitted = VisBridge(config)

    def cos(model):
        with torch.no_grad():
            return float(np.mean([torch.nn.functional.cosine_similarity(model(x.float(), gh, gw), y.float(), dim=-1)
                                  .mean() for x, y, gh, gw in pairs]))
    assert cos(from_file) > 0.6 and cos(unfitted) < 0.3
    assert saved["val_cos"] > 0.6 and saved["images"] == 12
    assert fitted_bridge(demo) is not None


def test_a_changed_setting_fits_again_and_a_stop_keeps_the_old_fit(demo):
    from trainer_core.base.events import ListReport
    from trainer_core.packs.ming_image.bridge_fit import FILE, ensure_vis_bridge, fitted_bridge
    from trainer_core.stages import stage_done
    before = (demo.root / FILE).read_bytes()
    project = Project.open(demo.root)
    project.update_settings(["export.vis_bridge_steps=81"])
    try:
        project = Project.open(demo.root)
        assert fitted_bridge(project) is None                      # the key names the steps
        assert not stage_done(project, "export")                   # so the pipeline exports again
        assert ensure_vis_bridge(project, ListReport(), lambda: True) is False
        assert (demo.root / FILE).read_bytes() == before
    finally:
        project.update_settings(["export.vis_bridge_steps=80"])
    assert fitted_bridge(Project.open(demo.root)) is not None
    assert stage_done(Project.open(demo.root), "export")
