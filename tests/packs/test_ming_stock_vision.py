"""A stock llama.cpp Qwen2.5-VL mmproj as a torch tower (packs/ming_image/stock_vision.py): the file has
llama.cpp's names (from the gguf package's own table, the split qkv and patch embedding), reads back
into transformers' tower, gives the tower's merger rows, and bad files are refused with one sentence."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.ming_image.stock_vision import StockVision, read_mmproj, write_mmproj
from trainer_core.packs.ming_image.template import patchify
from trainer_core.packs.ming_image.vision import build_tower

CONFIG = dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=2, out_hidden_size=80, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1, 3], in_channels=3,
              hidden_act="silu")


@pytest.fixture(scope="module")
def tower():
    torch.manual_seed(0)
    t = build_tower(CONFIG, torch.float32)
    with torch.no_grad():
        for p in t.parameters():
            p.normal_(0, 0.05)
    return t


@pytest.fixture(scope="module")
def mmproj(tower, tmp_path_factory):
    return write_mmproj(tmp_path_factory.mktemp("mm") / "mmproj.gguf", tower, n_wa_pattern=2, dtype="f32")


def test_the_file_has_llama_cpp_names(mmproj):
    names = {t.name for t in gguf.GGUFReader(str(mmproj)).tensors}
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1", "v.blk.0.attn_q.weight", "v.blk.0.attn_k.bias",
                 "v.blk.3.attn_v.weight", "v.blk.0.attn_out.weight", "v.blk.0.ln1.weight", "v.blk.0.ln2.weight",
                 "v.blk.0.ffn_gate.weight", "v.blk.0.ffn_up.bias", "v.blk.0.ffn_down.weight", "v.post_ln.weight",
                 "mm.0.weight", "mm.0.bias", "mm.2.weight", "mm.2.bias"):
        assert name in names, name
    assert not any("qkv" in n for n in names)
    config, tensors = read_mmproj(mmproj)
    assert config["fullatt_block_indexes"] == [1, 3] and config["window_size"] == 56
    assert {k: config[k] for k in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size")} == \
        {k: CONFIG[k] for k in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size")}
    assert tensors["v.patch_embd.weight"].shape == (64, 3, 14, 14)


def test_encode_is_the_towers_merger_output(tower, mmproj):
    stock = StockVision.load(mmproj)
    image = np.random.default_rng(1).random((112, 168, 3)).astype(np.float32)
    patches, grid = patchify(image)
    got = stock.encode(torch.from_numpy(patches), [grid])
    reference = build_tower(CONFIG, torch.float32)
    reference.load_state_dict(tower.state_dict())
    reference.merger.mlp[1] = torch.nn.GELU(approximate="tanh")          # the engine's GELU
    with torch.no_grad():
        want = reference(hidden_states=torch.from_numpy(patches), grid_thw=torch.tensor([grid])).pooler_output
    assert got.shape == (24, 80)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_f16_file_reads_back_close(tower, tmp_path):
    path = write_mmproj(tmp_path / "f16.gguf", tower, n_wa_pattern=2, dtype="f16")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["v.blk.0.attn_q.weight"] == "F16" and types["v.blk.0.attn_q.bias"] == "F32"
    a, b = StockVision.load(path), StockVision.load(write_mmproj(tmp_path / "f32.gguf", tower, 2, "f32"))
    patches, grid = patchify(np.full((56, 56, 3), 0.5, np.float32))
    x = torch.from_numpy(patches)
    torch.testing.assert_close(a.encode(x, [grid]), b.encode(x, [grid]), rtol=2e-2, atol=2e-3)


def test_files_that_are_not_a_qwen25vl_mmproj_are_refused(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        read_mmproj(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ModelFileError, match="not a readable GGUF"):
        read_mmproj(tmp_path / "junk.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "other.gguf"), "clip")
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_tensor("mm.0.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="qwen3vl_merger file, not a Qwen2.5-VL mmproj"):
        read_mmproj(tmp_path / "other.gguf")


def test_a_tower_tensor_missing_from_the_file_is_named(tower, tmp_path):
    path = tmp_path / "cut.gguf"
    reader = gguf.GGUFReader(str(write_mmproj(tmp_path / "full.gguf", tower, 2, "f32")))
    w = gguf.GGUFWriter(str(path), "clip")
    for key in ("clip.projector_type",):
        w.add_string(key, "qwen2.5vl_merger")
    w.add_uint32("clip.vision.attention.head_count", 2)
    w.add_uint32("clip.vision.n_wa_pattern", 2)
    for t in reader.tensors:
        if t.name != "v.blk.2.ffn_gate.weight":
            w.add_tensor(t.name, np.array(t.data).reshape(list(reversed(t.shape.tolist()))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match=r"lacks 1 tensor\(s\) of the Qwen2.5-VL tower \(first: v.blk.2.ffn_gate"):
        StockVision.load(path)
