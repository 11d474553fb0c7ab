"""A tiny random Qwen3.5 snapshot (the bridge pack's demo teacher and the tests').

The real architecture at toy widths: a hybrid text stack (Gated-DeltaNet linear-attention layers
and a full-attention layer, M-RoPE), the Qwen3.5 vision tower with its 2 × 2 merger, no deepstack;
the real vocabulary size (248320) so the special ids are the real ones. The tokenizer is a small
byte-level BPE trained here on generated prompt-like English, in the Qwen3.5 tokenizer.json
format: the 256 byte tokens first in GPT-2 order (so "\\n" is 198, as in every Qwen BPE), the
learned merges after them, and the 33 specials as added tokens at 248044 … 248076. Only its
ordinary ids differ from the real tokenizer's ("user" is not 846 here).
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

from trainer_core.base.atomic import atomic_write_json, atomic_write_text
from trainer_core.packs.common.tiny_models import added_tokens, byte_level_bpe_json, demo_prompts, train_byte_bpe
from trainer_core.packs.qwen35_bridge.template import (FIRST_SPECIAL_ID, NEWLINE, PREFIX, SPECIAL_TOKENS, SUFFIX,
                                                       check_template)

__all__ = ["write_tiny_qwen35", "write_tiny_tokenizer", "QWEN35_SPLIT_PATTERN"]

# Qwen3.5's pre-tokenizer split (transformers' Qwen3_5Tokenizer): Qwen2's with combining marks in words.
QWEN35_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                        r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_VOCAB_SIZE = 248320
_BPE_SIZE = 1024                    # byte tokens + learned merges
_TEXT_SEED = 35
# The <|…|> specials are special; the tag-like ones (<think>, <tool_call>, <tts_pad>, …) are added but not.
_SPECIAL_FLAGS = tuple(name.startswith("<|") for name in SPECIAL_TOKENS)


def _training_lines(n: int = 400) -> list[str]:
    """Prompt-like English plus the chat words the template needs as single tokens."""
    rng = random.Random(_TEXT_SEED)
    lines = list(demo_prompts(n))
    for i in range(n // 2):
        lines.append("user")
        lines.append("assistant")
        lines.append(f"user asks the assistant for image {i}: {rng.choice(lines[:n])}")
    lines += ["Add snow, heavy.", "Make it night!", "put the ball from Image 1 into Image 2", "a cat, 35mm; f/1.8"]
    return lines


def _byte_level_json(vocab: dict[str, int], merges: list[str]) -> dict:
    """tokenizer.json of a Qwen3.5-format byte-level BPE with the 33 specials added at 248044 …"""
    added = added_tokens([(FIRST_SPECIAL_ID + i, name, special)
                          for i, (name, special) in enumerate(zip(SPECIAL_TOKENS, _SPECIAL_FLAGS))])
    return byte_level_bpe_json(vocab, merges, QWEN35_SPLIT_PATTERN, added, nfc=True)


def _trained_bpe() -> tuple[dict[str, int], list[str]]:
    """(vocab, merges): the 256 byte tokens at ids 0 … 255 in GPT-2 order, one id per merge in the
    order the trainer learned them, unreachable fillers up to 248043."""
    vocab, merges = train_byte_bpe(_training_lines(), QWEN35_SPLIT_PATTERN, _BPE_SIZE, nfc=True)
    # tokenizers numbers added tokens from the model's vocabulary size, so the ids up to the first
    # special are filled with entries no merge can produce (llama.cpp's names for unused ids)
    vocab.update({f"[PAD{i}]": i for i in range(len(vocab), FIRST_SPECIAL_ID)})
    return vocab, merges


def write_tiny_tokenizer(folder: str | os.PathLike) -> Path:
    """Write tokenizer.json and tokenizer_config.json of the tiny Qwen3.5-format BPE; returns the folder.
    The MOSS template is checked on it before anything is written."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    text = json.dumps(_byte_level_json(*_trained_bpe()), ensure_ascii=False, indent=1) + "\n"
    tokenizer = Tokenizer.from_str(text)
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    check_template(encode, "tiny teacher")
    if encode("\n") != [NEWLINE] or len(encode(PREFIX + SUFFIX)) != 10:
        raise RuntimeError("the tiny Qwen3.5 tokenizer does not reproduce the MOSS template; this is a bug")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "tokenizer.json", text)
    decoder = {str(FIRST_SPECIAL_ID + i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": special}
               for i, (name, special) in enumerate(zip(SPECIAL_TOKENS, _SPECIAL_FLAGS))}
    atomic_write_json(folder / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 262144, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen3_5Tokenizer", "unk_token": None})
    return folder


def write_tiny_qwen35(folder: str | os.PathLike, hidden: int = 64, layers: int = 4, vision_hidden: int = 32,
                      vision_depth: int = 1, out_hidden: int | None = None, seed: int = 0) -> Path:
    """Write a small random Qwen3.5 snapshot laid out like Qwen/Qwen3.5-9B (config.json,
    model.safetensors in bf16, preprocessor_config.json, tokenizer.json, tokenizer_config.json);
    returns the folder. Every fourth text layer is full attention, the others Gated-DeltaNet (layers
    = 4: three linear, one full). `out_hidden` is the vision tower's output width (vis_dim; default
    `hidden`). About 32 MB, nearly all of it the 248320-row embedding table (tied to the LM head)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    folder = Path(folder)
    heads = max(2, hidden // 16)
    config = Qwen3_5Config(
        text_config={"vocab_size": _VOCAB_SIZE, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                     "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads // 2,
                     "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                     "linear_num_key_heads": heads // 2, "linear_num_value_heads": heads,
                     "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                     for i in range(layers)],
                     "max_position_embeddings": 8192, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
                     "eos_token_id": 248046,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                         "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
                                         "mrope_interleaved": True}},
        vision_config={"depth": vision_depth, "hidden_size": vision_hidden, "intermediate_size": 2 * vision_hidden,
                       "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "in_channels": 3, "out_hidden_size": out_hidden or hidden, "num_position_embeddings": 2304},
        tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3_5ForConditionalGeneration(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="1GB")     # one model.safetensors
    write_tiny_tokenizer(folder)
    atomic_write_json(folder / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
        "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "size": {"shortest_edge": 65536, "longest_edge": 16777216}})
    return folder
