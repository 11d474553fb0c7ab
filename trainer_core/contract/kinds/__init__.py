"""The adapter kinds: one module each in this folder, found without a list (every module here that
defines `KIND`, plus any a distribution declares in the `gguf_trainer.kinds` entry-point group), and
what the rest of the code asks of an adapter without knowing its kind:

    get_kind(name)                  the kind object (contract/kinds/base.py: AdapterKind)
    detect_layout(tensors)          the config the engine reads from a file's tensors, and what is wrong
    expected_ne(config)             every tensor → its GGUF ne (the kind's one description of its layout)
    gguf_dtype(name, ndim)          the engine's dtype rule over every kind's F32 tensors
    build_adapter(config)           the torch module

Adding a kind is adding its module here (or to a package of its own, registered through the entry
point), its config fields and shard keys with it (base.py); nothing outside branches on a kind's name.
"""
from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.contract.adapter_layout import PREFIX, LayoutProblem, dtype_of
from trainer_core.contract.kinds.base import (HEAD_DIM, AdapterConfig, AdapterKind, KindField, get_kind, register,
                                              registered)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["HEAD_DIM", "AdapterConfig", "AdapterKind", "KindField", "ENTRY_POINTS", "get_kind", "kind_names",
           "register", "detect_layout", "expected_ne", "expected_tensor_count", "gguf_dtype", "build_adapter"]

ENTRY_POINTS = "gguf_trainer.kinds"


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    for point in entry_points(group=ENTRY_POINTS):
        found = point.load()
        kind = getattr(found, "KIND", found)
        if isinstance(kind, AdapterKind):
            register(kind)


_discover()


def kind_names() -> tuple[str, ...]:
    return tuple(registered())


def gguf_dtype(name: str, ndim: int) -> str:
    """'f32' or 'f16' for an adapter tensor of any kind (engine-contract §0.3)."""
    f32 = frozenset().union(*(k.f32_names for k in registered().values()))
    return dtype_of(name, ndim, f32)


def expected_ne(config: AdapterConfig) -> dict[str, tuple[int, ...]]:
    return config.spec.expected_ne(config)


def expected_tensor_count(config: AdapterConfig) -> int:
    """Tensors in the state_dict (= in the GGUF)."""
    return len(config.spec.expected_ne(config))


def detect_layout(tensors: Mapping[str, tuple[tuple[int, ...], str]], layer_map: Any = None
                  ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """Infer the adapter from tensor names and shapes as the engine does; list what is wrong.

    `tensors` maps GGUF names ("adapter.query", …) to (ne, dtype name); `layer_map` is the values of
    adapter.layer_map when the file has one. The engine picks a runner by marker tensors, in its own
    order (each kind's `detect_rank` and `claims`); fatal problems are the ones it would misread or
    refuse, the others departures from what gguf-trainer writes."""
    names = {n[len(PREFIX):]: v for n, v in tensors.items() if n.startswith(PREFIX)}
    if not names:
        return None, [LayoutProblem("no adapter.* tensors: this is not an adapter GGUF")]
    kinds = sorted(registered().values(), key=lambda k: k.detect_rank)
    kind = next((k for k in kinds if k.claims(names)), kinds[-1])
    outside = {n: v for n, v in tensors.items() if not n.startswith(PREFIX)}
    problems: list[LayoutProblem] = []
    for other in sorted(outside):
        if kind.reads_top_level(other):
            continue
        owner = next((k for k in kinds if k.reads_top_level(other)), None)
        if owner is not None:
            problems.append(LayoutProblem(f"tensor {other} is read for {owner.title} adapters only; the engine "
                                          f"ignores it here", fatal=False))
            continue
        problems.append(LayoutProblem(f"tensor {other} is outside the adapter. namespace the engine loads"))
    if any(p.fatal for p in problems):
        return None, problems
    read = {n: v for n, v in outside.items() if kind.reads_top_level(n)}
    return kind.detect(names, read, layer_map, problems)


def build_adapter(config: AdapterConfig, init: bool = True) -> "nn.Module":
    """The adapter of `config` (its kind's `build`, with `model.config` = config: what the packs'
    `load_frozen` reads), initialized for training; init=False leaves the weights as allocated, for
    a caller that loads every one of them next (load_state_dict strict): a GGUF or checkpoint read then
    pays no random fill (0.1 s of a PixArt demo's eval on two cores)."""
    if not init:
        from trainer_core.contract.adapter import weights_left_uninitialized
        with weights_left_uninitialized():
            model = config.spec.build(config)
    else:
        model = config.spec.build(config)
    model.config = config
    return model
