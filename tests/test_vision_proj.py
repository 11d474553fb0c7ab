"""vision_proj: the streaming ridge fit recovers a planted map, equals the dense solve, reads tables
from safetensors, and keeps its memory to the Gram matrices plus one block (measured)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.qwen3vl.vision_proj import (RowSource, fit_vision_proj, load_vision_proj, safetensors_rows,
                                      save_vision_proj, tensor_rows)

V, VIS, IN = 20000, 64, 32


def numpy_rows(table: np.ndarray, name: str) -> RowSource:
    return RowSource(table.shape[0], table.shape[1], lambda a, b: table[a:b].astype(np.float64), name)


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((V, VIS)).astype(np.float32)
    true = rng.standard_normal((IN, VIS)).astype(np.float32) / 8
    student = (teacher @ true.T + 0.01 * rng.standard_normal((V, IN))).astype(np.float32)
    return teacher, student, true


def test_the_fit_recovers_a_planted_map_and_equals_the_dense_ridge_solve(planted):
    teacher, student, true = planted
    fit = fit_vision_proj(numpy_rows(teacher, "t"), numpy_rows(student, "s"), block=3000)
    assert fit.weight.shape == (IN, VIS) and fit.weight.dtype == torch.float32 and fit.vocab == V
    np.testing.assert_allclose(fit.weight.numpy(), true, atol=2e-3)
    et, es = teacher.astype(np.float64), student.astype(np.float64)
    gram = et.T @ et
    dense = np.linalg.solve(gram + 1e-4 * np.mean(np.diag(gram)) * np.eye(VIS), et.T @ es).T
    np.testing.assert_allclose(fit.weight.numpy(), dense.astype(np.float32), rtol=1e-5, atol=1e-6)
    assert fit.fit_cos_mean > 0.99 and fit.fit_cos_p5 > 0.98 and fit.rel_mse < 1e-3


def test_the_fit_streams_its_memory_is_measured(planted):
    teacher, student, _ = planted
    block = 2000
    tracemalloc.start()
    try:
        fit_vision_proj(numpy_rows(teacher, "t"), numpy_rows(student, "s"), block=block)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    both_tables_f64 = V * (VIS + IN) * 8                                       # 15.4 MB
    bound = 8 * (2 * VIS * VIS + VIS * IN + 4 * block * (VIS + IN)) + 8 * V   # Grams, ~4 blocks, the cosines
    print(f"vision_proj fit peak {peak / 2**20:.2f} MiB (both tables in float64: {both_tables_f64 / 2**20:.2f} MiB)")
    assert peak < bound < both_tables_f64 / 2


def test_tables_are_read_from_a_sharded_snapshot(tmp_path, planted):
    teacher, student, true = planted
    save_file({"model.visual.blocks.0.weight": torch.zeros(2, 2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"model.language_model.embed_tokens.weight": torch.from_numpy(teacher).bfloat16()},
              str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"model.visual.blocks.0.weight": "model-00001-of-00002.safetensors", '
        '"model.language_model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}')
    rows = safetensors_rows(tmp_path)
    assert (rows.rows, rows.width) == (V, VIS)
    np.testing.assert_array_equal(rows.read(5, 9), torch.from_numpy(teacher[5:9]).bfloat16().double().numpy())
    fit = fit_vision_proj(rows, tensor_rows(torch.from_numpy(student).bfloat16()))
    np.testing.assert_allclose(fit.weight.numpy(), true, atol=2e-2)              # bf16 tables: coarser
    with pytest.raises(ModelFileError, match="no token-embedding table"):
        safetensors_rows(tmp_path, names=("nope.weight",))


def test_a_vocabulary_mismatch_is_refused(planted):
    teacher, student, _ = planted
    with pytest.raises(ModelFileError, match=r"vocabulary \(20000 rows in t\) and the student's \(19999 rows"):
        fit_vision_proj(numpy_rows(teacher, "t"), numpy_rows(student[:-1], "s"))


def test_a_saved_fit_is_reused_only_with_its_shape(tmp_path, planted):
    teacher, student, _ = planted
    fit = fit_vision_proj(numpy_rows(teacher[:500], "t"), numpy_rows(student[:500], "s"))
    path = tmp_path / "vision_proj.pt"
    save_vision_proj(path, fit, "qwen3vl_mageflow")
    saved = load_vision_proj(path, IN, VIS)
    assert torch.equal(saved["weight"], fit.weight) and saved["pack"] == "qwen3vl_mageflow" and saved["ridge"] == 1e-4
    assert load_vision_proj(path, IN + 1, VIS) is None
    path.write_bytes(b"damaged")
    assert load_vision_proj(path, IN, VIS) is None
    assert load_vision_proj(tmp_path / "absent.pt", IN, VIS) is None


@pytest.mark.parametrize("rows_per_call", [1, 6, 8, 10_000])
def test_mapping_the_images_in_batched_matmuls_gives_each_image_its_own_rows(rows_per_call):
    from trainer_core.packs.common.qwen3vl.vision_pack import map_rows
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(8, 16, generator=g)                                    # vision_proj [in, vis]
    blocks = [torch.randn(n, 16, generator=g).to(torch.bfloat16) for n in (3, 5, 1, 7, 2)]
    mapped = map_rows(blocks, weight, rows_per_call)
    assert [m.shape for m in mapped] == [torch.Size([b.shape[0], 8]) for b in blocks]
    for m, b in zip(mapped, blocks):
        assert m.dtype == torch.float32
        torch.testing.assert_close(m, b.float() @ weight.T)
    assert map_rows([], weight) == []
