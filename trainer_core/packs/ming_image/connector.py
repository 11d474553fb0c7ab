"""The Ming-Image targets after the thinker: the connector, the mlp/ projections, and the two targets.

* **Connector** (`connector/`): a Qwen2 decoder stack from transformers, built from its
  config.json, run **bidirectionally** over the 256 query rows with 1-D positions 0 … 255. The
  model is given an explicit 4-D additive mask of zeros: transformers 5 returns a 4-D mask as it
  is (no causal part is added) and SDPA then runs without `is_causal`. Its weights are
  `model.layers.*` and `model.norm.weight`; `model.embed_tokens` is not used (a 1-row stand-in
  takes its place).
* **Projections** (`mlp/`): `query_tokens_dict.16x16` [256, H], `proj_in` (H → connector width),
  `proj_out` (→ diffusion_c_input_dim), `proj_directvlm` = RMSNorm over the concatenated taps
  (eps 1e-5, variance in float32, diffusers-style) + Linear (→ diffusion_inner_dim).
* **Targets** (`ming_targets`, packs-contract-more §D.1 2): per prompt the thinker runs over the
  prompt ids + `<image>` + 256 × `<imagePatch>` + `</image>`, right-padded; the query
  rows overwrite P+1 … P+256 and the input image's embeds its `<imagePatch>` run. Direct = the
  taps at the P prompt rows → proj_directvlm, [P, diffusion_inner_dim]; caption = the final-norm
  rows of the queries → proj_in → connector → proj_out, [256, diffusion_c_input_dim]. Every
  sample's rows are those of its own unpadded run. The pad id (<|role_end|>) comes from the
  tokenizer (template.pad_id); the pad rows are masked, so it only has to be no <imagePatch>.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.lookup import read_config_json
from trainer_core.packs.ming_image.ling import (REPO, LingThinker, load_strict, load_thinker, read_tensors,
                                                safetensors_files, video_positions)
from trainer_core.packs.ming_image.template import IMAGE_PATCH, NUM_QUERIES, thinker_ids

__all__ = ["MlpConfig", "MingConnector", "MingProjections", "MingParts", "ThinkerPrompt", "QUERY_KEY",
           "CONNECTOR_KEYS", "read_mlp_config", "load_connector", "load_projections", "load_ming_parts",
           "ming_targets"]

QUERY_KEY = "query_tokens_dict.16x16"
CONNECTOR_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps",
                  "num_hidden_layers")
_MLP_DEFAULTS: dict[str, Any] = {"selected_hidden_states_layers": [5, 12, 20], "connector_norm": False,
                                 "diffusion_c_input_dim": 2560, "diffusion_inner_dim": 3840}
_DIRECT_EPS = 1e-5


@dataclass(frozen=True)
class MlpConfig:
    taps: tuple[int, ...]           # selected_hidden_states_layers: the direct target's hidden_states
    cap_dim: int                    # diffusion_c_input_dim: the caption rows' width
    direct_dim: int                 # diffusion_inner_dim: the direct rows' width


def read_mlp_config(mlp: str | os.PathLike, num_layers: int) -> MlpConfig:
    """`<mlp>/config.json` with the code defaults for absent keys. connector_norm true is refused:
    the engine has no such normalization, and its place in the reference is not known."""
    path = Path(mlp) / "config.json"
    c = {**_MLP_DEFAULTS, **read_config_json(path, REPO, "Ming mlp config")}
    taps, problems = c["selected_hidden_states_layers"], []
    if not (isinstance(taps, list) and taps and all(isinstance(t, int) and 0 <= t <= num_layers for t in taps)):
        problems.append(f"selected_hidden_states_layers {taps!r} is not a list of layers 0 … {num_layers}")
    for key in ("diffusion_c_input_dim", "diffusion_inner_dim"):
        if isinstance(c[key], bool) or not isinstance(c[key], int) or c[key] <= 0:
            problems.append(f"{key} {c[key]!r} is not a positive width")
    if c["connector_norm"] is not False:
        problems.append("connector_norm is set, which the engine does not support")
    if problems:
        raise ModelFileError(f"The Ming mlp config {path} cannot be used ({'; '.join(problems)}); download {REPO} "
                             "again.")
    return MlpConfig(tuple(taps), c["diffusion_c_input_dim"], c["diffusion_inner_dim"])


# ---------------------------------------------------------------- modules

class MingConnector(nn.Module):
    """transformers' Qwen2Model run bidirectionally: [B, Q, width] → [B, Q, width] (final norm applied)."""

    def __init__(self, config: Any):
        super().__init__()
        from transformers import Qwen2Model
        self.model = Qwen2Model(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, q, _ = x.shape
        zeros = torch.zeros(b, 1, q, q, dtype=x.dtype, device=x.device)              # 4-D: used as is, no causal part
        positions = torch.arange(q, device=x.device)[None].expand(b, q)
        return self.model(inputs_embeds=x, attention_mask=zeros, position_ids=positions,
                          use_cache=False).last_hidden_state


class _DirectNorm(nn.Module):
    """diffusers-style RMSNorm: variance in float32, the weight's dtype when it is a half type."""

    def __init__(self, dim: int, eps: float = _DIRECT_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32.to(self.weight.dtype) if self.weight.dtype in (torch.float16, torch.bfloat16) else x32
                ) * self.weight


class MingProjections(nn.Module):
    """The mlp/ tensors; state_dict names are the file's."""

    def __init__(self, hidden: int, connector_width: int, num_queries: int, n_taps: int, cfg: MlpConfig,
                 biases: bool = True):
        super().__init__()
        self.query_tokens_dict = nn.ParameterDict({"16x16": nn.Parameter(torch.zeros(num_queries, hidden))})
        self.proj_in = nn.Linear(hidden, connector_width, bias=biases)
        self.proj_out = nn.Linear(connector_width, cfg.cap_dim, bias=biases)
        self.proj_directvlm = nn.Sequential(_DirectNorm(n_taps * hidden), nn.Linear(n_taps * hidden, cfg.direct_dim))

    @property
    def queries(self) -> torch.Tensor:
        return self.query_tokens_dict["16x16"]


# ---------------------------------------------------------------- loading

def load_connector(folder: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> MingConnector:
    """The connector from `<folder>/config.json` + its safetensors, strictly (embed_tokens skipped)."""
    from transformers import Qwen2Config
    folder = Path(folder)
    raw = read_config_json(folder / "config.json", REPO, "Ming connector config")
    bad = [k for k in CONNECTOR_KEYS if isinstance(raw.get(k), bool) or not isinstance(raw.get(k), (int, float))]
    if "rope_theta" not in raw and "rope_theta" not in (raw.get("rope_parameters") or {}):
        bad.append("rope_theta")
    if bad:
        raise ModelFileError(f"The Ming connector config {folder / 'config.json'} lacks {', '.join(bad)}; download "
                             f"{REPO} again.")
    try:
        config = Qwen2Config.from_dict({**raw, "vocab_size": 1, "pad_token_id": None, "bos_token_id": None,
                                        "eos_token_id": None, "tie_word_embeddings": False})
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"The Ming connector config {folder / 'config.json'} is not a Qwen2 config ({e}); "
                             f"download {REPO} again.") from None
    config._attn_implementation = "sdpa"
    from accelerate import init_empty_weights
    with init_empty_weights():                      # the rotary buffer stays real
        connector = MingConnector(config)
    state = read_tensors(safetensors_files(folder, "Ming connector"), lambda k: not k.startswith("model.embed_tokens."),
                         lambda k: dtype)
    state["model.embed_tokens.weight"] = torch.zeros(1, config.hidden_size, dtype=dtype)
    load_strict(connector, state, folder, "Ming connector")
    return connector.eval().requires_grad_(False)


def load_projections(folder: str | os.PathLike, hidden: int, connector_width: int, cfg: MlpConfig,
                     dtype: torch.dtype = torch.bfloat16) -> MingProjections:
    folder = Path(folder)
    path = folder / "model.safetensors"
    if not path.is_file():
        raise ModelFileError(f"The Ming mlp weights {path} are missing; download {REPO} again.")
    state = read_tensors([path], lambda k: True, lambda k: dtype)
    queries = state.get(QUERY_KEY)
    if queries is None or queries.dim() != 2 or queries.shape[0] != NUM_QUERIES:
        raise ModelFileError(f"The Ming mlp weights {path} have no {QUERY_KEY} of {NUM_QUERIES} rows; download "
                             f"{REPO} again.")
    with torch.device("meta"):
        module = MingProjections(hidden, connector_width, int(queries.shape[0]), len(cfg.taps), cfg,
                                 biases="proj_in.bias" in state)
    load_strict(module, state, folder, "Ming mlp")
    return module.eval().requires_grad_(False)


@dataclass
class MingParts:
    """What the targets need, loaded: thinker, connector, projections, their config, the compute dtype."""

    thinker: LingThinker
    connector: MingConnector
    projections: MingProjections
    mlp: MlpConfig
    dtype: torch.dtype

    @property
    def num_queries(self) -> int:
        return int(self.projections.queries.shape[0])


def load_ming_parts(root: str | os.PathLike, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
                    ) -> MingParts:
    """The thinker (mllm/), connector (connector/) and projections (mlp/) of a Ming snapshot folder."""
    root, device = Path(root), torch.device(device)
    thinker = load_thinker(root / "mllm", dtype, device)
    cfg = read_mlp_config(root / "mlp", thinker.config.num_hidden_layers)
    connector = load_connector(root / "connector", dtype).to(device)
    projections = load_projections(root / "mlp", thinker.config.hidden_size, connector.model.config.hidden_size, cfg,
                                   dtype).to(device)
    return MingParts(thinker, connector, projections, cfg, dtype)


# ---------------------------------------------------------------- targets

@dataclass(frozen=True)
class ThinkerPrompt:
    """One prompt: its ids (template.build_prompt_ids) and, with an input image, the image's embeds
    [n, H] (linear_proj output, L2-normalized), its first <imagePatch> slot and its merged grid."""

    ids: Sequence[int]
    image_embeds: torch.Tensor | None = None
    image_start: int = -1
    image_grid: tuple[int, int] | None = None

    def blocks(self, num_queries: int) -> list[tuple[int, int, int]]:
        """The image blocks (start, gh, gw) of its thinker sequence: the input image, the query bank."""
        out = []
        if self.image_embeds is not None:
            n, (gh, gw), start = int(self.image_embeds.shape[0]), self.image_grid or (0, 0), self.image_start
            if gh * gw != n or start < 0 or list(self.ids[start:start + n]) != [IMAGE_PATCH] * n:
                raise ValueError(f"the input image ({n} embeds, grid {self.image_grid}, start {start}) does not "
                                 "match the prompt's <imagePatch> run")
            out.append((start, gh, gw))
        return out + [(len(self.ids) + 1, 1, num_queries)]


def ming_targets(parts: MingParts, prompts: Sequence[ThinkerPrompt], pad_id: int
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(caption [B, Q, cap_dim], direct [P_i, direct_dim] per prompt), on the CPU in parts.dtype;
    `pad_id` (the tokenizer's <|role_end|>, template.pad_id) right-pads the batch."""
    q, thinker = parts.num_queries, parts.thinker
    if not prompts:
        return torch.zeros(0, q, parts.mlp.cap_dim, dtype=parts.dtype), []
    device = thinker.word_embeddings.weight.device
    seqs = [thinker_ids(p.ids) for p in prompts]
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    keep = torch.zeros(len(seqs), length, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], keep[i, :len(s)] = torch.tensor(s), True
    positions = torch.stack([video_positions(len(s), p.blocks(q), length) for s, p in zip(seqs, prompts)], dim=1)
    with torch.inference_mode():
        x = thinker.embed(ids).to(parts.dtype)                                      # [B, L, H]
        queries = parts.projections.queries.to(device, parts.dtype)
        for i, p in enumerate(prompts):
            x[i, len(p.ids) + 1:len(p.ids) + 1 + q] = queries
            if p.image_embeds is not None:
                x[i, p.image_start:p.image_start + len(p.image_embeds)] = p.image_embeds.to(device, parts.dtype)
        n_layers = thinker.config.num_hidden_layers
        states = thinker(x, positions, keep, ids == IMAGE_PATCH, [*parts.mlp.taps, n_layers])
        final, taps = states[-1], torch.cat(states[:-1], dim=-1)                     # [B, L, H], [B, L, n·H]
        rows = torch.cat([taps[i, :len(p.ids)] for i, p in enumerate(prompts)])     # [ΣP, n·H]
        direct = parts.projections.proj_directvlm(rows).to("cpu").split([len(p.ids) for p in prompts])
        cap = torch.stack([final[i, len(p.ids) + 1:len(p.ids) + 1 + q] for i, p in enumerate(prompts)])
        cap = parts.projections.proj_out(parts.connector(parts.projections.proj_in(cap)))   # [B, Q, cap_dim]
    return cap.to("cpu"), list(direct)
