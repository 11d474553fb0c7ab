"""The FLUX.3 Klein demo, trained once per session by the stage processes (tests/demo_cache.py) as `gguf-trainer demo --pack qwen3vl_flux3`, then
`gguf-trainer run` (60 steps: the whole pipeline in about a minute on two cores), then the exported
layerwise GGUF through `inspect` and `infer`, checked against an independent numpy reading of the file."""
from __future__ import annotations

import json

import numpy as np
import pytest

import demo_cache
from conftest import cli, cli_here
from numpy_adapters import gguf_tensors, token_aligned_forward as layerwise_forward
from trainer_core.packs.qwen3vl_flux3 import PACK
from trainer_core.project import Project

STEPS = demo_cache.STEPS
TAPS = (1, 2, 3, 4, 5, 6, 7, 8)            # the tiny demo teacher's 9 layers


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The session's trained demo (tests/demo_cache.py: the stage processes), this module's copy."""
    return Project.open(demo_cache.copy_trained("qwen3vl_flux3", tmp_path_factory.mktemp("flux3")))


def test_the_flux3_demo_trains_exports_and_reads_back(demo, tmp_path):
    ev = json.loads(demo.eval_json.read_text())
    assert ev["pack"] == "qwen3vl_flux3" and ev["kind"] == "token_aligned_layerwise"
    assert ev["config"]["taps"] == list(TAPS) and ev["config"]["out_dim"] == 8 * 64
    for name in (*PACK.metric_names, *(f"cos_tap_{k}" for k in TAPS)):
        assert name in ev, name
    assert ev["roundtrip_cos"] >= 0.999
    assert ev["trained_steps"] == STEPS and ev["val_samples"] == 40
    assert ev["cos"] > 0.3            # the untrained adapter (skip path on random weights) scores about 0
    assert min(ev["cos_tokens"], ev["cos_pads"]) <= ev["cos"] <= max(ev["cos_tokens"], ev["cos_pads"])

    gguf_path = demo.gguf_path()
    r = cli("inspect", str(gguf_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "variant: token_aligned_layerwise" in r.stdout and "layout: OK" in r.stdout
    assert f"kv adapter.out_layers = {list(TAPS)!r}" in r.stdout and "kv adapter.n_out_layers = 8" in r.stdout

    weights = gguf_tensors(gguf_path)
    h = np.random.default_rng(0).normal(size=(93, 64)).astype(np.float32)
    np.save(tmp_path / "H.npy", h)
    r = cli_here("infer", "--adapter", str(gguf_path), "--hidden", str(tmp_path / "H.npy"), "--out",
            str(tmp_path / "O.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = np.load(tmp_path / "O.npy")
    assert out.shape == (93, 8 * 64)
    np.testing.assert_allclose(out, layerwise_forward(weights, h), atol=1e-4, rtol=1e-5)

    # from a prompt: the engine's template, padded to 80 rows with pads at position 1, through the student
    materials = demo.materials_dir
    r = cli_here("infer", "--adapter", str(gguf_path), "--student", str(materials / "pig_clip-demo-f16.gguf"),
            "--tokenizer", str(materials / "pig-clip-tokenizer"), "--pack", "qwen3vl_flux3",
            "--prompt", "a sheep in sunglasses", "--out", str(tmp_path / "P.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    from trainer_core.contract.student import load_student
    student = load_student(materials / "pig_clip-demo-f16.gguf", materials / "pig-clip-tokenizer")
    rows = PACK.student_states(student, "a sheep in sunglasses")
    assert rows.shape == (80, 64)
    np.testing.assert_allclose(np.load(tmp_path / "P.npy"), layerwise_forward(weights, rows), atol=1e-4, rtol=1e-5)
