"""A tiny but real T5 v1.1 encoder snapshot (the demo's teacher and the tests'): laid out like
`callgg/t5-v1_1-xxl-encoder-bf16`, its sentencepiece model trained on the given texts."""
from __future__ import annotations

import io
import os
from pathlib import Path

import sentencepiece as spm
import torch
from transformers import T5Config, T5EncoderModel

from trainer_core.base.atomic import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text

__all__ = ["T5_EXTRA_IDS", "write_tiny_t5"]

T5_EXTRA_IDS = 100   # T5's sentinels <extra_id_0..99>: the ids after the pieces, <extra_id_0> last
_T5_SPECIALS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}  # ids 0, 1, 2
_SPM_SEED = 5489     # sentencepiece's own default seed, set explicitly
_T5_WEIGHTS_SEED = 0


def write_tiny_t5(folder: str | os.PathLike, texts: list[str], d_model: int = 64, layers: int = 2,
                  heads: int = 4, d_kv: int = 16, d_ff: int = 128, vocab_pieces: int | None = None,
                  dtype: torch.dtype = torch.float32) -> Path:
    """Write a small random T5 v1.1 encoder snapshot into `folder`; returns the folder.

    The files are those of callgg/t5-v1_1-xxl-encoder-bf16: spiece.model (a unigram model
    trained on `texts` with T5's ids: <pad> 0, </s> 1, <unk> 2, no BOS), tokenizer_config.json,
    special_tokens_map.json, config.json and model.safetensors (gated-GELU, float32). The
    vocabulary is the pieces plus the 100 sentinels; `vocab_pieces` None takes as many pieces
    as the texts support, up to 2000. The same arguments give byte-identical files. `dtype` is the
    weights' dtype on disk (bench/gpu.py writes T5-XXL's widths in bf16).
    """
    folder = Path(folder)
    spiece = _train_t5_spiece(texts, vocab_pieces)
    pieces = spm.SentencePieceProcessor(model_proto=spiece).get_piece_size()
    sentinels = [f"<extra_id_{i}>" for i in range(T5_EXTRA_IDS)]
    atomic_write_bytes(folder / "spiece.model", spiece)
    atomic_write_json(folder / "special_tokens_map.json",
                      {**_T5_SPECIALS, "additional_special_tokens": sentinels})
    atomic_write_json(folder / "tokenizer_config.json", {
        **_T5_SPECIALS, "additional_special_tokens": sentinels, "extra_ids": T5_EXTRA_IDS,
        "model_max_length": 512, "tokenizer_class": "T5Tokenizer",
    })
    config = T5Config(vocab_size=pieces + T5_EXTRA_IDS, d_model=d_model, d_kv=d_kv, d_ff=d_ff,
                      num_layers=layers, num_heads=heads, feed_forward_proj="gated-gelu",
                      is_encoder_decoder=False, use_cache=False, architectures=["T5EncoderModel"])
    with torch.random.fork_rng(devices=[]):   # seeded weights without moving the caller's RNG
        torch.manual_seed(_T5_WEIGHTS_SEED)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = T5EncoderModel(config)
        finally:
            torch.set_default_dtype(previous)
    from safetensors.torch import save_file
    atomic_write_text(folder / "config.json", config.to_json_string(use_diff=True))
    # the embedding is tied (shared.weight); one metadata key only: safetensors writes its
    # metadata map in hash order, so more keys would make the bytes differ from run to run
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    with atomic_path(folder / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    return folder


def _train_t5_spiece(texts: list[str], vocab_pieces: int | None) -> bytes:
    """A serialized unigram sentencepiece model of `texts`, reproducible: one thread, the
    texts in the order given, a fixed seed."""
    sentences = [t for t in texts if t.strip()]
    if not sentences:
        raise ValueError("write_tiny_t5 needs at least one non-empty text to train its tokenizer")
    model = io.BytesIO()
    spm.set_random_generator_seed(_SPM_SEED)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type="unigram",
        vocab_size=vocab_pieces or 2000, hard_vocab_limit=vocab_pieces is not None,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
        unk_piece="<unk>", character_coverage=1.0, byte_fallback=False,
        num_threads=1, shuffle_input_sentence=False, input_sentence_size=0, minloglevel=2)
    return model.getvalue()


