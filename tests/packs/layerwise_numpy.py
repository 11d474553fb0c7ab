"""An independent numpy reading of a token_aligned_layerwise adapter GGUF (packs-contract-more §D.3 5).

Written from the contract, not from trainer_core: the tensors come straight from gguf.GGUFReader
(F16/F32 as stored, torch order = reversed ne) and the forward is computed in float64:

    x = in_proj(h); per block: x += o(attn(ln_self(x))) (bidirectional, no mask, head_dim 64,
    scale 1/8); x += mlp.2(gelu_erf(mlp.0(ln_mlp(x)))); out = out_proj(ln_out(x)) + skip(h)

LayerNorm eps 1e-5. The engine runs one unpadded sample, batch 1, with no mask.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

LN_EPS = 1e-5
HEAD_DIM = 64
PREFIX = "adapter."


def gguf_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """name (without "adapter.") → float64 array in torch order, straight from gguf.GGUFReader."""
    import gguf
    reader = gguf.GGUFReader(str(path), "r")
    out = {}
    for t in reader.tensors:
        assert t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16), t.name
        shape = tuple(int(n) for n in reversed(list(t.shape)))
        out[t.name[len(PREFIX):] if t.name.startswith(PREFIX) else t.name] = (
            np.asarray(t.data, dtype=np.float64).reshape(shape).copy())
    return out


def _linear(w: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def _layer_norm(w: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * w[f"{name}.weight"] + w[f"{name}.bias"]


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _attention(w: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    L, width = x.shape
    heads = width // HEAD_DIM
    q, k, v = (_linear(w, f"{name}.{p}", x).reshape(L, heads, HEAD_DIM).transpose(1, 0, 2) for p in "qkv")
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(HEAD_DIM)                     # [H, L, L]
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    out = (p @ v).transpose(1, 0, 2).reshape(L, width)
    return _linear(w, f"{name}.o", out)


def layerwise_forward(w: dict[str, np.ndarray], h: np.ndarray) -> np.ndarray:
    """[L, in_dim] student rows → [L, n_taps · layer_dim] with the file's tensors `w` (gguf_tensors)."""
    h = np.asarray(h, dtype=np.float64)
    depth = 1 + max(int(m.group(1)) for n in w if (m := re.match(r"^blocks\.(\d+)\.", n)))
    x = _linear(w, "in_proj", h)
    for i in range(depth):
        b = f"blocks.{i}"
        x = x + _attention(w, f"{b}.self_attn", _layer_norm(w, f"{b}.ln_self", x))
        x = x + _linear(w, f"{b}.mlp.2", _gelu(_linear(w, f"{b}.mlp.0", _layer_norm(w, f"{b}.ln_mlp", x))))
    return _linear(w, "out_proj", _layer_norm(w, "ln_out", x)) + _linear(w, "skip", h)


def infer_prompt_matches_numpy(project, pack, weights: dict[str, np.ndarray], where, prompt: str) -> np.ndarray:
    """`gguf-trainer infer --prompt` on the project's export equals this module's forward of the student's rows
    as the pack hands them to the adapter (no pads: one row per template token); returns those rows."""
    from conftest import cli
    from trainer_core.contract.student import load_student
    materials = project.materials_dir
    student, tokenizer = materials / "pig_clip-demo-f16.gguf", materials / "pig-clip-tokenizer"
    r = cli("infer", "--adapter", str(project.gguf_path()), "--student", str(student), "--tokenizer",
            str(tokenizer), "--pack", pack.id, "--prompt", prompt, "--out", str(where / "P.npy"))
    assert r.returncode == 0, r.stdout + r.stderr
    st = load_student(student, tokenizer)
    rows = pack.student_states(st, prompt)
    assert rows.shape[0] == len(st.ids(pack.student_chunks(prompt)))
    np.testing.assert_allclose(np.load(where / "P.npy"), layerwise_forward(weights, rows), atol=1e-4, rtol=1e-5)
    return rows
