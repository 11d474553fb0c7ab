"""The ming_image adapter kind: its GGUF as the engine reads it (llm_adapter.hpp MingAdapter,
packs-contract-more D.1 §5), the fold of its two heads, the embedded Ling tokenizer, and the
engine's output [pad(caption rows, out_dim) ; direct rows] against a numpy forward from the file."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from numpy_adapters import gguf_tensors, ming_forward
from trainer_core.base.errors import ModelFileError
from trainer_core.contract.kinds import AdapterConfig, build_adapter, detect_layout, expected_tensor_count
from trainer_core.contract.gguf_io import (Provenance, read_adapter_gguf, read_gguf_kvs, read_gguf_tensors,
                                          write_adapter_gguf)

IN, W, OUT, N_CAP, CAP, SLOTS, VOCAB, RANK, VIS = 32, 64, 48, 6, 40, 20, 300, 8, 24
TOKENIZER = b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": []}'


def config(**overrides) -> AdapterConfig:
    args = dict(kind="ming_image", in_dim=IN, out_dim=OUT, width=W, depth=2, n_bank=N_CAP, bank_dim=CAP,
                max_slots=SLOTS, seed_vocab=VOCAB, seed_rank=RANK, vis_dim=VIS)
    return AdapterConfig(**{**args, **overrides})


def tokenizer_tensor(data: bytes = TOKENIZER) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype(np.float16)


def stats(dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(dim, generator=g), torch.rand(dim, generator=g) + 0.5


def write(path, model, cfg, **kwargs):
    mu, sigma = stats(OUT, 1)
    cap_mu, cap_sigma = stats(CAP, 2)
    args = dict(name="ming", pack="ming_image", provenance=Provenance(10, 10, "best"), mu=mu, sigma=sigma,
                bank_mu=cap_mu, bank_sigma=cap_sigma, extra={"tokenizer_json": tokenizer_tensor()})
    write_adapter_gguf(path, model, cfg, **{**args, **kwargs})
    return (mu, sigma), (cap_mu, cap_sigma)


def test_the_file_has_the_engine_names_dtypes_kvs_and_the_tokenizer_bytes(tmp_path):
    cfg = config()
    torch.manual_seed(0)
    model = build_adapter(cfg)
    path = tmp_path / "pig_ming_adapter-f16.gguf"
    write(path, model, cfg)
    reader = gguf.GGUFReader(str(path))
    names = [t.name for t in reader.tensors]
    assert names[0] == "adapter.cap_query" and names[-1] == "tokenizer_json"
    assert len(names) == expected_tensor_count(cfg) + 1
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["adapter.cap_query"] == types["adapter.slot_query"] == "F32"
    assert types["adapter.seed_embed.weight"] == types["adapter.out_cap.weight"] == "F16"
    assert types["adapter.out_cap.bias"] == "F32" and types["tokenizer_json"] == "F16"
    tok = next(t for t in reader.tensors if t.name == "tokenizer_json")
    assert bytes(np.asarray(tok.data).astype(np.uint8)) == TOKENIZER            # exact: 0…255 are f16 integers
    kvs = read_gguf_kvs(path)
    assert kvs["adapter.kind"] == "ming_image" and kvs["adapter.n_cap"] == N_CAP and kvs["adapter.cap_dim"] == CAP
    assert (kvs["adapter.max_slots"], kvs["adapter.seed_rank"], kvs["adapter.seed_vocab"], kvs["adapter.vis_dim"]) \
        == (SLOTS, RANK, VOCAB, VIS)
    keys = list(kvs)
    assert keys.index("adapter.kind") < keys.index("adapter.n_cap") < keys.index("adapter.vis_dim")


def test_export_refuses_a_ming_adapter_without_the_ling_tokenizer(tmp_path):
    cfg = config()
    path = tmp_path / "a.gguf"
    with pytest.raises(ModelFileError, match="Ling tokenizer"):
        write(path, build_adapter(cfg), cfg, extra={})
    assert not path.exists()


def test_the_layout_reads_every_size_from_shapes_as_the_engine_does(tmp_path):
    cfg = config(depth=3, max_slots=33)
    path = tmp_path / "a.gguf"
    write(path, build_adapter(cfg), cfg)
    found = read_adapter_gguf(path)
    assert found.config == cfg and not [p for p in found.problems if p.fatal]
    # without out_cap the engine would run with its default cap_dim: refused
    shapes = {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name) for t in gguf.GGUFReader(str(path)).tensors}
    shapes.pop("adapter.out_cap.weight")
    none, problems = detect_layout(shapes)
    assert none is None and "out_cap" in problems[0].message
    # an adapter of another kind does not carry a tokenizer_json the engine would read
    plain = {k: v for k, v in shapes.items() if k != "tokenizer_json"}
    plain["adapter.out_cap.weight"] = ((W, CAP), "F16")
    ok, problems = detect_layout(plain)
    assert ok == cfg and any("tokenizer_json" in p.message and not p.fatal for p in problems)


def test_out_dim_must_hold_the_padded_caption_rows():
    with pytest.raises(ValueError, match="at least cap_dim"):
        config(out_dim=CAP - 1)


@pytest.mark.parametrize("with_image", [False, True])
def test_the_folded_file_gives_the_engine_output_at_teacher_scale(with_image, tmp_path):
    """The engine's rows from the file = the checkpoint model's standardized heads, de-standardized by
    each head's own statistics (caption: cap μ/σ, direct: μ/σ), the caption rows zero-padded."""
    cfg = config()
    torch.manual_seed(5)
    model = build_adapter(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path / "a.gguf"
    (mu, sigma), (cap_mu, cap_sigma) = write(path, model, cfg)
    g = torch.Generator().manual_seed(6)
    h, ids = torch.randn(7, IN, generator=g), torch.randint(0, VOCAB, (11,), generator=g)
    vis = torch.nn.functional.normalize(torch.randn(4, VIS, generator=g), dim=-1) if with_image else None
    start = 3 if with_image else -1
    vis_slot = torch.zeros(1, 11, VIS)
    if with_image:
        vis_slot[0, start:start + 4] = vis
    with torch.no_grad():
        cap, direct = model(h[None], seed_ids=ids[None], vis_slot=vis_slot if with_image else None,
                            vis_kv=vis[None] if with_image else None)
    want_cap = cap[0].double() * cap_sigma.double() + cap_mu.double()
    want_dir = direct[0].double() * sigma.double() + mu.double()
    got = ming_forward(gguf_tensors(path), h.numpy(), ids.tolist(), None if vis is None else vis.numpy(), start)
    assert got.shape == (N_CAP + 11, OUT)
    assert np.abs(got[N_CAP:] - want_dir.numpy()).max() < 2e-2 * np.abs(want_dir.numpy()).max()
    assert np.abs(got[:N_CAP, :CAP] - want_cap.numpy()).max() < 2e-2 * np.abs(want_cap.numpy()).max()
    assert not got[:N_CAP, CAP:].any()
    # and the torch model rebuilt from the file is the numpy engine, to f16 rounding of nothing: same weights
    back = read_adapter_gguf(path).model
    with torch.no_grad():
        cap2, dir2 = back(h[None], seed_ids=ids[None], vis_slot=vis_slot if with_image else None,
                          vis_kv=vis[None] if with_image else None)
    np.testing.assert_allclose(dir2[0].double().numpy(), got[N_CAP:], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(cap2[0].double().numpy(), got[:N_CAP, :CAP], atol=1e-4, rtol=1e-4)


def test_a_vis_bridge_rides_beside_the_adapter_and_a_misfit_one_is_refused(tmp_path):
    """vis_bridge.* is read by the engine for Ming only; its rows must be the adapter's vis_dim wide."""
    from trainer_core.contract.vis_bridge import BridgeConfig, VisBridge, bridge_tensors
    cfg = config()
    model = build_adapter(cfg)

    def bridge(out_dim):
        tensors = bridge_tensors(VisBridge(BridgeConfig(in_dim=40, out_dim=out_dim, width=64, depth=1,
                                                        mlp_hidden=128)))
        return {n: t.numpy().astype(np.float16 if t.ndim == 2 else np.float32) for n, t in tensors.items()}
    good = tmp_path / "good.gguf"
    write(good, model, cfg, extra={"tokenizer_json": tokenizer_tensor(), **bridge(VIS)})
    found, problems = detect_layout({n: (t.shape_ne, t.dtype) for n, t in read_gguf_tensors(good).items()})
    assert found == cfg and problems == []
    with pytest.raises(ModelFileError, match="unbridged"):
        write(tmp_path / "bad.gguf", model, cfg, extra={"tokenizer_json": tokenizer_tensor(), **bridge(VIS + 8)})
    assert not (tmp_path / "bad.gguf").exists()
    cut = bridge(VIS)
    del cut["vis_bridge.blocks.0.mlp.2.bias"]
    with pytest.raises(ModelFileError, match="mlp.2.bias is missing"):
        write(tmp_path / "cut.gguf", model, cfg, extra={"tokenizer_json": tokenizer_tensor(), **cut})
