"""Kind `ming_image` (Ming-Image 0.1 Design / Design-Layer): the Qwen3.5 bridge's seeded-slot trunk with
Ming's caption bank: `cap_query` (the DiT's 256 caption rows) runs beside one slot per Ling token of the
Ming template; `out_cap` gives the caption rows (cap_dim), `out_proj` the direct rows, each head
standardized with its own statistics and folded at export. The bank never reads the student.

The engine picks the Ming runner by `cap_query`, reads every size from shapes and returns
[n_cap + P, out_dim] with the caption rows zero-padded (so out_dim ≥ cap_dim). Outside `adapter.` it
reads `tokenizer_json` (the Ling tokenizer; the export refuses a file without it) and, when present, the
`vis_bridge.*` tensors that let a stock Qwen2.5-VL mmproj stand in for pig_ming_vision.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.contract.adapter_layout import (TOKENIZER_JSON, VIS_BRIDGE, LayoutProblem, check_expected, depth_of,
                                                  ne_reader)
from trainer_core.contract.kinds.base import AdapterConfig, Names, register
from trainer_core.contract.kinds.qwen35_bridge import KV_KIND, Qwen35BridgeKind

__all__ = ["KIND", "MingImageKind", "KV_N_CAP", "KV_CAP_DIM"]

KV_N_CAP, KV_CAP_DIM = "adapter.n_cap", "adapter.cap_dim"


class MingImageKind(Qwen35BridgeKind):
    name = "ming_image"
    title = "Ming"
    plural = "Ming adapters"
    detect_rank = 10
    f32_names = frozenset({"slot_query", "cap_query"})
    top_level = (TOKENIZER_JSON, VIS_BRIDGE)
    grad_checkpoint_auto = False
    bank_names = ("cap_query", "out_cap")
    heads = ("dir", "cap")
    aligned_bank = False
    template = "Ling ids of the Ming template"
    too_long = "a longer prompt does not fit this adapter (train it with a larger train.max_slots)"

    def validate(self, c: AdapterConfig) -> None:
        super().validate(c)
        if c.n_bank <= 0:
            raise ValueError(f"a {self.name} adapter needs its caption bank (n_bank = n_cap > 0)")
        if c.out_dim < c.bank_dim:
            raise ValueError(f"a {self.name} adapter pads its caption rows to out_dim, so out_dim {c.out_dim} "
                             f"must be at least cap_dim {c.bank_dim}")

    # ------------------------------------------------------------ the engine's file
    def claims(self, names: Names) -> bool:
        return "cap_query" in names

    def detect(self, names: Names, outside: Names, layer_map: Any, problems: list[LayoutProblem]
               ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
        """The engine's Ming runner (MingAdapterConfig::detect_from_weights): width and n_cap from cap_query,
        max_slots from slot_query, the seed table from seed_embed, vis_dim from vis_in, cap_dim from out_cap,
        out_dim from out_proj. A size it cannot read falls back to the engine's default, which a trained
        adapter never matches: every one of these tensors is required."""
        if TOKENIZER_JSON not in outside:
            problems.append(LayoutProblem(f"the Ming adapter has no {TOKENIZER_JSON} tensor, so the engine needs a "
                                          f"Ling tokenizer from elsewhere (the text encoder's GGUF)", fatal=False))
        config, problems = self._detect(names, problems)
        bridge = {n: v for n, v in outside.items() if n.startswith(VIS_BRIDGE)}
        if config is not None and bridge:
            problems += _vis_bridge_problems(bridge, config.vis_dim)
        return config, problems

    def _detect(self, names: Names, problems: list[LayoutProblem]) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
        ne = ne_reader(names)
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
        try:
            config = AdapterConfig(
                kind=self.name, in_dim=ne("in_proj.weight")[0], out_dim=ne("out_proj.weight")[1], width=width,
                depth=depth_of(names), mlp_hidden=ne("blocks.0.mlp.0.weight")[1],
                seed_vocab=ne("seed_embed.weight")[1], seed_rank=ne("seed_embed.weight")[0],
                vis_dim=ne("vis_in.weight")[0], max_slots=ne("slot_query")[1], n_bank=n_cap,
                bank_dim=ne("out_cap.weight")[1])
        except ValueError as e:
            return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
        return check_expected(config, self.expected_ne(config), names, problems, self.f32_names)

    def structural_kvs(self, c: AdapterConfig) -> tuple[list, list]:
        # packs-contract-more D.1 §5, in that order
        return [], [(KV_KIND, c.kind, "str"), (KV_N_CAP, c.n_bank, "u32"), (KV_CAP_DIM, c.bank_dim, "u32"),
                    *self.slot_kvs(c)]

    def check_export(self, c: AdapterConfig, path: Any, arrays: Mapping[str, list[str]],
                     extra: Mapping[str, Any]) -> None:
        if TOKENIZER_JSON not in extra:
            raise ModelFileError(f"{path} was not written: the engine cannot tokenize Ming's prompt without the Ling "
                                 f"tokenizer ({TOKENIZER_JSON}), so download the teacher's mllm/tokenizer.json and "
                                 f"export again.")

    def describe(self, c: AdapterConfig, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """The stock-mmproj bridge: its input is the mmproj's merger width (3584 for Qwen2.5-VL-7B)."""
        from trainer_core.contract.vis_bridge import detect_bridge
        bridge = detect_bridge({n: t.shape_ne for n, t in tensors.items()})
        if bridge is None:
            return {}
        return {"vis_bridge": f"in {bridge.in_dim} -> out {bridge.out_dim}, width {bridge.width}, "
                              f"depth {bridge.depth}"}

    def head_label(self, bank: bool) -> str | None:
        return "caption" if bank else "caption+direct"

    # ------------------------------------------------------------ infer
    def check_runs(self, vis_pos: Any) -> None:
        if vis_pos is not None and len(vis_pos) > 1:
            raise UsageError(f"--vis-pos names {len(vis_pos)} runs but Ming conditions on one input image; give its "
                             "single run (START:COUNT).")

    def infer(self, c: AdapterConfig, model: Any, hidden: Any, given: Mapping[str, Any]) -> Any:
        """What the engine hands the DiT, [n_cap + P, out_dim]: the caption rows zero-padded to out_dim, then
        one direct row per slot; with --bank the caption rows alone [n_cap, cap_dim]."""
        import torch
        kwargs = self.inputs(c, hidden, given)
        with torch.no_grad():
            bank_rows, slot_rows = model(torch.from_numpy(hidden).unsqueeze(0), None, **kwargs)
        cap = bank_rows[0].numpy()
        if given.get("--bank"):
            return cap
        pad = np.zeros((cap.shape[0], c.out_dim - cap.shape[1]), cap.dtype)
        return np.concatenate([np.concatenate([cap, pad], 1), slot_rows[0].numpy()])


def _vis_bridge_problems(tensors: Names, vis_dim: int) -> list[LayoutProblem]:
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


KIND = register(MingImageKind())
