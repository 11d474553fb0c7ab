"""`gguf-trainer inspect` and `gguf-trainer infer`, through the real CLI, on files written here: the command's own
entry point in this process (conftest.cli_here: the same return code and output, without a fresh interpreter and
torch per call; tests/test_cli_pipeline.py starts the installed command itself)."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from conftest import cli_here
from test_gguf_io import CONFIGS, IN, OUT, VIS, W, _state_arrays, _write_raw, export
from trainer_core.packs.lookup import format_prompt
from trainer_core.contract.gguf_io import read_adapter_gguf


@pytest.fixture
def run_cli():
    return cli_here


def engine_rows(path: Path, hidden: np.ndarray, **extra) -> np.ndarray:
    with torch.no_grad():
        return read_adapter_gguf(path).model(torch.from_numpy(hidden)[None], None, **extra)[0].numpy()


def np_compare(p: np.ndarray, r: np.ndarray) -> tuple[float, float, float]:
    """Plain cos, cos centred on the reference's mean row, rel_mse — written out in float64."""
    p, r = p.astype(np.float64), r.astype(np.float64)
    cos = np.mean([a @ b / np.linalg.norm(a) / np.linalg.norm(b) for a, b in zip(p, r)])
    mu = r.mean(0)
    cen = np.mean([(a - mu) @ (b - mu) / np.linalg.norm(a - mu) / np.linalg.norm(b - mu) for a, b in zip(p, r)])
    return float(cos), float(cen), float(((p - r) ** 2).sum() / (r ** 2).sum())


def test_infer_raw_engine_dumps_seeded(tmp_path, run_cli):
    path, _, _ = export(tmp_path, "seeded_resampler")
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((13, IN)).astype(np.float32)
    (tmp_path / "qwen_hidden.bin").write_bytes(hidden.astype("<f4").tobytes())
    ids = [12, 7, 33, 1] + [0] * 4
    (tmp_path / "t5_ids.txt").write_text("".join(f"{i}\n" for i in ids))
    want = engine_rows(path, hidden, seed_ids=torch.tensor([ids]))
    (tmp_path / "adapter_out.bin").write_bytes(want.astype("<f4").tobytes())

    r = run_cli("infer", "--adapter", str(path), "--hidden", str(tmp_path / "qwen_hidden.bin"),
                "--t5-ids", str(tmp_path / "t5_ids.txt"), "--compare", str(tmp_path / "adapter_out.bin"),
                "--out", str(tmp_path / "out.npy"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["output_shape"] == [8, OUT] and result["input_rows"] == 13
    assert result["cos"] == pytest.approx(1.0, abs=1e-6) and result["rel_mse"] < 1e-10
    assert "is healthy" in result["verdict"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6, atol=1e-6)

    human = run_cli("infer", "--adapter", str(path), "--hidden", str(tmp_path / "qwen_hidden.bin"),
                    "--t5-ids", str(tmp_path / "t5_ids.txt"), "--compare", str(tmp_path / "adapter_out.bin"))
    assert human.returncode == 0 and "centred cos 1.000000" in human.stdout


def test_infer_compare_numbers_against_a_perturbed_reference(tmp_path, run_cli):
    path, _, _ = export(tmp_path, "resampler")
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((9, IN)).astype(np.float32)
    np.save(tmp_path / "h.npy", hidden)
    rows = engine_rows(path, hidden)
    ref = rows + rng.standard_normal(rows.shape).astype(np.float32) * rows.std() * 0.6
    np.save(tmp_path / "ref.npy", ref)
    r = run_cli("infer", "--adapter", str(path), "--hidden", str(tmp_path / "h.npy"),
                "--compare", str(tmp_path / "ref.npy"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    cos, cen, rel = np_compare(rows, ref)
    assert result["cos"] == pytest.approx(cos, abs=1e-6)
    assert result["cos_centered"] == pytest.approx(cen, abs=1e-6)
    assert result["rel_mse"] == pytest.approx(rel, rel=1e-5)
    assert cen < 0.96 and "is healthy" not in result["verdict"] and f"{cen:.3f}" in result["verdict"]


def test_infer_token_aligned_with_vision_rows_and_a_sliced_reference(tmp_path, run_cli):
    path, _, _ = export(tmp_path, "token_aligned_vision")
    rng = np.random.default_rng(2)
    hidden = rng.standard_normal((20, IN)).astype(np.float32)
    vis = np.zeros((20, VIS), np.float32)
    vis[4:10] = rng.standard_normal((6, VIS))
    (tmp_path / "h.bin").write_bytes(hidden.tobytes())
    (tmp_path / "vis.bin").write_bytes(vis.tobytes())
    rows = engine_rows(path, hidden, vis=torch.from_numpy(vis)[None])
    (tmp_path / "ref.bin").write_bytes(rows[14:].tobytes())  # the engine drops the leading rows
    r = run_cli("infer", "--adapter", str(path), "--hidden", str(tmp_path / "h.bin"), "--vis",
                str(tmp_path / "vis.bin"), "--compare", str(tmp_path / "ref.bin"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["first_row"] == 14 and result["rows_compared"] == 6
    assert result["cos"] == pytest.approx(1.0, abs=1e-6)
    # without the vision rows the output differs: vis_in is really used
    r = run_cli("infer", "--adapter", str(path), "--hidden", str(tmp_path / "h.bin"),
                "--compare", str(tmp_path / "ref.bin"), "--json")
    assert json.loads(r.stdout)["cos"] < 0.9999


@pytest.mark.parametrize("case, args, message", [
    ("dump-size", ["--hidden", "{tmp}/odd.bin"], "is not a whole number of f32 rows of width 64"),
    ("no-ids", ["--hidden", "{tmp}/h.bin"], "seeded with T5 token ids: pass them with --t5-ids"),
    ("ids-count", ["--hidden", "{tmp}/h.bin", "--t5-ids", "{tmp}/short.txt"], "--t5-ids has 3 ids but this adapter has 8"),
    ("ids-text", ["--hidden", "{tmp}/h.bin", "--t5-ids", "{tmp}/words.txt"], 'holds "hello", which is not a token id'),
    ("vis-on-seeded", ["--hidden", "{tmp}/h.bin", "--vis", "{tmp}/h.bin"], "--vis is only for adapters with a vision input"),
    ("both-inputs", ["--hidden", "{tmp}/h.bin", "--student", "s.gguf", "--tokenizer", "t", "--pack", "llada_image", "--prompt", "x"],
     "one of the two"),
    ("no-input", [], "Give the student states with --hidden FILE"),
    ("missing", ["--hidden", "{tmp}/nope.bin"], "nope.bin (--hidden) does not exist"),
])
def test_infer_bad_input(case, args, message, tmp_path, run_cli):
    path, _, _ = export(tmp_path, "seeded_resampler")
    (tmp_path / "odd.bin").write_bytes(b"\0" * (4 * IN * 2 + 4))
    (tmp_path / "h.bin").write_bytes(np.ones((3, IN), np.float32).tobytes())
    (tmp_path / "short.txt").write_text("1\n2\n3\n")
    (tmp_path / "words.txt").write_text("1\nhello\n")
    r = run_cli("infer", "--adapter", str(path), *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_inspect_a_good_adapter(tmp_path, run_cli):
    path, _, _ = export(tmp_path, "seeded_resampler")
    r = run_cli("inspect", str(path))
    assert r.returncode == 0, r.stderr
    assert "adapter GGUF, 176" not in r.stdout  # the tiny test adapter, not the reference one
    assert "variant: seeded_resampler" in r.stdout and "layout: OK" in r.stdout
    assert "kv adapter.trained_steps = 1200" in r.stdout
    info = json.loads(run_cli("inspect", str(path), "--json").stdout)
    n_tensors = 3 + 1 + 28 * 2 + 4
    assert info["tensors"] == n_tensors and info["kind"] == "adapter"
    assert info["config"]["num_queries"] == 8 and info["config"]["seed_vocab"] == 50
    assert info["config"]["width"] == W and info["heads"] == W // 64


def test_inspect_reports_layout_problems(tmp_path, run_cli):
    tensors = _state_arrays("token_aligned_vision")
    tensors["adapter.query"] = np.zeros((8, W), np.float32)
    bad = _write_raw(tmp_path / "bad.gguf", tensors)
    r = run_cli("inspect", str(bad))
    assert r.returncode == 1
    assert "PROBLEM: adapter.query makes the engine run this file as a resampler" in r.stdout

    tensors = _state_arrays("resampler")
    tensors["adapter.in_proj.bias"] = tensors["adapter.in_proj.bias"].astype(np.float16)
    f16_bias = _write_raw(tmp_path / "f16bias.gguf", tensors)
    r = run_cli("inspect", str(f16_bias))
    assert r.returncode == 1
    assert "PROBLEM (runs, but not what gguf-trainer writes): adapter.in_proj.bias is F16; gguf-trainer writes F32" in r.stdout
    assert read_adapter_gguf(f16_bias).config == CONFIGS["resampler"]  # still readable


def test_inspect_a_student_and_junk(tmp_path, run_cli):
    w = gguf.GGUFWriter(tmp_path / "student.gguf", arch="qwen3")
    shapes = {"model.embed_tokens.weight": (100, 32), "model.norm.weight": (32,)}
    for i in range(2):
        shapes.update({f"model.layers.{i}.self_attn.q_proj.weight": (32, 32),
                       f"model.layers.{i}.mlp.up_proj.weight": (48, 32)})
    for name, shape in shapes.items():
        w.add_tensor(name, np.zeros(shape, np.float16 if len(shape) == 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run_cli("inspect", str(tmp_path / "student.gguf"), "--json")
    assert r.returncode == 0, r.stdout
    info = json.loads(r.stdout)
    assert info["kind"] == "student"
    assert info["config"] == {"hidden_size": 32, "vocab_size": 100, "num_hidden_layers": 2, "intermediate_size": 48}

    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    r = run_cli("inspect", str(tmp_path / "junk.gguf"))
    assert r.returncode == 2 and "is not a GGUF file" in r.stderr


def test_infer_from_a_prompt_through_template_and_student(tmp_path, run_cli):
    from trainer_core.packs import get_pack
    from trainer_core.contract.student import load_student
    from trainer_core.packs.common.tiny_models import (tiny_qwen3_config, write_qwen_tokenizer, write_student_config,
                                            write_student_gguf)
    from transformers import Qwen3Model

    torch.manual_seed(0)
    config = tiny_qwen3_config(hidden_size=IN)
    snapshot = tmp_path / "pig-clip-tokenizer"
    write_qwen_tokenizer(snapshot)
    write_student_config(snapshot, config)
    write_student_gguf(Qwen3Model(config), tmp_path / "pig_clip-f16.gguf", dtype="f16")
    path, _, _ = export(tmp_path, "resampler")

    r = run_cli("infer", "--adapter", str(path), "--student", str(tmp_path / "pig_clip-f16.gguf"),
                "--tokenizer", str(snapshot), "--pack", "llada_image", "--prompt", "a sheep in sunglasses",
                "--out", str(tmp_path / "rows.npy"), "--json")
    assert r.returncode == 0, r.stderr
    student = load_student(tmp_path / "pig_clip-f16.gguf", snapshot)
    text = "<role>HUMAN</role> Generate an image: a sheep in sunglasses\n<role>ASSISTANT</role>\n<IMAGE1>"
    assert format_prompt(get_pack("llada_image"), "a sheep in sunglasses") == text
    states, _ = student.encode([text])
    want = engine_rows(path, states[0].numpy())
    assert json.loads(r.stdout)["input_rows"] == len(student.tokenize(text)) == states.shape[1]
    np.testing.assert_allclose(np.load(tmp_path / "rows.npy"), want, rtol=1e-5, atol=1e-5)

    r = run_cli("infer", "--adapter", str(path), "--student", str(tmp_path / "pig_clip-f16.gguf"),
                "--tokenizer", str(snapshot), "--pack", "t5xxl_pixart")
    assert r.returncode == 2 and "one of the two" in r.stderr
