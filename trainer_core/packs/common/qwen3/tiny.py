"""A tiny random Qwen3 snapshot laid out like Qwen/Qwen3-4B (the Qwen3 families' demo teacher and the tests')."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from trainer_core.packs.common.tiny_models import tiny_qwen3_config, write_qwen_tokenizer

__all__ = ["write_tiny_qwen3"]

_SEED = 23


def write_tiny_qwen3(folder: str | os.PathLike, hidden: int = 48, layers: int = 4) -> Path:
    """Write a small random Qwen3ForCausalLM snapshot (config, generation config, model.safetensors — the
    real layout with the `model.` prefix — and the real Qwen BPE, so the special-token ids are the real ones);
    returns the folder. The real architecture (qk-norm, GQA, rope θ 1e6, tied embeddings) at toy widths."""
    from transformers import Qwen3ForCausalLM

    folder = Path(folder)
    config = tiny_qwen3_config(hidden_size=hidden, layers=layers, heads=4, kv_heads=2, head_dim=16,
                               intermediate=2 * hidden)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = Qwen3ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_qwen_tokenizer(folder)
    return folder
