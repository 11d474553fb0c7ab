"""The parts of the engine's reading of an adapter GGUF that every kind shares (engine-contract §0.2–§0.4):
the tensor namespace, the dtype rule, the block layouts, and the check of a file's tensors against the
layout its kind implies. No file I/O and no kind here: each kind module (contract/kinds/) describes its
own tensors with these parts and says how the engine tells it from its marker tensors; `detect_layout`
(contract/kinds/__init__.py) asks them in the engine's order.

Outside `adapter.` the engine reads only what a kind names in its `top_level` (the Ming runner's
`tokenizer_json` and `vis_bridge.*`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["PREFIX", "TOKENIZER_JSON", "VIS_BRIDGE", "LayoutProblem", "dtype_of", "Layout", "ne_reader",
           "depth_of", "check_expected", "RESAMPLER_BLOCK", "TOKEN_BLOCK"]

PREFIX = "adapter."
VIS_BRIDGE = "vis_bridge."          # top level in a Ming adapter: the stock-mmproj bridge (contract/vis_bridge.py)
TOKENIZER_JSON = "tokenizer_json"   # top level, no prefix: the Ling tokenizer.json, one F16 element per byte

Names = Mapping[str, tuple[tuple[int, ...], str]]     # adapter tensor name (no prefix) → (ne, dtype name)


@dataclass(frozen=True)
class LayoutProblem:
    message: str
    fatal: bool = True   # False: the engine runs it, but it is not what gguf-trainer writes


def dtype_of(name: str, ndim: int, f32_names: Iterable[str] = ()) -> str:
    """'f32' or 'f16' for a state_dict tensor (engine-contract §0.3, `_keep_f32`): every 1-D tensor, the
    LayerNorms and the kind's F32 2-D tensors (query banks, a frozen projection) stay f32."""
    if ndim == 1 or name in f32_names or name.startswith("ln_") or ".ln_" in name:
        return "f32"
    return "f16"


_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
RESAMPLER_BLOCK = ("ln_self", "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "ln_q",
                   "ln_kv", "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ln_mlp")
TOKEN_BLOCK = ("ln_self", "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "ln_mlp")


class Layout:
    """An ordered map of tensor name → GGUF ne (= the reversed torch shape), built in state_dict order."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.ne: dict[str, tuple[int, ...]] = {}

    def tensor(self, name: str, *ne: int) -> None:
        self.ne[name] = tuple(ne)

    def linear(self, name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        self.ne[f"{name}.weight"] = (n_in, n_out)
        if bias:
            self.ne[f"{name}.bias"] = (n_out,)

    def norm(self, name: str) -> None:
        self.ne[f"{name}.weight"] = (self.width,)
        self.ne[f"{name}.bias"] = (self.width,)

    def blocks(self, depth: int, parts: tuple[str, ...], mlp: int) -> None:
        W = self.width
        for i in range(depth):
            for part in parts:
                if part.startswith("ln_"):
                    self.norm(f"blocks.{i}.{part}")
                else:
                    self.linear(f"blocks.{i}.{part}", W, W)
            self.linear(f"blocks.{i}.mlp.0", W, mlp)
            self.linear(f"blocks.{i}.mlp.2", mlp, W)


def ne_reader(names: Names) -> Callable[[str], tuple[int, ...] | None]:
    """name → its ne as a tuple, None when the file lacks it."""
    def ne(name: str) -> tuple[int, ...] | None:
        v = names.get(name)
        return tuple(v[0]) if v else None
    return ne


def depth_of(names: Names) -> int:
    """The block count the engine reads: one past the highest `blocks.<i>.` index."""
    return 1 + max((int(m.group(1)) for n in names if (m := _BLOCK.match(n))), default=-1)


def check_expected(config: Any, expected: Mapping[str, tuple[int, ...]], names: Names,
                   problems: list[LayoutProblem], f32_names: Iterable[str] = (),
                   ignored: set[str] | frozenset[str] = frozenset()) -> tuple[Any, list[LayoutProblem]]:
    """Every tensor the config implies (`expected`), with its ne and dtype; nothing else (but the `ignored`
    tensors, already reported as ones the engine skips). The config when nothing is fatal, else None."""
    f32_names = frozenset(f32_names)
    for name, want in expected.items():
        got = names.get(name)
        if got is None:
            problems.append(LayoutProblem(f"adapter.{name} is missing (expected ne {list(want)})"))
        elif tuple(got[0]) != want and not (name == "layer_map" and tuple(got[0])[:1] == want):
            problems.append(LayoutProblem(f"adapter.{name} has ne {list(got[0])} but the rest of the file "
                                          f"implies {list(want)}"))
        else:
            want_dtype = dtype_of(name, len(want), f32_names).upper()
            if got[1] != want_dtype:
                problems.append(LayoutProblem(f"adapter.{name} is {got[1]}; gguf-trainer writes {want_dtype}",
                                              fatal=got[1] not in ("F32", "F16")))
    for name in names:
        if name not in expected and name not in ignored:
            problems.append(LayoutProblem(f"adapter.{name} is not part of a {config.kind} adapter; the "
                                          f"engine would ignore it"))
    if any(p.fatal for p in problems):
        return None, problems
    return config, problems
