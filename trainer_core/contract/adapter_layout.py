"""How the ggk engine reads an adapter from its tensor names and shapes (engine-contract §0.2–§0.4,
packs-contract-more Part F): the dtype rule, the tensors each variant has, and `detect_layout`,
which infers the AdapterConfig as the engine would and lists what is wrong. No file I/O here:
gguf_io reads and writes the files.

The engine picks a runner by marker tensors before anything else: `cap_query` → the Ming runner,
`slot_query` without `cap_query` → the Qwen3.5 bridge, `query` → the resampler family, otherwise
the token-aligned runner (`layer_map`: layerwise). Outside `adapter.` the engine reads one tensor:
Ming's `tokenizer_json` (the Ling tokenizer.json, one F16 element per byte).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from trainer_core.contract.adapter import AdapterConfig

__all__ = ["PREFIX", "F32_2D", "TOKENIZER_JSON", "gguf_dtype", "LayoutProblem", "detect_layout", "expected_ne"]

PREFIX = "adapter."
# 2-D tensors kept F32: the query banks (the engine converts them to f32 on load anyway) and the
# frozen vision projection
F32_2D = frozenset({"query", "vision_proj.weight", "slot_query", "bank_query", "cap_query"})
VIS_BRIDGE = "vis_bridge."          # top level in a Ming adapter: the stock-mmproj bridge (contract/vis_bridge.py)
TOKENIZER_JSON = "tokenizer_json"   # top level, no prefix: the engine reads it for Ming only


def gguf_dtype(name: str, ndim: int) -> str:
    """'f32' or 'f16' for a state_dict tensor (engine-contract §0.3, `_keep_f32`)."""
    if ndim == 1 or name in F32_2D or name.startswith("ln_") or ".ln_" in name:
        return "f32"
    return "f16"


@dataclass(frozen=True)
class LayoutProblem:
    message: str
    fatal: bool = True   # False: the engine runs it, but it is not what gguf-trainer writes


_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_RESAMPLER_BLOCK = ("ln_self", "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "ln_q",
                    "ln_kv", "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ln_mlp")
_TOKEN_BLOCK = ("ln_self", "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "ln_mlp")


def expected_ne(config: AdapterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the variant → its GGUF ne."""
    c, W = config, config.width
    ne: dict[str, tuple[int, ...]] = {}

    def linear(name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        ne[f"{name}.weight"] = (n_in, n_out)
        if bias:
            ne[f"{name}.bias"] = (n_out,)

    def norm(name: str) -> None:
        ne[f"{name}.weight"] = (W,)
        ne[f"{name}.bias"] = (W,)

    if c.bridge:
        bank_query, bank_head = c.bank_names
        if c.n_bank:
            ne[bank_query] = (W, c.n_bank)
        ne["slot_query"] = (W, c.max_slots)
        if c.n_bank and c.bank_align:
            linear("bank_in", c.in_dim, W, bias=False)
        ne["seed_embed.weight"] = (c.seed_rank, c.seed_vocab)
        linear("seed_proj", c.seed_rank, W, bias=False)
        linear("vis_q", c.vis_dim, W, bias=False)
        linear("in_proj", c.in_dim, W)
        linear("vis_in", c.vis_dim, W, bias=False)
    elif c.layerwise:
        ne["layer_map"] = (len(c.taps),)
        linear("in_proj", c.in_dim, W)
    elif c.token_aligned:
        if c.vis_dim:
            ne["vision_proj.weight"] = (c.vis_dim, c.in_dim)
        linear("in_proj", c.in_dim, W)
        if c.vis_dim and c.has_vis_in:
            ne["vis_in.weight"] = (c.vis_dim, W)
    else:
        ne["query"] = (W, c.num_queries)
        if c.kind == "seeded_resampler":
            ne["t5_embed.weight"] = (W, c.seed_vocab)
        linear("in_proj", c.in_dim, W)
    parts = _TOKEN_BLOCK if c.token_aligned else _RESAMPLER_BLOCK
    for i in range(c.depth):
        for part in parts:
            if part.startswith("ln_"):
                norm(f"blocks.{i}.{part}")
            else:
                linear(f"blocks.{i}.{part}", W, W)
        linear(f"blocks.{i}.mlp.0", W, c.mlp)
        linear(f"blocks.{i}.mlp.2", c.mlp, W)
    norm("ln_out")
    if c.bridge and c.n_bank:
        linear(bank_head, W, c.bank_dim)
    linear("out_proj", W, c.out_dim)
    if c.token_aligned and c.has_skip:       # layerwise: always
        linear("skip", c.in_dim, c.out_dim)
    return ne


def detect_layout(tensors: Mapping[str, tuple[tuple[int, ...], str]], layer_map: Any = None
                  ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """Infer the adapter from tensor names and shapes as the engine does; list what is wrong.

    `tensors` maps GGUF names ("adapter.query", …) to (ne, dtype name); `layer_map` is the values of
    adapter.layer_map when the file has one (the tap numbers of a layerwise adapter; without them the
    taps read as 1..n). Fatal problems are the ones the engine would misread or refuse; the others
    are departures from what gguf-trainer writes (a tensor in another dtype).
    """
    problems: list[LayoutProblem] = []
    names = {n[len(PREFIX):]: v for n, v in tensors.items() if n.startswith(PREFIX)}
    ming = "cap_query" in names
    bridge = {n: v for n, v in tensors.items() if ming and n.startswith(VIS_BRIDGE)}
    for other in sorted(set(tensors) - {PREFIX + n for n in names} - set(bridge)):
        if other == TOKENIZER_JSON:
            if not ming:
                problems.append(LayoutProblem(f"tensor {other} is read for Ming adapters only; the engine ignores "
                                              f"it here", fatal=False))
            continue
        problems.append(LayoutProblem(f"tensor {other} is outside the adapter. namespace the engine loads"))
    if not names:
        return None, [LayoutProblem("no adapter.* tensors: this is not an adapter GGUF")]
    if ming and not any(p.fatal for p in problems):
        if TOKENIZER_JSON not in tensors:
            problems.append(LayoutProblem(f"the Ming adapter has no {TOKENIZER_JSON} tensor, so the engine needs a "
                                          f"Ling tokenizer from elsewhere (the text encoder's GGUF)", fatal=False))
        config, problems = _detect_ming(names, problems)
        if config is not None and bridge:
            problems += _vis_bridge_problems(bridge, config.vis_dim)
        return config, problems
    if "slot_query" in names and not any(p.fatal for p in problems):
        return _detect_bridge(names, problems)
    has_query = "query" in names
    for name in ("skip.weight", "vision_proj.weight", "vis_in.weight"):
        if has_query and name in names:
            problems.append(LayoutProblem(
                f"adapter.query makes the engine run this file as a resampler, but adapter.{name} "
                f"belongs to token-aligned adapters and would be ignored"))
    if not has_query and ("t5_embed.weight" in names or "t5_embed_a.weight" in names):
        problems.append(LayoutProblem("adapter.t5_embed.weight without adapter.query: the engine runs a "
                                      "token-aligned adapter and ignores the seed table"))
    if "t5_embed_a.weight" in names:
        problems.append(LayoutProblem("adapter.t5_embed_a.weight is the factorized seed gguf-trainer "
                                      "does not read; export a full adapter.t5_embed.weight instead"))
    if any(p.fatal for p in problems):
        return None, problems

    def ne(name: str) -> tuple[int, ...] | None:
        v = names.get(name)
        return tuple(v[0]) if v else None

    in_proj, out_proj = ne("in_proj.weight"), ne("out_proj.weight")
    for required in ("in_proj.weight", "out_proj.weight", "blocks.0.mlp.0.weight"):
        if ne(required) is None or len(ne(required)) != 2:
            return None, problems + [LayoutProblem(f"adapter.{required} (2-D) is missing; the engine "
                                                   f"cannot size the adapter without it")]
    depth = 1 + max((int(m.group(1)) for n in names if (m := _BLOCK.match(n))), default=-1)
    width = in_proj[1]
    if width % 64:
        return None, problems + [LayoutProblem(f"adapter.in_proj.weight gives width {width}, which is not "
                                               f"a multiple of the engine's head_dim 64")]
    common = dict(in_dim=in_proj[0], out_dim=out_proj[1], width=width, depth=depth,
                  mlp_hidden=ne("blocks.0.mlp.0.weight")[1])
    if not has_query and "layer_map" in names:
        return _detect_layerwise(names, ne, common, layer_map, problems)
    try:
        if has_query:
            query = ne("query")
            seed = ne("t5_embed.weight")
            config = AdapterConfig(kind="seeded_resampler" if seed else "resampler",
                                   num_queries=query[1] if len(query) == 2 else 0,
                                   seed_vocab=seed[1] if seed and len(seed) == 2 else 0, **common)
        else:
            vp, vi = ne("vision_proj.weight"), ne("vis_in.weight")
            vis_dim = (vp or vi or (0,))[0]
            if vp and vi and vp[0] != vi[0]:
                return None, problems + [LayoutProblem(
                    f"adapter.vision_proj.weight ({vp[0]}) and adapter.vis_in.weight ({vi[0]}) disagree on "
                    f"the vision width; the engine takes whichever it reads last")]
            if vi and not vp:
                problems.append(LayoutProblem("adapter.vis_in.weight without adapter.vision_proj.weight: the "
                                              "engine cannot run reference images through this adapter",
                                              fatal=False))
            config = AdapterConfig(kind="token_aligned_vision", vis_dim=vis_dim, has_vis_in=vi is not None,
                                   has_skip=ne("skip.weight") is not None, **common)
    except ValueError as e:
        return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]

    return _check_expected(config, names, problems)


def _detect_layerwise(names: Mapping[str, tuple[tuple[int, ...], str]], ne: Callable[[str], Any],
                      common: dict[str, int], values: Any, problems: list[LayoutProblem]
                      ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """The engine's rules for a token-aligned adapter with a layer_map: its count is ne[0] (a stored
    [n, 1] still counts), at least 2, and out_proj's width is that many layers of equal width."""
    shape = ne("layer_map")
    n = shape[0]
    if any(d != 1 for d in shape[1:]):
        return None, problems + [LayoutProblem(f"adapter.layer_map has ne {list(shape)}; the engine needs a 1-D "
                                               f"tensor with one entry per stacked layer")]
    if len(shape) > 1:
        problems.append(LayoutProblem(f"adapter.layer_map has ne {list(shape)}; gguf-trainer writes it 1-D",
                                      fatal=False))
    if n < 2:
        return None, problems + [LayoutProblem(f"adapter.layer_map has {n} entry; the engine needs at least 2 "
                                               f"stacked layers (1 reads as a plain adapter)")]
    for name in ("vision_proj.weight", "vis_in.weight", "query"):
        if name in names:
            problems.append(LayoutProblem(f"adapter.{name} does not belong to a layerwise adapter"))
    if ne("skip.weight") is None:
        problems.append(LayoutProblem("adapter.skip.weight is missing; a layerwise adapter has a skip path"))
    taps = tuple(int(round(float(v))) for v in np.asarray(values).reshape(-1)) if values is not None else ()
    if len(taps) != n:
        taps = tuple(range(1, n + 1))
    if common["out_dim"] % n:
        problems.append(LayoutProblem(f"adapter.out_proj.weight gives {common['out_dim']} outputs, which is not "
                                      f"{n} stacked layers of equal width (adapter.layer_map has {n} entries)"))
    if any(p.fatal for p in problems):
        return None, problems
    try:
        config = AdapterConfig(kind="token_aligned_layerwise", taps=taps, **common)
    except ValueError as e:
        return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
    return _check_expected(config, names, problems)


def _detect_bridge(names: Mapping[str, tuple[tuple[int, ...], str]], problems: list[LayoutProblem]
                   ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """The engine's Qwen3.5 runner (Part F 2, 5): width and max_slots from slot_query, the seed table
    from seed_embed, vis_dim from vis_in (vis_q must agree), a bank only when both bank_query and
    out_bank exist, prompt-aligned exactly when bank_in exists (no KV is read)."""
    def ne(name: str) -> tuple[int, ...] | None:
        v = names.get(name)
        return tuple(v[0]) if v else None

    for required in ("slot_query", "in_proj.weight", "out_proj.weight", "blocks.0.mlp.0.weight",
                     "seed_embed.weight", "vis_in.weight"):
        if ne(required) is None or len(ne(required)) != 2:
            return None, problems + [LayoutProblem(f"adapter.{required} (2-D) is missing; the engine cannot "
                                                   f"size the Qwen3.5 bridge without it")]
    width, max_slots = ne("slot_query")
    if width % 64:
        return None, problems + [LayoutProblem(f"adapter.slot_query gives width {width}, which is not a "
                                               f"multiple of the engine's head_dim 64")]
    vis_dim, vis_q = ne("vis_in.weight")[0], ne("vis_q.weight")
    if vis_q is not None and vis_q[0] != vis_dim:
        return None, problems + [LayoutProblem(f"adapter.vis_q.weight reads {vis_q[0]}-wide vision embeds but "
                                               f"adapter.vis_in.weight {vis_dim}-wide; the engine refuses to "
                                               f"load the file")]
    bank_parts = ("bank_query", "out_bank.weight")
    has_bank = all(n in names for n in bank_parts)
    ignored: set[str] = set()
    if not has_bank:
        lone = [n for n in (*bank_parts, "out_bank.bias", "bank_in.weight") if n in names]
        if lone:
            ignored.update(lone)
            absent = " and ".join(f"adapter.{n}" for n in bank_parts if n not in names)
            problems.append(LayoutProblem(f"adapter.{lone[0]} without {absent}: the engine ignores "
                                          f"{'it' if len(lone) == 1 else 'them'} and runs no bank (FLUX.3 "
                                          f"refuses the file); gguf-trainer writes the bank tensors together",
                                          fatal=False))
    elif len(ne("bank_query")) != 2 or len(ne("out_bank.weight")) != 2:
        return None, problems + [LayoutProblem("adapter.bank_query and adapter.out_bank.weight must be 2-D; the "
                                               "engine cannot size the bank")]
    depth = 1 + max((int(m.group(1)) for n in names if (m := _BLOCK.match(n))), default=-1)
    try:
        config = AdapterConfig(
            kind="qwen35_bridge", in_dim=ne("in_proj.weight")[0], out_dim=ne("out_proj.weight")[1], width=width,
            depth=depth, mlp_hidden=ne("blocks.0.mlp.0.weight")[1], seed_vocab=ne("seed_embed.weight")[1],
            seed_rank=ne("seed_embed.weight")[0], vis_dim=vis_dim, max_slots=max_slots,
            n_bank=ne("bank_query")[1] if has_bank else 0, bank_dim=ne("out_bank.weight")[1] if has_bank else 0,
            bank_align=has_bank and "bank_in.weight" in names)
    except ValueError as e:
        return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
    return _check_expected(config, names, problems, ignored)


def _detect_ming(names: Mapping[str, tuple[tuple[int, ...], str]], problems: list[LayoutProblem]
                 ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """The engine's Ming runner (MingAdapterConfig::detect_from_weights): width and n_cap from cap_query,
    max_slots from slot_query, the seed table from seed_embed, vis_dim from vis_in, cap_dim from out_cap,
    out_dim from out_proj. A size it cannot read falls back to the engine's default, which a trained
    adapter never matches: every one of these tensors is required."""
    def ne(name: str) -> tuple[int, ...] | None:
        v = names.get(name)
        return tuple(v[0]) if v else None

    foreign = [n for n in ("query", "t5_embed.weight", "vision_proj.weight", "skip.weight", "layer_map",
                           "bank_query", "out_bank.weight", "bank_in.weight") if n in names]
    if foreign:
        return None, problems + [LayoutProblem(f"adapter.cap_query makes the engine run this file with its Ming "
                                               f"runner, which ignores adapter.{foreign[0]}: that tensor belongs "
                                               f"to another adapter kind")]
    for required in ("cap_query", "slot_query", "in_proj.weight", "out_proj.weight", "out_cap.weight",
                     "blocks.0.mlp.0.weight", "seed_embed.weight", "vis_in.weight"):
        if ne(required) is None or len(ne(required)) != 2:
            return None, problems + [LayoutProblem(f"adapter.{required} (2-D) is missing; the engine would size "
                                                   f"the Ming adapter from its defaults instead")]
    width, n_cap = ne("cap_query")
    if width % 64:
        return None, problems + [LayoutProblem(f"adapter.cap_query gives width {width}, which is not a multiple "
                                               f"of the engine's head_dim 64")]
    if ne("slot_query")[0] != width:
        return None, problems + [LayoutProblem(f"adapter.slot_query is {ne('slot_query')[0]} wide but "
                                               f"adapter.cap_query {width}; the engine reads one width")]
    depth = 1 + max((int(m.group(1)) for n in names if (m := _BLOCK.match(n))), default=-1)
    try:
        config = AdapterConfig(
            kind="ming_image", in_dim=ne("in_proj.weight")[0], out_dim=ne("out_proj.weight")[1], width=width,
            depth=depth, mlp_hidden=ne("blocks.0.mlp.0.weight")[1], seed_vocab=ne("seed_embed.weight")[1],
            seed_rank=ne("seed_embed.weight")[0], vis_dim=ne("vis_in.weight")[0], max_slots=ne("slot_query")[1],
            n_bank=n_cap, bank_dim=ne("out_cap.weight")[1])
    except ValueError as e:
        return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
    return _check_expected(config, names, problems)


def _vis_bridge_problems(tensors: Mapping[str, tuple[tuple[int, ...], str]], vis_dim: int) -> list[LayoutProblem]:
    """The engine's MingVisionBridgeConfig::detect on the `vis_bridge.*` tensors of a Ming adapter, and
    every tensor of the bridge it implies with its shape (a Linear or LayerNorm without its bias would
    not load); its rows must be the adapter's vis_dim wide."""
    import torch

    from trainer_core.contract.vis_bridge import HEAD_DIM, VisBridge, detect_bridge
    ne = {n: tuple(v[0]) for n, v in tensors.items()}
    found = detect_bridge(ne)
    if found is None or found.width < HEAD_DIM:
        return [LayoutProblem(f"the {VIS_BRIDGE}* tensors do not make a bridge the engine detects ({VIS_BRIDGE}inp "
                              f"and {VIS_BRIDGE}out weights, a width that is a multiple of 4 and at least 64)")]
    if found.out_dim != vis_dim:
        return [LayoutProblem(f"{VIS_BRIDGE}out gives {found.out_dim}-wide rows but the adapter's vis_in reads "
                              f"{vis_dim}; the engine would leave the stock mmproj unbridged")]
    with torch.device("meta"):
        want = {VIS_BRIDGE + k: tuple(reversed(v.shape)) for k, v in VisBridge(found).state_dict().items()}
    problems = []
    for name in sorted(set(want) | set(ne)):
        if name not in ne:
            problems.append(LayoutProblem(f"{name} is missing (expected ne {list(want[name])})"))
        elif name not in want:
            problems.append(LayoutProblem(f"{name} is not part of the {found.depth}-block bridge the engine reads"))
        elif ne[name] != want[name]:
            problems.append(LayoutProblem(f"{name} has ne {list(ne[name])}, expected {list(want[name])}"))
    return problems


def _check_expected(config: AdapterConfig, names: Mapping[str, tuple[tuple[int, ...], str]],
                    problems: list[LayoutProblem], ignored: set[str] | frozenset[str] = frozenset()
                    ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
    """Every tensor the config implies, with its ne and dtype; nothing else (but the `ignored` tensors,
    already reported as ones the engine skips)."""
    expected = expected_ne(config)
    for name, want in expected.items():
        got = names.get(name)
        if got is None:
            problems.append(LayoutProblem(f"adapter.{name} is missing (expected ne {list(want)})"))
        elif tuple(got[0]) != want and not (name == "layer_map" and tuple(got[0])[:1] == want):
            problems.append(LayoutProblem(f"adapter.{name} has ne {list(got[0])} but the rest of the file "
                                          f"implies {list(want)}"))
        else:
            want_dtype = gguf_dtype(name, len(want)).upper()
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
