"""A tiny random Qwen3-VL snapshot (the image packs' demo teacher and the tests')."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from trainer_core.base.atomic import atomic_write_json
from trainer_core.packs.common.tiny_models import write_qwen_tokenizer

__all__ = ["write_tiny_qwen3vl"]

_QWEN3VL_SEED = 11


def write_tiny_qwen3vl(folder: str | os.PathLike, hidden: int = 64, layers: int = 3, vision_hidden: int = 32,
                       vision_depth: int = 2, text: dict | None = None, vision: dict | None = None,
                       dtype: torch.dtype = torch.float32, max_shard_size: str = "20MB") -> Path:
    """Write a small random Qwen3-VL snapshot laid out like Qwen/Qwen3-VL-4B-Instruct (sharded
    safetensors with their index, config, generation and preprocessor configs, the Qwen BPE, a chat
    template); returns the folder. The real architecture (deepstack, M-RoPE sections, the 2×2 merger)
    at toy widths, with the real vocabulary so the special-token ids are the real ones. `text` and
    `vision` override config fields (bench/gpu.py builds the published configs with them), `dtype`
    is the weights' dtype on disk."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    folder = Path(folder)
    config = Qwen3VLConfig(
        text_config={"vocab_size": 151936, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                     "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 4096, "tie_word_embeddings": True,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True}, **(text or {})},
        vision_config={"depth": vision_depth, "hidden_size": vision_hidden, "intermediate_size": 2 * vision_hidden,
                       "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "in_channels": 3, "out_hidden_size": hidden, "deepstack_visual_indexes": [0, 1],
                       "num_position_embeddings": 2304, **(vision or {})},
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=(text or {}).get("tie_word_embeddings", True))
    previous = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_QWEN3VL_SEED)
        torch.set_default_dtype(dtype)          # built in the file's dtype: an 8B model is 16 GB in bf16
        try:
            model = Qwen3VLForConditionalGeneration(config)
        finally:
            torch.set_default_dtype(previous)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, max_shard_size=max_shard_size)    # model-0000i-of-0000n + the index, as released
    write_qwen_tokenizer(folder)
    atomic_write_json(folder / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
        "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
    atomic_write_json(folder / "chat_template.json", {"chat_template": "{% for m in messages %}{{ m['content'] }}"
                                                                        "{% endfor %}"})
    return folder
