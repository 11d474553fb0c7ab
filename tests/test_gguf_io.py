"""Adapter GGUFs: the engine layout, the fold, read-back, and an engine forward in numpy."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from trainer_core.contract.kinds import AdapterConfig, build_adapter
from trainer_core.base.errors import ModelFileError
from trainer_core.contract.gguf_io import Provenance, read_adapter_gguf, write_adapter_gguf

IN, OUT, VIS, W = 64, 96, 80, 128
CONFIGS = {
    "resampler": AdapterConfig("resampler", IN, OUT, W, 2, num_queries=8),
    "seeded_resampler": AdapterConfig("seeded_resampler", IN, OUT, W, 2, num_queries=8, seed_vocab=50),
    "token_aligned_vision": AdapterConfig("token_aligned_vision", IN, OUT, W, 2, vis_dim=VIS),
}
PROV = Provenance(trained_steps=1200, planned_steps=20000, checkpoint="best", snapshot=False,
                  val_cos=0.93, best_val_cos=0.94)
PACK_KVS = {"adapter.teacher": "some/teacher", "adapter.t5_vocab": 50, "adapter.teacher_deepstack": True}


def random_adapter(config: AdapterConfig, seed: int = 0) -> torch.nn.Module:
    """Non-trivial weights everywhere: LayerNorms and zero-initialised tensors perturbed too."""
    torch.manual_seed(seed)
    model = build_adapter(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.add_(1.0)
    return model


def stats(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(OUT, generator=g) * 3, torch.rand(OUT, generator=g) * 2 + 0.03


def export(tmp_path: Path, kind: str, model=None) -> tuple[Path, torch.nn.Module, dict]:
    config = CONFIGS[kind]
    model = model or random_adapter(config)
    fold = dict(zip(("mu", "sigma"), stats())) if config.spec.standardized else {}
    path = write_adapter_gguf(tmp_path / f"pig_{kind}-f16.gguf", model, config, name="pig_test",
                              pack="test_pack", provenance=PROV, pack_kvs=PACK_KVS, **fold)
    return path, model, fold


def inputs(kind: str, seed: int = 9):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(1, 11, IN, generator=g)
    extra = {}
    if kind == "seeded_resampler":
        extra["seed_ids"] = torch.tensor([[5, 17, 3, 1, 0, 0, 0, 0]])
    if kind == "token_aligned_vision":
        vis = torch.zeros(1, 11, VIS)
        vis[0, 2:6] = torch.randn(4, VIS, generator=g)
        extra["vis"] = vis
    return h, extra


def f16_rounded(model: torch.nn.Module, fold: dict) -> torch.nn.Module:
    """The torch model with exactly the weights the file holds: folded in f32, 2-D cast to f16."""
    from trainer_core.contract.gguf_io import fold_standardization
    from trainer_core.contract.kinds import gguf_dtype
    c = model.config
    state = (fold_standardization(model.state_dict(), **fold, bank_head=c.spec.bank_head(c)) if fold
             else model.state_dict())
    rounded = {k: v.to(torch.float16).to(torch.float32) if gguf_dtype(k, v.ndim) == "f16" else v.clone()
               for k, v in state.items()}
    clone = build_adapter(model.config).eval()
    clone.load_state_dict(rounded)
    return clone


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_export_read_back_gives_the_torch_outputs(kind, tmp_path):
    path, model, fold = export(tmp_path, kind)
    loaded = read_adapter_gguf(path)
    assert loaded.config == CONFIGS[kind] and loaded.problems == []
    h, extra = inputs(kind)
    with torch.no_grad():
        got = loaded.model(h, None, **extra)
        want = f16_rounded(model, fold)(h, None, **extra)
        exact = model(h, None, **extra)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # identical up to the f16 weights
    if fold:
        exact = exact * fold["sigma"] + fold["mu"]
    cos = torch.nn.functional.cosine_similarity(got.flatten(), exact.flatten(), dim=0)
    assert cos > 0.9999


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_file_layout_pinned_against_the_contract(kind, tmp_path):
    path, model, _ = export(tmp_path, kind)
    reader = gguf.GGUFReader(path)
    assert reader.fields["GGUF.version"].parts[-1][0] == 3
    assert "general.alignment" not in reader.fields and reader.alignment == 32
    f32_2d = {"query", "vision_proj.weight"}
    torch_state = model.state_dict()
    assert [t.name for t in reader.tensors] == ["adapter." + n for n in torch_state]
    for t in reader.tensors:
        name = t.name[len("adapter."):]
        torch_shape = tuple(torch_state[name].shape)
        assert tuple(int(x) for x in t.shape) == tuple(reversed(torch_shape)), name  # ne = reversed
        is_norm = ".ln_" in name or name.startswith("ln_")
        want = "F32" if len(torch_shape) == 1 or is_norm or name in f32_2d else "F16"
        assert t.tensor_type.name == want, name
    if kind == "seeded_resampler":
        assert reader.get_tensor(1).name == "adapter.t5_embed.weight"
        assert reader.get_tensor(1).tensor_type.name == "F16"
    if kind == "token_aligned_vision":
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["adapter.vis_in.weight"] == "F16" and types["adapter.vision_proj.weight"] == "F32"
        assert "adapter.query" not in types

    V = gguf.GGUFValueType
    want_kvs = {
        "general.architecture": (V.STRING, "pig"), "general.name": (V.STRING, "pig_test"),
        "adapter.in_dim": (V.UINT32, IN), "adapter.out_dim": (V.UINT32, OUT),
        "adapter.width": (V.UINT32, W), "adapter.depth": (V.UINT32, 2), "adapter.heads": (V.UINT32, 2),
        "adapter.trained_steps": (V.UINT32, 1200), "adapter.planned_steps": (V.UINT32, 20000),
        "adapter.checkpoint": (V.STRING, "best"), "adapter.snapshot": (V.BOOL, False),
        "adapter.val_cos": (V.FLOAT32, 0.93), "adapter.best_val_cos": (V.FLOAT32, 0.94),
        "adapter.pack": (V.STRING, "test_pack"), "adapter.trainer": (V.STRING, "gguf-trainer"),
        "adapter.teacher": (V.STRING, "some/teacher"), "adapter.t5_vocab": (V.UINT32, 50),
        "adapter.teacher_deepstack": (V.BOOL, True),
    }
    if kind == "token_aligned_vision":
        want_kvs["adapter.vis_dim"] = (V.UINT32, VIS)
    else:
        want_kvs["adapter.num_queries"] = (V.UINT32, 8)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(fields) == set(want_kvs)
    for key, (vtype, value) in want_kvs.items():
        f = fields[key]
        assert f.types == [vtype], key
        got = bytes(f.parts[f.data[0]]).decode() if vtype == V.STRING else f.parts[f.data[0]][0].item()
        assert got == pytest.approx(value) if vtype == V.FLOAT32 else got == value, key
    assert "adapter.kind" not in fields


def test_optional_provenance_kvs_are_left_out_when_unknown(tmp_path):
    config = CONFIGS["seeded_resampler"]
    prov = Provenance(10, 20, "last", snapshot=True, val_cos=float("nan"), best_val_cos=-1.0)
    path = write_adapter_gguf(tmp_path / "a.gguf", random_adapter(config), config, name="n", pack="p",
                              provenance=prov)
    kvs = read_adapter_gguf(path).kvs
    assert "adapter.val_cos" not in kvs and "adapter.best_val_cos" not in kvs
    assert kvs["adapter.snapshot"] is True and kvs["adapter.checkpoint"] == "last"


# ------------------------------------------------------------------ the engine, in numpy

def _np_tensors(path: Path) -> dict[str, np.ndarray]:
    """The file's tensors as the engine holds them, read with the gguf package alone."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        out[t.name[len("adapter."):]] = np.asarray(t.data, dtype=np.float64).reshape(
            tuple(reversed([int(x) for x in t.shape])))
    return out


_erf = np.vectorize(math.erf)


def _ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def _linear(T, name, x):
    y = x @ T[f"{name}.weight"].T
    return y + T[f"{name}.bias"] if f"{name}.bias" in T else y


def _attn(T, name, x, kv):
    q, k, v = (_linear(T, f"{name}.{p}", a) for p, a in (("q", x), ("k", kv), ("v", kv)))
    heads = []
    for h in range(q.shape[-1] // 64):
        sl = slice(64 * h, 64 * h + 64)
        s = q[:, sl] @ k[:, sl].T / 8.0
        s = np.exp(s - s.max(-1, keepdims=True))
        heads.append((s / s.sum(-1, keepdims=True)) @ v[:, sl])
    return _linear(T, f"{name}.o", np.concatenate(heads, -1))


def _mlp(T, name, x):
    y = _linear(T, f"{name}.0", x)
    return _linear(T, f"{name}.2", 0.5 * y * (1 + _erf(y / math.sqrt(2))))


def engine_forward(T: dict[str, np.ndarray], h: np.ndarray, t5_ids=None, vis=None) -> np.ndarray:
    """What ggk's AdapterRunner computes, decided from tensor names and shapes only."""
    depth = 1 + max(int(n.split(".")[1]) for n in T if n.startswith("blocks."))
    if "query" in T:                                     # resampler family
        kv = _linear(T, "in_proj", h)
        q = T["query"].copy()
        if "t5_embed.weight" in T:
            q = q + T["t5_embed.weight"][np.asarray(t5_ids)]
        for i in range(depth):
            b = f"blocks.{i}"
            x = _ln(q, T[f"{b}.ln_self.weight"], T[f"{b}.ln_self.bias"])
            q = q + _attn(T, f"{b}.self_attn", x, x)
            q = q + _attn(T, f"{b}.cross_attn", _ln(q, T[f"{b}.ln_q.weight"], T[f"{b}.ln_q.bias"]),
                          _ln(kv, T[f"{b}.ln_kv.weight"], T[f"{b}.ln_kv.bias"]))
            q = q + _mlp(T, f"{b}.mlp", _ln(q, T[f"{b}.ln_mlp.weight"], T[f"{b}.ln_mlp.bias"]))
        return _linear(T, "out_proj", _ln(q, T["ln_out.weight"], T["ln_out.bias"]))
    x = _linear(T, "in_proj", h)                         # token-aligned
    if "vis_in.weight" in T and vis is not None:
        x = x + vis @ T["vis_in.weight"].T
    for i in range(depth):
        b = f"blocks.{i}"
        a = _ln(x, T[f"{b}.ln_self.weight"], T[f"{b}.ln_self.bias"])
        x = x + _attn(T, f"{b}.self_attn", a, a)
        x = x + _mlp(T, f"{b}.mlp", _ln(x, T[f"{b}.ln_mlp.weight"], T[f"{b}.ln_mlp.bias"]))
    out = _linear(T, "out_proj", _ln(x, T["ln_out.weight"], T["ln_out.bias"]))
    return out + _linear(T, "skip", h) if "skip.weight" in T else out


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_numpy_engine_forward_from_the_gguf_alone(kind, tmp_path):
    path, model, fold = export(tmp_path, kind)
    h, extra = inputs(kind)
    T = _np_tensors(path)
    got = engine_forward(T, h[0].double().numpy(), t5_ids=extra.get("seed_ids", [[None]])[0],
                         vis=extra["vis"][0].double().numpy() if "vis" in extra else None)
    with torch.no_grad():
        want = f16_rounded(model, fold)(h, None, **extra)[0].double().numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


def test_fold_gives_teacher_scale_rows(tmp_path):
    path, model, fold = export(tmp_path, "resampler")
    h, _ = inputs("resampler")
    with torch.no_grad():
        pred_std = model(h)                                           # what training optimises
        teacher_scale = pred_std * fold["sigma"] + fold["mu"]          # pred_std·σ_f + μ
        exported = read_adapter_gguf(path).model(h)
    err = (exported - teacher_scale).abs().max() / teacher_scale.abs().max()
    assert err < 2e-3  # f16 weights
    T = _np_tensors(path)
    W = model.state_dict()["out_proj.weight"].double().numpy()
    np.testing.assert_allclose(T["out_proj.weight"], (fold["sigma"].double().numpy()[:, None] * W),
                               rtol=1e-3, atol=1e-4)  # row i scaled by σ_f[i], then f16
    b = model.state_dict()["out_proj.bias"].double().numpy()
    np.testing.assert_allclose(T["out_proj.bias"], fold["sigma"].numpy() * b + fold["mu"].numpy(),
                               rtol=1e-6, atol=1e-6)  # f32: exact


def test_fold_is_required_exactly_for_standardized_kinds(tmp_path):
    mu, sigma = stats()
    with pytest.raises(ValueError):
        write_adapter_gguf(tmp_path / "a.gguf", random_adapter(CONFIGS["resampler"]), CONFIGS["resampler"],
                           name="n", pack="p", provenance=PROV)
    with pytest.raises(ValueError):
        write_adapter_gguf(tmp_path / "b.gguf", random_adapter(CONFIGS["seeded_resampler"]),
                           CONFIGS["seeded_resampler"], name="n", pack="p", provenance=PROV, mu=mu, sigma=sigma)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ refusing what the engine would misread

def _write_raw(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    w = gguf.GGUFWriter(path, arch="pig")
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _state_arrays(kind: str) -> dict[str, np.ndarray]:
    model = random_adapter(CONFIGS[kind])
    return {"adapter." + k: v.numpy().astype(np.float32) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update({"adapter.query": np.zeros((8, W), np.float32)}),
     "adapter.query makes the engine run this file as a resampler, but adapter.skip.weight"),
    (lambda t: t.pop("adapter.blocks.1.mlp.2.bias"), "adapter.blocks.1.mlp.2.bias is missing"),
    (lambda t: t.update({"adapter.out_proj.bias": np.zeros(OUT + 1, np.float32)}), "adapter.out_proj.bias has ne [97]"),
    (lambda t: t.update({"adapter.cap_query": np.zeros((4, W), np.float32)}), "adapter.cap_query makes the engine run this file with its Ming runner, which ignores "
     "adapter.vision_proj.weight"),
    (lambda t: t.update({"adapter.extra.weight": np.zeros((4, 4), np.float32)}), "adapter.extra.weight is not part of a token_aligned_vision adapter"),
    (lambda t: t.update({"adapter.t5_embed.weight": np.zeros((50, W), np.float32)}), "adapter.t5_embed.weight without adapter.query"),
    (lambda t: t.pop("adapter.in_proj.weight"), "adapter.in_proj.weight (2-D) is missing"),
], ids=["query-in-token-aligned", "missing-block-tensor", "shape", "foreign-kind", "extra", "seed-without-query",
        "no-in-proj"])
def test_layouts_the_engine_would_misread_are_refused(edit, message, tmp_path):
    tensors = _state_arrays("token_aligned_vision")
    edit(tensors)
    path = _write_raw(tmp_path / "bad.gguf", tensors)
    with pytest.raises(ModelFileError) as info:
        read_adapter_gguf(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_not_a_gguf_and_truncated_files(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        read_adapter_gguf(text)
    path, _, _ = export(tmp_path, "token_aligned_vision")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-5000])
    with pytest.raises(ModelFileError, match="truncated"):
        read_adapter_gguf(cut)
    with pytest.raises(ModelFileError, match="does not exist"):
        read_adapter_gguf(tmp_path / "missing.gguf")


def test_failed_export_leaves_the_previous_file_and_no_temp(tmp_path, monkeypatch):
    path, _, _ = export(tmp_path, "seeded_resampler")
    before = path.read_bytes()
    import trainer_core.contract.gguf_io as gio

    def broken_verify(*args, **kwargs):
        raise ModelFileError("read-back failed")
    monkeypatch.setattr(gio, "_verify", broken_verify)
    with pytest.raises(ModelFileError):
        export(tmp_path, "seeded_resampler", random_adapter(CONFIGS["seeded_resampler"], seed=7))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
