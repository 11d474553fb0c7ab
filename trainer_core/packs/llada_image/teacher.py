"""The LLaDA-Image-Turbo teacher: token embeddings → QueryFormer → LLaDA2-MoE → text_projection.

Per prompt the target is the 256 QueryFormer rows of cap_feats, [256, 2560] (packs-contract
§B.1). The formatted prompt is tokenized by the snapshot's own tokenizer (right padding, its
special tokens added, at most 2048 tokens); then, per batch:

1. `emb` = the backbone's token-embedding table at the ids, [B, L, H].
2. `q` = QueryFormer(emb, keep = the tokenizer's attention mask), [B, Q, H].
3. The sequence is [emb ; q], [B, L+Q, H], with position ids cumsum(mask) − 1 (clamped at 0),
   so the queries take positions n…n+Q−1 right after each sample's *real* length n whatever the
   batch padding, and an additive 4-D mask without a causal part (LLaDA is bidirectional): pad
   keys are masked for every row, and the text rows (pads included) cannot see the queries.
4. The backbone's inner model runs on it; TextProjection runs over all L+Q rows with the pad
   keys masked. (The reference runs it unmasked, so its batched rows drift from a single-prompt
   run, which has no pads and is what the image pipeline computes; masking the pads makes every
   prompt's rows those of its own run, whatever it is batched with.)
5. The rows [L:] are the target.

QueryFormer and TextProjection are plain torch, built from their `config.json` and loaded
strictly from `diffusion_pytorch_model.safetensors` (no diffusers). The backbone is the
snapshot's remote code (`trust_remote_code`), placed sequentially (the chosen GPU up to its
budget, then the other CUDA devices, then CPU RAM) or with accelerate's balanced split; its
rotary tables are checked and repaired after loading (rope_guard), and the teacher refuses to
run while any is still bad.

`MockLLaDATeacher` gives deterministic rows of the same shape with the real rows' large shared
per-dimension offset, so standardization and the export fold are exercised without the 33 GB
snapshot.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trainer_core.contract.placement import card_budgets
from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.packs.llada_image.template import MAX_LEN_TEACHER
from trainer_core.packs.common.rope_guard import check_rope_tables, default_rope, repair_rope_tables

__all__ = [
    "MAX_LEN_TEACHER", "QUERYFORMER_DEFAULTS", "TEXT_PROJECTION_DEFAULTS", "QueryFormer", "TextProjection",
    "load_module_config", "load_strict", "load_queryformer", "load_text_projection", "teacher_dims",
    "placement_plan", "sequential_device_map", "placement_summary", "build_masks", "LLaDATeacher", "MockLLaDATeacher",
]

# the code defaults: a key absent from config.json takes these
QUERYFORMER_DEFAULTS = {"hidden_size": 2048, "num_queries": 256, "num_attention_heads": 16,
                        "intermediate_size": 8192, "norm_eps": 1e-6, "num_hidden_layers": 1}
TEXT_PROJECTION_DEFAULTS = {"hidden_size": 2048, "intermediate_size": 8960, "num_attention_heads": 32,
                            "norm_eps": 1e-6, "num_hidden_layers": 6, "projection_dim": 2560}
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without affine, the variance in float32, the result in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)



class _MLP(nn.Module):
    def __init__(self, hidden: int, inner: int, bias: bool):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner, bias=bias), nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(_gelu_tanh(self.fc1(x)))


class _PackedCrossAttention(nn.Module):
    """Multi-head attention with a packed [3H, H] q/k/v projection (the nn.MultiheadAttention layout)."""

    def __init__(self, hidden: int, heads: int, out_bias: bool):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * hidden, hidden))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * hidden))
        self.out_proj = nn.Linear(hidden, hidden, bias=out_bias)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, nq, h = q.shape
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, -1, self.heads, h // self.heads).transpose(1, 2)   # [B, heads, n, d]
        attn = F.scaled_dot_product_attention(heads(F.linear(q, wq, bq)), heads(F.linear(kv, wk, bk)),
                                              heads(F.linear(kv, wv, bv)), attn_mask=keep[:, None, None, :])
        return self.out_proj(attn.transpose(1, 2).reshape(b, nq, h))


class _QueryFormerBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float, bias: bool):
        super().__init__()
        self.eps = eps
        self.cross_attn = _PackedCrossAttention(hidden, heads, bias)
        self.mlp = _MLP(hidden, inner, bias)

    def forward(self, q: torch.Tensor, enc: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        shape = q.shape[-1:]
        q = F.layer_norm(q, shape, eps=self.eps)                   # the residual sits on the normed queries
        q = q + self.cross_attn(q, F.layer_norm(enc, shape, eps=self.eps), keep)
        q = F.layer_norm(q, shape, eps=self.eps)
        return q + self.mlp(q)


class QueryFormer(nn.Module):
    """`num_queries` learned queries reading the prompt's token embeddings: [B, L, H] → [B, Q, H].

    `blocks` names the container of the blocks as the weights file does (the public facts give
    the per-block names, not the container's); `bias` whether out_proj/fc1/fc2 carry biases."""

    def __init__(self, config: dict[str, Any], blocks: str = "layers", bias: bool = True):
        super().__init__()
        c = {**QUERYFORMER_DEFAULTS, **config}
        self.hidden, self.num_queries = int(c["hidden_size"]), int(c["num_queries"])
        self.blocks_name = blocks
        self.meta_queries = nn.Parameter(torch.empty(self.num_queries, self.hidden))
        self.add_module(blocks, nn.ModuleList(
            _QueryFormerBlock(self.hidden, int(c["num_attention_heads"]), int(c["intermediate_size"]),
                              float(c["norm_eps"]), bias) for _ in range(int(c["num_hidden_layers"]))))

    def forward(self, enc: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """enc [B, L, H], keep [B, L] (True = a real token) → [B, Q, H]."""
        q = self.meta_queries.to(enc.dtype).expand(enc.shape[0], -1, -1)
        keep = keep.to(device=enc.device, dtype=torch.bool)
        for block in getattr(self, self.blocks_name):
            q = block(q, enc, keep)
        return q


class _ProjectionAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float, out_bias: bool):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        self.heads, self.eps = heads, eps
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out_proj = nn.Linear(hidden, hidden, bias=out_bias)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        b, n, h = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, h // self.heads).transpose(1, 2)    # [B, heads, n, d]
        q = _rms_norm(heads(self.q_proj(x)), self.eps)                          # per-head RMSNorm on q and k
        k = _rms_norm(heads(self.k_proj(x)), self.eps)
        mask = None if keep is None else keep[:, None, None, :]
        attn = F.scaled_dot_product_attention(q, k, heads(self.v_proj(x)), attn_mask=mask)
        return self.out_proj(attn.transpose(1, 2).reshape(b, n, h))


class _ProjectionLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float, bias: bool):
        super().__init__()
        self.eps = eps
        self.self_attn = _ProjectionAttention(hidden, heads, eps, bias)
        self.mlp = _MLP(hidden, inner, bias)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(_rms_norm(x, self.eps), keep)
        return x + self.mlp(_rms_norm(x, self.eps))


class TextProjection(nn.Module):
    """The 6-layer text_projection: [B, N, H] → [B, N, projection_dim], no final norm.

    `keep` [B, N] (True = attend) masks pad keys; None runs unmasked, which is the same thing
    for a batch without padding (a single prompt, as the image pipeline runs it)."""

    def __init__(self, config: dict[str, Any], bias: bool = True):
        super().__init__()
        c = {**TEXT_PROJECTION_DEFAULTS, **config}
        hidden = int(c["hidden_size"])
        self.layers = nn.ModuleList(
            _ProjectionLayer(hidden, int(c["num_attention_heads"]), int(c["intermediate_size"]), float(c["norm_eps"]),
                             bias) for _ in range(int(c["num_hidden_layers"])))
        self.projector = nn.Linear(hidden, int(c["projection_dim"]), bias=bias)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        keep = None if keep is None else keep.to(device=x.device, dtype=torch.bool)
        for layer in self.layers:
            x = layer(x, keep)
        return self.projector(x)


# ---------------------------------------------------------------- loading

def load_module_config(folder: Path, what: str) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"The {what} config {path} is missing; download inclusionAI/LLaDA-Image-Turbo "
                             "again.") from None
    except (OSError, ValueError) as e:
        raise ModelFileError(f"The {what} config {path} cannot be read ({e}); download it again.") from None
    if not isinstance(config, dict):
        raise ModelFileError(f"The {what} config {path} is not a JSON object; download it again.")
    return config


def _read_weights(folder: Path, what: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise ModelFileError(f"The {what} weights {path} are missing; download inclusionAI/LLaDA-Image-Turbo "
                             "again.")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelFileError(f"The {what} weights {path} cannot be read ({e}); download them again.") from None


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], path: Path, what: str) -> nn.Module:
    """Load every tensor of `state` into `module`: a missing, unexpected or misshapen key raises
    a ModelFileError naming the keys."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k} {list(state[k].shape)} (expected {list(own[k].shape)})"
              for k in sorted(set(own) & set(state)) if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = [f"missing {', '.join(missing[:6])}" if missing else "",
                 f"unexpected {', '.join(unexpected[:6])}" if unexpected else "",
                 f"wrong shape {', '.join(shapes[:4])}" if shapes else ""]
        raise ModelFileError(f"The {what} weights {path} do not match its config.json "
                             f"({'; '.join(p for p in parts if p)}); download inclusionAI/LLaDA-Image-Turbo "
                             "again.")
    module.load_state_dict(state, strict=True)
    return module


def _has_biases(state: dict[str, torch.Tensor], names: Sequence[str]) -> bool:
    """Whether the file's out_proj / fc1 / fc2 / projector Linears carry biases (all or none)."""
    return any(k.endswith(f"{n}.bias") for k in state for n in names)


def load_queryformer(folder: str | os.PathLike) -> QueryFormer:
    folder = Path(folder)
    config, state = load_module_config(folder, "QueryFormer"), _read_weights(folder, "QueryFormer")
    containers = {m.group(1) for k in state if (m := re.match(r"^(\w+)\.\d+\.cross_attn\.in_proj_weight$", k))}
    if len(containers) != 1:
        raise ModelFileError(f"The QueryFormer weights {folder / WEIGHTS_FILE} have "
                             f"{'no' if not containers else 'several kinds of'} blocks "
                             "(<blocks>.<i>.cross_attn.in_proj_weight); download them again.")
    module = QueryFormer(config, blocks=containers.pop(), bias=_has_biases(state, ("out_proj", "fc1", "fc2")))
    return load_strict(module, state, folder / WEIGHTS_FILE, "QueryFormer")


def load_text_projection(folder: str | os.PathLike) -> TextProjection:
    folder = Path(folder)
    config, state = load_module_config(folder, "text_projection"), _read_weights(folder, "text_projection")
    module = TextProjection(config, bias=_has_biases(state, ("out_proj", "fc1", "fc2", "projector")))
    return load_strict(module, state, folder / WEIGHTS_FILE, "text_projection")


def teacher_dims(root: str | os.PathLike) -> dict[str, int]:
    """{"out_dim": projection_dim, "num_queries": …, "hidden": …} from the two module configs."""
    root = Path(root)
    qf = {**QUERYFORMER_DEFAULTS, **load_module_config(root / "queryformer", "QueryFormer")}
    tp = {**TEXT_PROJECTION_DEFAULTS, **load_module_config(root / "text_projection", "text_projection")}
    return {"out_dim": int(tp["projection_dim"]), "num_queries": int(qf["num_queries"]),
            "hidden": int(qf["hidden_size"])}


# ---------------------------------------------------------------- placement

def placement_plan(device: torch.device, placement: str, gpu_mem_gib: float, cpu_mem_gib: float,
                   cuda_totals_gib: Sequence[float] = ()) -> tuple[str | None, dict[Any, str] | None]:
    """(device_map, max_memory) for from_pretrained; (None, None) keeps the model on the CPU.

    The chosen card gets its budget (0: its total − 1.5 GiB, at least 1), every other CUDA card
    whose total − 1.5 GiB exceeds 2 GiB gets that much, and the CPU gets `cpu_mem_gib` (0:
    available RAM − 6 GiB, at least 4). "sequential" fills them in that order; "balanced" is
    accelerate's even split."""
    from trainer_core.contract.devices import cpu_budget_gib
    if placement not in ("sequential", "balanced"):
        raise UsageError(f'The placement "{placement}" is not known; choose "sequential" or "balanced".')
    if device.type != "cuda":
        return None, None
    chosen = device.index or 0
    memory: dict[Any, str] = {index: f"{gib:.1f}GiB"
                              for index, gib in card_budgets(chosen, cuda_totals_gib, gpu_mem_gib).items()}
    memory["cpu"] = f"{cpu_budget_gib(cpu_mem_gib):.1f}GiB"
    return placement, memory


def sequential_device_map(folder: str | os.PathLike, max_memory: dict[Any, str], dtype: torch.dtype
                          ) -> dict[str, Any]:
    """An explicit sequential device map that fills the GPUs in `max_memory`'s order.

    accelerate sorts the GPU indices before filling them, so a "sequential" map would start on
    cuda:0 even when another card was chosen. Here the model is built on the meta device, the map
    is planned over GPU slots in the wanted order, and each slot is renamed to its card."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoConfig, AutoModel

    gpus = [k for k in max_memory if isinstance(k, int)]
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    with init_empty_weights(), default_rope():
        empty = AutoModel.from_config(config, trust_remote_code=True, dtype=dtype)
    slots = {**{slot: max_memory[gpu] for slot, gpu in enumerate(gpus)},
             **{k: v for k, v in max_memory.items() if not isinstance(k, int)}}
    plan = infer_auto_device_map(empty, max_memory=slots, no_split_module_classes=sorted(empty._no_split_modules or ()),
                                 dtype=dtype)
    return {name: gpus[where] if isinstance(where, int) else where for name, where in plan.items()}


def placement_summary(model: nn.Module) -> str:
    """Where the weights ended up, e.g. "30.10 GiB on cuda:0, 2.30 GiB in CPU RAM" (parameters that
    accelerate offloaded sit on the meta device and count as CPU RAM)."""
    sizes: dict[str, int] = {}
    for p in model.parameters():
        where = "CPU RAM" if p.device.type in ("cpu", "meta") else f"on {p.device}"
        sizes[where] = sizes.get(where, 0) + p.numel() * p.element_size()
    order = sorted(sizes, key=lambda w: (w == "CPU RAM", w))
    return ", ".join(f"{sizes[w] / 2**30:.2f} GiB {'in ' if w == 'CPU RAM' else ''}{w}" for w in order)


def build_masks(keep: torch.Tensor, num_queries: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids [B, L+Q], additive mask [B, 1, L+Q, L+Q]) for a right-padded text mask [B, L]."""
    b, length = keep.shape
    full = torch.cat([keep.long(), torch.ones(b, num_queries, dtype=torch.long, device=keep.device)], dim=1)
    positions = (full.cumsum(1) - 1).clamp(min=0)
    blocked = (full == 0)[:, None, None, :].expand(b, 1, length + num_queries, length + num_queries).clone()
    blocked[:, :, :length, length:] = True                       # the text never sees the queries
    mask = torch.zeros(b, 1, length + num_queries, length + num_queries, dtype=dtype, device=keep.device)
    return positions, mask.masked_fill_(blocked, torch.finfo(dtype).min)


# ---------------------------------------------------------------- teachers

class LLaDATeacher:
    """The real teacher from a LLaDA-Image-Turbo snapshot folder (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, device: str | torch.device = "cpu", placement: str = "sequential",
                 gpu_mem_gib: float = 0.0, cpu_mem_gib: float = 0.0, dtype: torch.dtype = torch.bfloat16,
                 log: Callable[[str], None] | None = None):
        from transformers import AutoModel, AutoTokenizer

        self.root, self.device, self.dtype = Path(root), torch.device(device), dtype
        self.notes: list[str] = []
        note = log or self.notes.append
        for sub in ("tokenizer", "text_encoder", "queryformer", "text_projection"):
            if not (self.root / sub).is_dir():
                raise ModelFileError(f"The LLaDA-Image-Turbo snapshot {self.root} has no {sub}/ folder; download "
                                     "inclusionAI/LLaDA-Image-Turbo again.")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.root / "tokenizer")
        except (OSError, ValueError) as e:
            raise ModelFileError(f"The LLaDA tokenizer in {self.root / 'tokenizer'} cannot be loaded ({e}); "
                                 "download it again.") from None
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token_id is None:
            raise ModelFileError(f"The LLaDA tokenizer in {self.root / 'tokenizer'} has no pad token, so "
                                 "prompts cannot be batched; download it again.")

        self.queryformer = load_queryformer(self.root / "queryformer").to(self.device, dtype).eval()
        self.text_projection = load_text_projection(self.root / "text_projection").to(self.device, dtype).eval()
        self.queryformer.requires_grad_(False)
        self.text_projection.requires_grad_(False)
        self.num_queries = self.queryformer.num_queries
        self.out_dim = int(self.text_projection.projector.out_features)

        totals = ([torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(torch.cuda.device_count())]
                  if self.device.type == "cuda" else [])
        device_map, max_memory = placement_plan(self.device, placement, gpu_mem_gib, cpu_mem_gib, totals)
        self.mode = f"{placement} placement" if device_map else "cpu"
        kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": True}
        if device_map:
            kwargs.update(device_map=device_map, max_memory=max_memory)
        gpus = [k for k in max_memory or {} if isinstance(k, int)]
        try:
            if device_map == "sequential" and gpus != sorted(gpus):     # the chosen card is not the first
                kwargs["device_map"] = sequential_device_map(self.root / "text_encoder", max_memory, dtype)
            with default_rope():            # the remote code asks for the "default" rope type
                backbone = AutoModel.from_pretrained(self.root / "text_encoder", **kwargs)
        except (OSError, ValueError, KeyError, ImportError) as e:
            raise ModelFileError(f"The LLaDA2-MoE text encoder in {self.root / 'text_encoder'} cannot be loaded "
                                 f"({type(e).__name__}: {e}); download inclusionAI/LLaDA-Image-Turbo again.") from None
        backbone.eval().requires_grad_(False)
        repair_rope_tables(backbone, note)
        check_rope_tables(backbone)                  # RopeError: the teacher refuses to run
        self.backbone = backbone
        inner = getattr(backbone, "model", None)
        self.inner = inner if isinstance(inner, nn.Module) else backbone
        self.embeddings = backbone.get_input_embeddings()
        hidden = int(self.embeddings.weight.shape[1])
        if hidden != self.queryformer.hidden:
            raise ModelFileError(f"The text encoder's width ({hidden}) differs from the QueryFormer's "
                                 f"({self.queryformer.hidden}); the snapshot {self.root} is mixed, download it again.")
        if device_map:
            note(f"LLaDA2-MoE placed {device_map}: {placement_summary(backbone)}")

    def text_lens(self, prompts: Sequence[str]) -> list[int]:
        """Teacher tokens per formatted prompt (special tokens included, at most 2048)."""
        enc = self.tokenizer(list(prompts), add_special_tokens=True, truncation=True, max_length=MAX_LEN_TEACHER)
        return [len(ids) for ids in enc["input_ids"]]

    def forward_prompts(self, prompts: Sequence[str]) -> torch.Tensor:
        """[B, Q, out_dim] float32 on the CPU for formatted prompts (the pack stores bf16)."""
        if not prompts:
            return torch.zeros(0, self.num_queries, self.out_dim, dtype=torch.bfloat16)
        enc = self.tokenizer(list(prompts), add_special_tokens=True, padding=True, truncation=True,
                             max_length=MAX_LEN_TEACHER, return_tensors="pt")
        ids, keep = enc["input_ids"], enc["attention_mask"]
        length = ids.shape[1]
        with torch.inference_mode():
            emb_device = self.embeddings.weight.device
            emb = self.embeddings(ids.to(emb_device)).to(self.dtype)                  # [B, L, H]
            q = self.queryformer(emb.to(self.device), keep.to(self.device))           # [B, Q, H]
            x = torch.cat([emb, q.to(emb_device)], dim=1)                              # [B, L+Q, H]
            positions, mask = build_masks(keep.to(emb_device), self.num_queries, x.dtype)
            hidden = self.inner(inputs_embeds=x, attention_mask=mask, position_ids=positions,
                                return_dict=True).last_hidden_state                    # [B, L+Q, H]
            keep_full = positions.new_ones(positions.shape, dtype=torch.bool)
            keep_full[:, :length] = keep.bool()
            out = self.text_projection(hidden.to(self.device, self.dtype), keep_full)  # [B, L+Q, out]
        return out[:, length:].to("cpu", torch.float32)


class MockLLaDATeacher:
    """Deterministic synthetic rows of the teacher's shape, [B, Q, out] bf16, with no file.

    Per formatted prompt, 64 byte features (byte b at i adds (b − 96)/32 to feature (7i + b) mod
    64) times a fixed random basis give the rows, plus a shared per-dimension offset of
    2000 + N(0, 50²) that mimics the real rows'. The basis is scaled so the prompt-dependent part
    (std ≈ 140 over the demo prompts) stays far above bf16's rounding at 2000 (error std ≈ 3.4):
    the shards keep it, and a demo adapter has something to learn once the offset is
    standardized away."""

    mode = "mock"
    FEATURES = 64
    SCALE = 16.0       # the basis's std (the reference mock's 1/8 leaves the prompt part below bf16's step)

    def __init__(self, out_dim: int, num_queries: int):
        self.out_dim, self.num_queries = int(out_dim), int(num_queries)
        g = torch.Generator().manual_seed(1234)
        self.basis = torch.randn(self.FEATURES, self.num_queries * self.out_dim, generator=g) * self.SCALE
        self.offset = 2000.0 + torch.randn(self.out_dim, generator=g) * 50.0

    def text_lens(self, prompts: Sequence[str]) -> list[int]:
        return [len(p) // 4 + 1 for p in prompts]

    def features(self, prompt: str) -> torch.Tensor:
        feats = torch.zeros(self.FEATURES)
        for i, b in enumerate(prompt.encode("utf-8")[:512]):
            feats[(i * 7 + b) % self.FEATURES] += (b - 96) / 32
        return feats

    def forward_prompts(self, prompts: Sequence[str]) -> torch.Tensor:
        if not prompts:
            return torch.zeros(0, self.num_queries, self.out_dim, dtype=torch.bfloat16)
        # one product per prompt: a batched GEMM may pick another kernel per batch size, and a
        # prompt's rows must not depend on what it is batched with (resumed shards are byte-identical)
        rows = torch.cat([self.features(p)[None] @ self.basis for p in prompts])      # [B, Q·out]
        rows = rows.view(len(prompts), self.num_queries, self.out_dim) + self.offset
        return rows.to(torch.bfloat16)
