"""A tiny LLaDA-Image-Turbo snapshot (the tests' teacher): a remote-code backbone with the 4.x
rotary habits (`tiny_model/`), QueryFormer and text_projection weights; and a small SigVQ file."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from trainer_core.base.atomic import atomic_path, atomic_write_json, atomic_write_text
from trainer_core.packs.common.tiny_models import write_qwen_tokenizer

__all__ = ["write_tiny_llada", "write_tiny_sigvq"]

_LLADA_WEIGHTS_SEED = 7


def write_tiny_llada(folder: str | os.PathLike, hidden: int = 32, layers: int = 2, heads: int = 4, head_dim: int = 8,
                     num_queries: int = 256, proj_dim: int = 48, qf_heads: int = 4, qf_inner: int = 64,
                     tp_layers: int = 2, tp_heads: int = 4, tp_inner: int = 64, vocab_size: int = 151936,
                     intermediate: int | None = None, backbone: dict | None = None,
                     dtype: torch.dtype = torch.float32) -> Path:
    """Write a small LLaDA-Image-Turbo snapshot into `folder`; returns the folder.
    `backbone` adds TinyLLaDAConfig fields (num_key_value_heads, the MoE ones: bench/gpu.py builds the
    real config's size with them); `dtype` is the weights' dtype on disk (the real snapshot's is bf16).

    The layout is the real one: model_index.json; tokenizer/ (the Qwen BPE, standing in for
    LLaDA's); text_encoder/ (config.json with `auto_map`, the remote code of
    trainer_core/tiny_llada, model.safetensors); queryformer/ and text_projection/ (config.json
    and diffusion_pytorch_model.safetensors in the plain-torch layout the teacher loads
    strictly). Random weights from a fixed seed; the caller's RNG is left alone."""
    from safetensors.torch import save_file

    from trainer_core.packs.llada_image.teacher import WEIGHTS_FILE, QueryFormer, TextProjection
    from trainer_core.packs.common.rope_guard import default_rope
    from trainer_core.packs.llada_image.tiny_model import configuration_tiny_llada, modeling_tiny_llada

    folder = Path(folder)
    write_qwen_tokenizer(folder / "tokenizer")
    atomic_write_json(folder / "model_index.json", {"_class_name": "LLaDAImagePipeline", "text_encoder": ["", ""],
                                                    "queryformer": ["", ""], "text_projection": ["", ""]})
    encoder = folder / "text_encoder"
    for module in (configuration_tiny_llada, modeling_tiny_llada):
        atomic_write_text(encoder / Path(module.__file__).name, Path(module.__file__).read_text(encoding="utf-8"))
    config = configuration_tiny_llada.TinyLLaDAConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, head_dim=head_dim, **(backbone or {}))
    qf_config = {"hidden_size": hidden, "num_queries": num_queries, "num_attention_heads": qf_heads,
                 "intermediate_size": qf_inner, "norm_eps": 1e-6, "num_hidden_layers": 1}
    tp_config = {"hidden_size": hidden, "intermediate_size": tp_inner, "num_attention_heads": tp_heads,
                 "norm_eps": 1e-6, "num_hidden_layers": tp_layers, "projection_dim": proj_dim}
    previous = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_LLADA_WEIGHTS_SEED)
        torch.set_default_dtype(dtype)          # built in the file's dtype: the real size has 16B weights
        try:
            with default_rope():            # the remote code asks for the "default" rope type
                backbone = modeling_tiny_llada.TinyLLaDAForEncoding(config)
            small = {"queryformer": (QueryFormer(qf_config, blocks="layers"), qf_config),
                     "text_projection": (TextProjection(tp_config), tp_config)}
            for module, _ in small.values():
                for name, p in module.named_parameters():
                    p.data = (torch.randn_like(p) * (0.02 if name.endswith("bias") else 1.0 / p.shape[-1] ** 0.5)
                              if p.dim() > 1 or name.endswith("bias") else torch.randn_like(p))
        finally:
            torch.set_default_dtype(previous)
    atomic_write_json(encoder / "config.json", {
        **config.to_diff_dict(), "architectures": ["TinyLLaDAForEncoding"],
        "auto_map": {"AutoConfig": "configuration_tiny_llada.TinyLLaDAConfig",
                     "AutoModel": "modeling_tiny_llada.TinyLLaDAForEncoding"}})
    with atomic_path(encoder / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in backbone.state_dict().items()}, str(tmp), metadata={"format": "pt"})
    for sub, (module, module_config) in small.items():
        atomic_write_json(folder / sub / "config.json", module_config)
        with atomic_path(folder / sub / WEIGHTS_FILE) as tmp:
            save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(tmp), metadata={"format": "pt"})
    return folder


def write_tiny_sigvq(folder: str | os.PathLike) -> Path:
    """A small random `sigvq/diffusion_pytorch_model.safetensors` under `folder` (bf16 and f32
    tensors, as the real file mixes them); returns the file."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(_LLADA_WEIGHTS_SEED)
    state = {
        "patch_embed.proj.weight": torch.randn(32, 3, 4, 4, generator=g).to(torch.bfloat16),
        "patch_embed.proj.bias": torch.randn(32, generator=g),
        "blocks.0.attn.qkv.weight": torch.randn(96, 32, generator=g).to(torch.bfloat16),
        "blocks.0.norm1.weight": torch.ones(32),
        "quantizer.codebook": torch.randn(64, 16, generator=g).to(torch.bfloat16),
    }
    path = Path(folder) / "sigvq" / "diffusion_pytorch_model.safetensors"
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    return path


