"""A tiny random Ming-Image snapshot in the real layout (the pack's tests and offline demo).

    mllm/config.json                        {"llm_config": …, "vision_config": …}
    mllm/model-00001-of-00001.safetensors   thinker (model.model.*, bf16, expert biases f32),
    mllm/model.safetensors.index.json       vision.* (transformers' Qwen2.5-VL tower names, bf16),
                                            linear_proj.{0,2}.* (bf16)
    mllm/preprocessor_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json
    connector/config.json + model-00001-of-00001.safetensors + index   (Qwen2, f32, with embed_tokens)
    mlp/config.json + model.safetensors                                (f32)

The thinker has the real vocabulary size (157184) so the Ling special ids are the real ones (as
far as SPECIAL_IDS knows them). Its head_dim is the real 128 (rope_dim 64: the video rope's 24
spatial frequencies plus 8 temporal ones, and 64 channels that are not rotated). The tokenizer is a small
byte-level BPE trained here on prompt-like lines with the Ling pre-tokenizer split (the regex the
engine's Ling tokenizer follows), the 256 byte tokens at 0 … 255, the learned merges after them,
the specials at their ids and unreachable fillers everywhere else. Every weight is drawn from one
seeded generator (not from a library's init), so the same arguments write the same bytes.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import torch

from trainer_core.base.atomic import atomic_path, atomic_write_json, atomic_write_text
from trainer_core.packs.common.tiny_models import added_tokens, byte_level_bpe_json, demo_prompts, train_byte_bpe
from trainer_core.packs.ming_image.ling import THINKER_PREFIX, LingConfig, LingThinker
from trainer_core.packs.ming_image.template import (IMAGE_END, IMAGE_PATCH, IMAGE_START, SUFFIX, SYSTEM_PREFIX,
                                                    check_template)

__all__ = ["LING_SPLIT_PATTERN", "VOCAB_SIZE", "SPECIAL_IDS", "tiny_llm_config", "write_tiny_ling_tokenizer",
           "write_tiny_ming"]

# The Ling specials the tiny tokenizer carries, at the real ids as far as they are known: the image
# ids are the engine's; BOS/EOS those of the engine's Ling tokenizer; the role ids are guesses from
# the reference mock's stand-in prefix, unconfirmed (the real tokenizer.json is not available offline).
SPECIAL_IDS: dict[str, int] = {
    "<|startoftext|>": 156891,      # engine ling_tokenizer.cpp BOS
    "<|endoftext|>": 156892,        # engine ling_tokenizer.cpp EOS / PAD / UNK
    "<|role_end|>": 156895,         # guess (reference mock), unconfirmed
    "<role>": 157151,               # guess (reference mock), unconfirmed
    "</role>": 157152,              # guess (reference mock), unconfirmed
    "<imagePatch>": IMAGE_PATCH,
    "<image>": IMAGE_START,
    "</image>": IMAGE_END,
}

# The Ling-mini-2.0 pre-tokenizer split as the engine's hand-written one reads it (contractions
# lowercase only, single digits).
LING_SPLIT_PATTERN = (r"'(?:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
                      r"|\s*[\r\n]|\s+(?!\S)|\s+")
VOCAB_SIZE = 157184
_BPE_SIZE = 1024
_TEXT_SEED = 20
_NORMS = ("norm", "ln_q", "proj_directvlm.0")      # 1-D weights that scale: drawn around 1
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def _training_lines(n: int = 300) -> list[str]:
    """Prompt-like English plus the template's own words, so they come out as few tokens."""
    rng = random.Random(_TEXT_SEED)
    lines = list(demo_prompts(n))
    words = SYSTEM_PREFIX + SUFFIX
    for name in SPECIAL_IDS:
        words = words.replace(name, " ")
    lines += [words] * 20 + ["a sheep in sunglasses", "make it night", "Add snow, heavy", "Layer 1: x"] * 5
    lines += [f"make it {rng.choice(['night', 'snowy', 'red', 'brighter'])}: {rng.choice(lines[:n])}" for _ in range(n)]
    return lines


def _trained_vocab() -> tuple[dict[str, int], list[str]]:
    """(vocab of VOCAB_SIZE ids, merges): bytes, learned merges, the specials at their ids, fillers."""
    vocab, merges = train_byte_bpe(_training_lines(), LING_SPLIT_PATTERN, _BPE_SIZE)
    specials = {i: name for name, i in SPECIAL_IDS.items()}
    # added tokens take the id the model's vocabulary gives them, so every id has an entry: the
    # specials by name, the rest fillers that no merge produces
    for i in range(len(vocab), VOCAB_SIZE):
        name = specials.get(i, f"<|unused_{i}|>")
        if name in vocab:
            raise RuntimeError(f"the tiny Ling vocabulary already holds {name!r}; this is a bug")
        vocab[name] = i
    return vocab, merges


def _tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict[str, Any]:
    added = added_tokens([(i, name, True) for name, i in sorted(SPECIAL_IDS.items(), key=lambda kv: kv[1])])
    return byte_level_bpe_json(vocab, merges, LING_SPLIT_PATTERN, added)


def write_tiny_ling_tokenizer(folder: str | os.PathLike) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json of the tiny Ling BPE
    into `folder` (checked against the template first); returns the folder."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    text = json.dumps(_tokenizer_json(*_trained_vocab()), ensure_ascii=False) + "\n"
    tokenizer = Tokenizer.from_str(text)
    check_template(lambda s: tokenizer.encode(s, add_special_tokens=False).ids)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "tokenizer.json", text)
    roles = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    decoder = {str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                        "special": True} for name, i in SPECIAL_IDS.items()}
    atomic_write_json(folder / "tokenizer_config.json", {
        **roles, "added_tokens_decoder": decoder, "clean_up_tokenization_spaces": False, "model_max_length": 32768,
        "tokenizer_class": "PreTrainedTokenizerFast"})
    atomic_write_json(folder / "special_tokens_map.json", roles)
    return folder


def tiny_llm_config(hidden: int = 64, layers: int = 3, head_dim: int = 128) -> dict[str, Any]:
    """The tiny thinker's llm_config (every key read_ling_config asks for)."""
    return {"hidden_size": hidden, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim,
            "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-6, "first_k_dense_replace": 1,
            "intermediate_size": 2 * hidden, "moe_intermediate_size": hidden // 2, "num_experts": 8,
            "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
            "num_shared_experts": 1, "vocab_size": VOCAB_SIZE, "num_hidden_layers": layers, "rope_theta": 600000.0,
            "model_type": "bailing_moe_v2"}


def _randomized(state: dict[str, torch.Tensor], gen: torch.Generator, dtype: torch.dtype
                ) -> dict[str, torch.Tensor]:
    """Fresh values for every tensor, in name order: norm weights 1 + N(0, 0.1²), other vectors
    N(0, 0.1²), matrices N(0, 1/fan_in); stored in `dtype` (expert biases in float32)."""
    out = {}
    for name in sorted(state):
        shape = state[name].shape
        if len(shape) == 1:
            value = torch.randn(shape, generator=gen) * 0.1 + (1.0 if any(n in name for n in _NORMS) else 0.0)
        else:
            value = torch.randn(shape, generator=gen) / shape[1:].numel() ** 0.5
        out[name] = value.to(torch.float32 if name.endswith("expert_bias") else dtype).contiguous()
    return out


def _save_sharded(folder: Path, state: dict[str, torch.Tensor]) -> None:
    """One shard, model-00001-of-00001.safetensors, and its index."""
    from safetensors.torch import save_file
    name = "model-00001-of-00001.safetensors"
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / name) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in state.values())
    atomic_write_json(folder / "model.safetensors.index.json",
                      {"metadata": {"total_size": total}, "weight_map": {k: name for k in sorted(state)}})


def _vision_state(vision_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    with torch.device("meta"):
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(Qwen2_5_VLVisionConfig(**vision_config))
    return {f"vision.{k}": v for k, v in tower.state_dict().items()}


def _connector_shapes(config: dict[str, Any]) -> dict[str, torch.Tensor]:
    from transformers import Qwen2Config, Qwen2Model
    with torch.device("meta"):
        model = Qwen2Model(Qwen2Config.from_dict(config))
    return {f"model.{k}": v for k, v in model.state_dict().items()}


def write_tiny_ming(root: str | os.PathLike, hidden: int = 64, layers: int = 3, taps: tuple[int, ...] = (1, 2, 3),
                    head_dim: int = 128, connector_width: int = 32, connector_layers: int = 2, cap_dim: int = 2560,
                    direct_dim: int = 3840, vision_hidden: int = 32, vision_out: int = 48, seed: int = 0,
                    vision: dict | None = None) -> Path:
    """Write the tiny snapshot under `root` (see the module docstring); returns root. About 21 MB,
    nearly all of it the 157184-row embedding table. `vision` overrides vision_config fields (the engine
    check's tower has the engine's 16 heads)."""
    root = Path(root)
    gen = torch.Generator().manual_seed(seed)
    llm = tiny_llm_config(hidden, layers, head_dim)
    vision = {"depth": 2, "hidden_size": vision_hidden, "hidden_act": "silu", "intermediate_size": 2 * vision_hidden,
              "num_heads": 2, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "window_size": 112, "out_hidden_size": vision_out, "fullatt_block_indexes": [1], **(vision or {})}
    with torch.device("meta"):
        thinker = LingThinker(LingConfig(**{k: v for k, v in llm.items() if k != "model_type"}))
    shapes = {THINKER_PREFIX + k: v for k, v in thinker.state_dict().items()}
    shapes |= _vision_state(vision)
    shapes |= {"linear_proj.0.weight": torch.empty(hidden, vision_out), "linear_proj.0.bias": torch.empty(hidden),
               "linear_proj.2.weight": torch.empty(hidden, hidden), "linear_proj.2.bias": torch.empty(hidden)}
    mllm = root / "mllm"
    _save_sharded(mllm, _randomized(shapes, gen, torch.bfloat16))
    atomic_write_json(mllm / "config.json", {"architectures": ["BailingMM2NativeForConditionalGeneration"],
                                             "llm_config": llm, "vision_config": vision})
    atomic_write_json(mllm / "preprocessor_config.json", {
        "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 451584, "max_pixels": 451584,
        "image_mean": _CLIP_MEAN, "image_std": _CLIP_STD})
    write_tiny_ling_tokenizer(mllm)

    connector = {"architectures": ["Qwen2Model"], "model_type": "qwen2", "hidden_size": connector_width,
                 "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 2 * connector_width,
                 "rms_norm_eps": 1e-6, "num_hidden_layers": connector_layers, "rope_theta": 1000000.0,
                 "vocab_size": 64, "max_position_embeddings": 32768, "hidden_act": "silu", "use_sliding_window": False,
                 "torch_dtype": "float32"}
    shapes = _connector_shapes(connector)
    _save_sharded(root / "connector", _randomized(shapes, gen, torch.float32))
    atomic_write_json(root / "connector" / "config.json", connector)

    wide = len(taps) * hidden
    mlp = {"query_tokens_dict.16x16": torch.empty(256, hidden), "proj_in.weight": torch.empty(connector_width, hidden),
           "proj_in.bias": torch.empty(connector_width), "proj_out.weight": torch.empty(cap_dim, connector_width),
           "proj_out.bias": torch.empty(cap_dim), "proj_directvlm.0.weight": torch.empty(wide),
           "proj_directvlm.1.weight": torch.empty(direct_dim, wide), "proj_directvlm.1.bias": torch.empty(direct_dim)}
    from safetensors.torch import save_file
    (root / "mlp").mkdir(parents=True, exist_ok=True)
    with atomic_path(root / "mlp" / "model.safetensors") as tmp:
        save_file(_randomized(mlp, gen, torch.float32), str(tmp), metadata={"format": "pt"})
    atomic_write_json(root / "mlp" / "config.json", {
        "selected_hidden_states_layers": list(taps), "connector_norm": False, "diffusion_c_input_dim": cap_dim,
        "diffusion_inner_dim": direct_dim})
    return root


def write_tiny_stock_mmproj(path: str | os.PathLike, ming_root: str | os.PathLike) -> Path:
    """The demo's stand-in for a stock Qwen2.5-VL mmproj: the tiny snapshot's own vision tower (the Ming
    tower is a Qwen2.5-VL tower) written in llama.cpp's mmproj layout, f16; its rows are the Ling rows
    before linear_proj, so the vis_bridge has a mapping to learn."""
    from trainer_core.packs.ming_image.stock_vision import write_mmproj
    from trainer_core.packs.ming_image.vision import MingVision
    tower = MingVision.load(Path(ming_root) / "mllm").vision
    with atomic_path(path) as tmp:
        write_mmproj(tmp, tower, n_wa_pattern=2)
    return Path(path)
