"""The engine's vis_bridge (trainer_core/packs/ming_image/vis_bridge.py) against numpy transcriptions
of ming_image_te.hpp's MingVisionBridge and llm_adapter.hpp's TokenBlock."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer_core.contract.vis_bridge import (PREFIX, BridgeConfig, VisBridge, bridge_tensors, detect_bridge,
                                                      pos2d)


def _pos2d_numpy(grid_h: int, grid_w: int, width: int) -> np.ndarray:
    """MingVisionBridge::pos2d, loop for loop."""
    n = width // 4
    freq = [math.exp(-math.log(10000.0) * i / n) for i in range(n)]
    pe = np.zeros((grid_h * grid_w, width), dtype=np.float32)
    for y in range(grid_h):
        for x in range(grid_w):
            row = pe[y * grid_w + x]
            for i, w in enumerate(freq):
                row[i], row[n + i] = math.sin(y * w), math.cos(y * w)
                row[2 * n + i], row[3 * n + i] = math.sin(x * w), math.cos(x * w)
    return pe


@pytest.mark.parametrize("grid", [(3, 5), (1, 1), (24, 24)])
def test_pos2d_is_the_engine_code(grid):
    np.testing.assert_allclose(pos2d(*grid, 128).numpy(), _pos2d_numpy(*grid, 128), atol=1e-7, rtol=0)


def test_pos2d_rows_are_raster_order():
    pe = pos2d(2, 3, 16)
    n = 4
    assert torch.equal(pe[1, 2 * n:3 * n], torch.sin(torch.exp(-math.log(1e4) * torch.arange(n) / n)))   # y 0, x 1
    assert torch.equal(pe[3, :n], pe[4, :n]) and not torch.equal(pe[3, :n], pe[0, :n])                   # y 1


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_erf = np.vectorize(math.erf)


def _bridge_numpy(s: dict[str, np.ndarray], x: np.ndarray, grid: tuple[int, int], depth: int, width: int) -> np.ndarray:
    """h = inp(x) + pos2d; TokenBlocks (pre-LN MHA over 64-wide heads, exact GELU MLP); ln_out; out; l2."""
    lin = lambda v, name: v @ s[name + ".weight"].T + s[name + ".bias"]     # noqa: E731
    heads = width // 64
    h = lin(x, "inp") + _pos2d_numpy(*grid, width)
    for i in range(depth):
        p = f"blocks.{i}."
        a = _layer_norm(h, s[p + "ln_self.weight"], s[p + "ln_self.bias"])
        q, k, v = (lin(a, p + f"self_attn.{n}").reshape(len(a), heads, 64).transpose(1, 0, 2) for n in "qkv")
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(64)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        att = (scores / scores.sum(-1, keepdims=True)) @ v                    # [heads, V, 64]
        h = h + lin(att.transpose(1, 0, 2).reshape(len(a), width), p + "self_attn.o")
        m = lin(_layer_norm(h, s[p + "ln_mlp.weight"], s[p + "ln_mlp.bias"]), p + "mlp.0")
        h = h + lin(0.5 * m * (1 + _erf(m / math.sqrt(2))), p + "mlp.2")
    y = lin(_layer_norm(h, s["ln_out.weight"], s["ln_out.bias"]), "out")
    return y / np.sqrt(np.maximum((y ** 2).sum(-1, keepdims=True), 1e-12))


@pytest.fixture
def bridge() -> VisBridge:
    torch.manual_seed(3)
    model = VisBridge(BridgeConfig(in_dim=40, out_dim=24, width=128, depth=2, mlp_hidden=96)).eval()
    with torch.no_grad():
        for p in model.parameters():          # move the norms and biases off their defaults
            p.add_(0.05 * torch.randn_like(p))
    return model


def test_the_forward_equals_the_engine_transcription(bridge):
    grid = (3, 5)
    x = torch.randn(15, 40)
    state = {n: t.double().numpy() for n, t in bridge.state_dict().items()}
    with torch.no_grad():
        out = bridge(x, *grid)
    expected = _bridge_numpy(state, x.double().numpy(), grid, depth=2, width=128)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(15), atol=1e-6, rtol=0)
    with torch.no_grad():                     # a batch of same-grid images is the same as one at a time
        batch = bridge(torch.stack([x, x.flip(0)]), *grid)
    torch.testing.assert_close(batch[0], out)


def test_the_names_and_ne_are_what_the_engine_detects(bridge):
    tensors = bridge_tensors(bridge)
    assert all(n.startswith(PREFIX) for n in tensors)
    assert {"vis_bridge.inp.weight", "vis_bridge.inp.bias", "vis_bridge.ln_out.weight", "vis_bridge.out.bias",
            "vis_bridge.blocks.1.self_attn.o.bias", "vis_bridge.blocks.0.mlp.2.weight",
            "vis_bridge.blocks.0.ln_mlp.bias"} <= set(tensors)
    assert len(tensors) == 4 + 2 + 2 * 16
    ne = {n: tuple(reversed(t.shape)) for n, t in tensors.items()}
    assert ne["vis_bridge.inp.weight"] == (40, 128) and ne["vis_bridge.out.weight"] == (128, 24)
    assert detect_bridge(ne) == bridge.config and bridge.config.heads == 2
    assert detect_bridge({n: v for n, v in ne.items() if n != "vis_bridge.out.weight"}) is None


def test_a_width_the_engine_cannot_split_into_64_wide_heads_is_refused():
    with pytest.raises(ValueError, match="64"):
        VisBridge(BridgeConfig(width=96))
