"""The Ming vision encoder and its companion GGUF (trainer_core/packs/ming_image/vision.py,
vision_export.py) on a tiny random Qwen2.5-VL tower written as an mllm/ folder."""
from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch.nn import functional as F

from trainer_core.base import diskspace
from trainer_core.base.errors import DiskFullError, FolderError, ModelFileError
from trainer_core.packs.ming_image.vision import MingVision, vision_tensors
from trainer_core.packs.ming_image.export import (PATCH_EMBED, check_vision_gguf, export_vision_gguf,
                                                         vision_gguf_name, vision_gguf_problems)

VISION_CONFIG = dict(depth=2, hidden_size=32, num_heads=2, out_hidden_size=48, intermediate_size=64,
                     hidden_act="silu", in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                     window_size=56, fullatt_block_indexes=[1], tokens_per_second=2, model_type="qwen2_5_vit")
HIDDEN = 64                                     # linear_proj width (the adapter's vis_dim)
GRIDS = [(1, 8, 12), (1, 4, 4)]                 # two images: 96 + 16 patches → 24 + 4 rows


def _reference_tower():
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    config = Qwen2_5_VLVisionConfig(**{k: v for k, v in VISION_CONFIG.items() if k != "model_type"})
    config._attn_implementation = "eager"       # another attention path than the module's sdpa
    return Qwen2_5_VisionTransformerPretrainedModel(config).eval()


def _weights() -> dict[str, torch.Tensor]:
    """Random vision.* + linear_proj.* in bf16, as the real checkpoint stores them."""
    torch.manual_seed(0)
    tower = _reference_tower()
    out = {}
    for name, p in tower.state_dict().items():
        value = 1 + 0.1 * torch.randn_like(p) if name.endswith("norm1.weight") or name.endswith("norm2.weight") \
            or name.endswith("ln_q.weight") else 0.2 * torch.randn_like(p)
        out["vision." + name] = value.to(torch.bfloat16)
    out["linear_proj.0.weight"] = (0.2 * torch.randn(HIDDEN, 48)).to(torch.bfloat16)
    out["linear_proj.0.bias"] = (0.1 * torch.randn(HIDDEN)).to(torch.bfloat16)
    out["linear_proj.2.weight"] = (0.2 * torch.randn(HIDDEN, HIDDEN)).to(torch.bfloat16)
    out["linear_proj.2.bias"] = (0.1 * torch.randn(HIDDEN)).to(torch.bfloat16)
    return out


def _write_config(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"llm_config": {"hidden_size": HIDDEN},
                                                    "vision_config": VISION_CONFIG}))


def _sharded_mllm(root: Path, weights: dict[str, torch.Tensor]) -> Path:
    """A snapshot root whose mllm/ splits the vision tensors over two shards; a third shard, listed
    in the index for the thinker's tensors only, is not even a safetensors file."""
    mllm = root / "mllm"
    _write_config(mllm)
    names = sorted(weights)
    half = len(names) // 2
    thinker = {"model.model.word_embeddings.weight": torch.randn(10, 8), "model.model.norm.weight": torch.ones(8)}
    shards = {"model-00001-of-00003.safetensors": {**{n: weights[n] for n in names[:half]}, **thinker},
              "model-00002-of-00003.safetensors": {n: weights[n] for n in names[half:]}}
    weight_map = {}
    for file, tensors in shards.items():
        save_file(tensors, str(mllm / file))
        weight_map.update({n: file for n in tensors})
    (mllm / "model-00003-of-00003.safetensors").write_bytes(b"not a safetensors file")
    weight_map["model.model.layers.0.attention.dense.weight"] = "model-00003-of-00003.safetensors"
    (mllm / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def _single_file_mllm(folder: Path, weights: dict[str, torch.Tensor]) -> Path:
    _write_config(folder)
    save_file({**weights, "model.model.norm.weight": torch.ones(8)}, str(folder / "model-00001-of-00001.safetensors"))
    return folder


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return _weights()


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, weights) -> Path:
    return _sharded_mllm(tmp_path_factory.mktemp("ming"), weights)


@pytest.fixture(scope="module")
def patches() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(sum(t * h * w for t, h, w in GRIDS), 3 * 2 * 14 * 14, generator=g)


def _reference_rows(weights, patches, gelu: str) -> torch.Tensor:
    """transformers' tower by itself + linear_proj + L2 written out by hand."""
    tower = _reference_tower()
    tower.load_state_dict({n[len("vision."):]: t.float() for n, t in weights.items() if n.startswith("vision.")})
    if gelu == "tanh":
        tower.merger.mlp[1] = torch.nn.GELU(approximate="tanh")
    with torch.no_grad():
        merged = tower(hidden_states=patches, grid_thw=torch.tensor(GRIDS)).pooler_output
        x = F.linear(merged, weights["linear_proj.0.weight"].float(), weights["linear_proj.0.bias"].float())
        x = F.gelu(x, approximate="tanh" if gelu == "tanh" else "none")
        x = F.linear(x, weights["linear_proj.2.weight"].float(), weights["linear_proj.2.bias"].float())
    return x / x.norm(dim=-1, keepdim=True)


# ------------------------------------------------------------------ the encoder


@pytest.mark.parametrize("gelu", ["exact", "tanh"])
def test_encode_equals_the_tower_and_projection_run_by_hand(snapshot, weights, patches, gelu):
    model = MingVision.load(snapshot, "cpu", torch.float32, gelu=gelu)     # the snapshot root: mllm/ is found
    rows = model.encode(patches, GRIDS)
    assert rows.shape == (24 + 4, HIDDEN) and rows.dtype == torch.float32
    torch.testing.assert_close(rows, _reference_rows(weights, patches, gelu), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rows.norm(dim=-1), torch.ones(28), atol=1e-6, rtol=0)
    assert [r.shape[0] for r in model.encode_each(patches, GRIDS)] == [24, 4]
    assert not any(p.requires_grad for p in model.parameters())


def test_the_engine_gelu_differs_from_the_exact_one(snapshot, patches):
    exact = MingVision.load(snapshot / "mllm", gelu="exact").encode(patches, GRIDS)
    tanh = MingVision.load(snapshot / "mllm", gelu="tanh").encode(patches, GRIDS)
    assert 0 < (exact - tanh).abs().max() < 1e-2


def test_only_the_shards_with_vision_tensors_are_read(snapshot, weights):
    found = vision_tensors(snapshot)
    assert found.names == sorted(weights)
    assert {p.name for p in found.shards()} == {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"}


def test_a_missing_vision_tensor_is_refused_with_one_sentence(tmp_path, weights):
    lacking = {n: t for n, t in weights.items() if n != "vision.blocks.1.mlp.up_proj.bias"}
    folder = _single_file_mllm(tmp_path / "mllm", lacking)
    with pytest.raises(ModelFileError) as e:
        MingVision.load(folder)
    said = str(e.value)
    assert "model-00001-of-00001.safetensors" in said and "vision.blocks.1.mlp.up_proj.bias" in said
    assert "download" in said and "\n" not in said


def test_an_extra_vision_tensor_is_refused_with_one_sentence(tmp_path, weights):
    folder = _single_file_mllm(tmp_path / "mllm", {**weights, "vision.blocks.2.norm1.weight": torch.ones(32)})
    with pytest.raises(ModelFileError) as e:
        MingVision.load(folder)
    said = str(e.value)
    assert "vision.blocks.2.norm1.weight" in said and "model-00001-of-00001.safetensors" in said and "\n" not in said


def test_a_tensor_of_the_wrong_shape_is_refused(tmp_path, weights):
    folder = _single_file_mllm(tmp_path / "mllm", {**weights, "linear_proj.2.bias": torch.zeros(HIDDEN + 1)})
    with pytest.raises(ModelFileError, match="linear_proj.2.bias"):
        MingVision.load(folder)


def test_patches_of_the_wrong_shape_are_refused(snapshot, patches):
    model = MingVision.load(snapshot)
    with pytest.raises(ValueError, match="pixel_patches"):
        model.encode(patches[:-1], GRIDS)


# ------------------------------------------------------------------ the vision GGUF


def _read(path: Path) -> tuple[dict[str, gguf.ReaderTensor], dict[str, object]]:
    reader = gguf.GGUFReader(path)
    kvs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return {t.name: t for t in reader.tensors}, kvs


@pytest.mark.parametrize("quant", ["f16", "q8_0"])
def test_the_vision_gguf_reads_back_with_the_gguf_package(snapshot, weights, tmp_path, quant):
    path = tmp_path / vision_gguf_name(quant)
    steps: list[tuple[int, int]] = []
    done = export_vision_gguf(snapshot, path, quant, source="inclusionAI/Ming-Image-0.1-Design",
                              progress=lambda n, total: steps.append((n, total)))
    assert not done.skipped and done.tensors == len(weights) and path.name == f"pig_ming_vision-{quant}.gguf"
    assert len(steps) == len(weights) and steps[-1][0] == steps[-1][1] < done.bytes     # one tensor at a time
    tensors, kvs = _read(path)
    assert list(tensors) == sorted(weights)                       # verbatim names, sorted
    assert kvs["general.architecture"] == "pig" and kvs["general.name"] == f"pig_ming_vision-{quant}"
    assert kvs["ming_vision.source"] == "inclusionAI/Ming-Image-0.1-Design" and kvs["ming_vision.quant"] == quant
    for name, t in tensors.items():
        source = weights[name].float().numpy()
        assert [int(n) for n in t.shape] == list(reversed(source.shape)), name
        expected = ("BF16" if name == PATCH_EMBED else "F32" if source.ndim == 1
                    else "Q8_0" if quant == "q8_0" and source.shape[-1] % 32 == 0 else "F16")
        assert t.tensor_type.name == expected, name
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(source.shape)
        if expected == "Q8_0":
            np.testing.assert_allclose(values, source, atol=np.abs(source).max() / 120, rtol=0)
        elif expected == "F16":   # bf16 values are exact in f16 down to its subnormals (steps of 2⁻²⁴)
            np.testing.assert_allclose(values, source, atol=2.0 ** -24, rtol=0)
        else:                     # the bf16 source is exact in BF16 and F32
            np.testing.assert_array_equal(values, source)
    assert [int(n) for n in tensors[PATCH_EMBED].shape] == [14, 14, 2, 3, 32]
    if quant == "q8_0":
        assert tensors["linear_proj.0.weight"].tensor_type.name == "F16"    # 48 columns: not a multiple of 32
        assert tensors["vision.blocks.0.attn.qkv.weight"].tensor_type.name == "Q8_0"


def test_the_check_mirrors_the_engine_and_returns_its_config(snapshot, tmp_path):
    path = export_vision_gguf(snapshot, tmp_path / "v.gguf").path
    config = check_vision_gguf(path, vis_dim=HIDDEN)
    assert (config.layers, config.hidden, config.intermediate, config.out_hidden, config.vis_dim,
            config.patch_size) == (2, 32, 64, 48, HIDDEN, 14)
    with pytest.raises(ModelFileError, match="2048"):
        check_vision_gguf(path, vis_dim=2048)


def _rewrite_without(path: Path, dropped: str, out: Path) -> Path:
    tensors, _ = _read(path)
    writer = gguf.GGUFWriter(out, arch="pig")
    for name, t in tensors.items():
        if name != dropped:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            writer.add_tensor(name, np.ascontiguousarray(values.reshape([int(n) for n in reversed(t.shape)])))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize("dropped", ["vision.merger.ln_q.weight", "linear_proj.2.weight",
                                     "vision.blocks.0.mlp.gate_proj.weight", PATCH_EMBED])
def test_the_check_names_what_the_engine_misses(snapshot, tmp_path, dropped):
    path = export_vision_gguf(snapshot, tmp_path / "v.gguf").path
    with pytest.raises(ModelFileError) as e:
        check_vision_gguf(_rewrite_without(path, dropped, tmp_path / "broken.gguf"))
    assert dropped in str(e.value) and "\n" not in str(e.value)


def test_the_check_wants_every_block_tensor_at_the_engine_shape(snapshot, tmp_path):
    path = export_vision_gguf(snapshot, tmp_path / "v.gguf").path
    tensors, _ = _read(path)
    ne = {n: (tuple(int(d) for d in t.shape), t.tensor_type.name) for n, t in tensors.items()}
    assert vision_gguf_problems(ne) == []
    lacking = {n: v for n, v in ne.items() if n != "vision.blocks.1.attn.qkv.bias"}
    assert "vision.blocks.1.attn.qkv.bias" in vision_gguf_problems(lacking)[0]
    reshaped = {**ne, "vision.blocks.1.attn.proj.weight": ((16, 64), "F16")}
    assert "vision.blocks.1.attn.proj.weight" in vision_gguf_problems(reshaped)[0]
    blocks = [n for n in ne if "blocks.0." not in n and "blocks.1." not in n]
    assert "no tower blocks" in vision_gguf_problems({n: ne[n] for n in blocks})[0]


def test_an_mllm_without_the_tower_is_refused_before_a_file_is_written(tmp_path, weights):
    folder = _single_file_mllm(tmp_path / "mllm", {n: t for n, t in weights.items() if n != "vision.merger.mlp.2.weight"})
    with pytest.raises(ModelFileError, match="vision.merger.mlp.2.weight"):
        export_vision_gguf(folder, tmp_path / "out" / "v.gguf")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_export_is_skipped_while_newer_than_the_weights(snapshot, tmp_path):
    path = tmp_path / "v.gguf"
    assert not export_vision_gguf(snapshot, path).skipped
    stamp = path.stat().st_mtime_ns
    again = export_vision_gguf(snapshot, path)
    assert again.skipped and path.stat().st_mtime_ns == stamp and again.tensors > 0
    assert not export_vision_gguf(snapshot, path, force=True).skipped
    later = path.stat().st_mtime + 10
    shard = snapshot / "mllm" / "model-00003-of-00003.safetensors"        # any model-*.safetensors counts
    old = shard.stat().st_mtime
    try:
        os.utime(shard, (later, later))
        assert not export_vision_gguf(snapshot, path).skipped
    finally:
        os.utime(shard, (old, old))


def test_a_damaged_file_is_written_again_rather_than_skipped(snapshot, tmp_path):
    path = tmp_path / "v.gguf"
    path.write_bytes(b"GGUF not really")
    assert not export_vision_gguf(snapshot, path).skipped
    check_vision_gguf(path)


# ------------------------------------------------------------------ disks that refuse


def _can_mount() -> bool:
    return os.geteuid() == 0 and subprocess.run(["which", "mount"], capture_output=True).returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size, read_only) → a fresh tmpfs folder (unmounted after the test)."""
    if not _can_mount():
        pytest.skip("needs root and mount to give the test a real full or read-only disk")
    mounted: list[Path] = []

    def mount(size: str, read_only: bool = False) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(where)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
        return where
    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_read_only_folder_gives_one_sentence_and_leaves_nothing(snapshot, tmpfs):
    folder = tmpfs("8m", read_only=True)
    with pytest.raises(FolderError) as e:
        export_vision_gguf(snapshot, folder / "pig_ming_vision-f16.gguf")
    said = str(e.value)
    assert "read-only" in said and "pig_ming_vision-f16.gguf" in said and "\n" not in said
    assert list(folder.iterdir()) == []


def test_a_disk_that_fills_up_mid_write_leaves_nothing(snapshot, tmpfs, monkeypatch):
    folder = tmpfs("48k")
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: None)     # no up-front refusal: the write hits ENOSPC
    with pytest.raises(DiskFullError) as e:
        export_vision_gguf(snapshot, folder / "v.gguf")
    assert "v.gguf" in str(e.value) and "\n" not in str(e.value)
    assert list(folder.iterdir()) == []


def test_a_write_that_cannot_fit_is_refused_before_it_starts(snapshot, tmp_path, monkeypatch):
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: 4096)
    with pytest.raises(DiskFullError):
        export_vision_gguf(snapshot, tmp_path / "out" / "v.gguf")
    assert not (tmp_path / "out" / "v.gguf").exists()


def test_an_oserror_of_the_disk_is_one_sentence_where_no_tmpfs_can_be_mounted(snapshot, tmp_path, monkeypatch):
    """The same refusal, injected: runs without root."""
    import tempfile

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(FolderError, match="read-only"):
        export_vision_gguf(snapshot, tmp_path / "v.gguf")
    assert not (tmp_path / "v.gguf").exists()


def test_the_tiny_fixture_is_what_the_real_file_looks_like(weights):
    """Guard for the fixture itself: the tower's tensor names are the real Qwen2.5-VL ones."""
    assert PATCH_EMBED in weights and tuple(weights[PATCH_EMBED].shape) == (32, 3, 2, 14, 14)
    assert "vision.merger.mlp.2.weight" in weights and "vision.blocks.0.mlp.gate_proj.weight" in weights
