"""The vision contract of the MageFlow-Edit pack: prompt strings, image slots, reference images.

What the engine (ggk 0.9.7, `conditioner.hpp` mage_flow) builds, so the teacher, the student
and the adapter see exactly what they will see at inference:

* **Templates.** A text-to-image sample is T2I_PREFIX (34 tokens) + text + SUFFIX; an edit
  sample is EDIT_PREFIX (64 tokens) + per image "Image N: <|vision_start|>" (6 tokens) +
  n × <|image_pad|> + <|vision_end|>, then the text and SUFFIX. The first image's slots start
  at 70 and each next block 1 + n + 6 later. The engine slices its output from 64 (edit) or 34
  (t2i). `check_templates` refuses a tokenizer whose counts differ, with the numbers.
* **Reference images.** Each side is rounded to a multiple of 32 (std::round, half away from
  zero); when the long side exceeds 384 both are scaled by β = 384 / long side in double
  precision and floored to multiples of 32 (at least 32). This is ggk 0.9.7's arithmetic; the
  published trainer computes β in float32 with Python's round and differs on 177 of the long
  sides 385…2048 and on sides ≡ 16 (mod 64) below 384 — the engine is what the adapter meets.
  Then `clip_preprocess`: aspect-preserving nearest resize (scale in float32), edge pad when
  one pixel short, centre crop, clamp to 0…1, OpenAI-CLIP mean/std. Tokens = (w/32)·(h/32).
* **Patches** are Qwen2-VL's: 16-pixel patches, 2×2 merge windows, the frame doubled over the
  temporal patch of 2, rows ordered merge-window-major, 1536 values a row.
"""
from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.prompt_attention import parse_prompt_attention

__all__ = [
    "EDIT_PREFIX", "T2I_PREFIX", "SUFFIX", "EDIT_START", "T2I_START", "HEADER_TOKENS", "SUFFIX_IDS",
    "IMAGE_PAD", "VISION_START", "VISION_END", "FIRST_SLOT", "MAX_SIDE", "FACTOR", "CLIP_MEAN", "CLIP_STD",
    "PATCH", "MERGE", "TEMPORAL", "header", "sample_string", "sample_chunks", "encode_chunks", "Sample", "build_sample",
    "check_templates", "token_runs",
    "llround", "target_size", "image_tokens", "merged_tokens", "load_rgb", "clip_preprocess", "preprocess",
    "patchify",
]

EDIT_PREFIX = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n")
T2I_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
    "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
EDIT_START, T2I_START, HEADER_TOKENS = 64, 34, 6          # token counts the engine relies on
SUFFIX_IDS = (151645, 198, 151644, 77091, 198)
IMAGE_PAD, VISION_START, VISION_END = 151655, 151652, 151653
FIRST_SLOT = EDIT_START + HEADER_TOKENS                     # 70

MAX_SIDE, FACTOR = 384, 32
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PATCH, MERGE, TEMPORAL = 16, 2, 2


# ---------------------------------------------------------------- prompt strings

def header(index: int) -> str:
    """The block header of image `index` (0-based): "Image 1: <|vision_start|>"."""
    return f"Image {index + 1}: <|vision_start|>"


def sample_string(text: str, image_tokens: Sequence[int] = ()) -> str:
    """The whole prompt string of a sample with one entry of `image_tokens` per image."""
    if not image_tokens:
        return T2I_PREFIX + text + SUFFIX
    blocks = "".join(header(i) + "<|image_pad|>" * n + "<|vision_end|>" for i, n in enumerate(image_tokens))
    return EDIT_PREFIX + blocks + text + SUFFIX


def sample_chunks(text: str, image_tokens: Sequence[int] = ()) -> list[str]:
    """The pieces the engine encodes one by one: the prefix (with the image blocks when editing),
    the text split by the attention parse (none for an empty text), the suffix."""
    head = sample_string("", image_tokens)[:-len(SUFFIX)]
    return [head, *(chunk for chunk, _ in parse_prompt_attention(text) if text), SUFFIX]


def encode_chunks(tokenizer: Any, chunks: Sequence[str]) -> list[int]:
    """Chunks encoded one by one: the engine's tokenizer (EngineBPE) or, for a teacher's check, a
    Hugging Face one."""
    if hasattr(tokenizer, "encode_chunks"):
        return tokenizer.encode_chunks(chunks)
    return [i for chunk in chunks for i in tokenizer.encode(chunk, add_special_tokens=False).ids]


@dataclass(frozen=True)
class Sample:
    ids: list[int]
    slots: list[tuple[int, int]]     # (first <|image_pad|> position, token count) per image
    sup_start: int                   # where the engine's slice starts: 64 edit, 34 text-to-image


def build_sample(tokenizer: Any, text: str, image_tokens: Sequence[int] = (), what: str = "student") -> Sample:
    """Token ids (the engine's chunks, no special tokens added) and image slots; the slot positions
    are checked against the ids (a tokenizer that merges across a marker is refused)."""
    ids = encode_chunks(tokenizer, sample_chunks(text, image_tokens))
    slots, start = [], FIRST_SLOT
    for n in image_tokens:
        ok = (start + n < len(ids) and ids[start - 1] == VISION_START and ids[start + n] == VISION_END
              and all(t == IMAGE_PAD for t in ids[start:start + n]))
        if not ok:
            raise ModelFileError(f"The {what} tokenizer does not place image slots where the engine does (an image "
                                 f"of {n} tokens at {start}); use the pig_clip / Qwen3 tokenizer files.")
        slots.append((start, n))
        start += n + 1 + HEADER_TOKENS
    return Sample(ids, slots, EDIT_START if image_tokens else T2I_START)


def check_templates(tokenizer: Any, what: str) -> None:
    """Refuse a tokenizer whose template counts differ from the engine's (64 / 34 / 6, the
    suffix ids), naming the numbers."""
    def count(s: str) -> list[int]:
        return tokenizer.encode(s, add_special_tokens=False).ids
    found = {"edit prefix": (len(count(EDIT_PREFIX)), EDIT_START), "t2i prefix": (len(count(T2I_PREFIX)), T2I_START)}
    for n in (1, 2, 3):
        found[f"header {n}"] = (len(count(header(n - 1))), HEADER_TOKENS)
    wrong = [f"{k} {have} tokens (the engine's: {want})" for k, (have, want) in found.items() if have != want]
    if tuple(count(SUFFIX)) != SUFFIX_IDS:
        wrong.append(f"suffix ids {count(SUFFIX)} (the engine's: {list(SUFFIX_IDS)})")
    if wrong:
        raise ModelFileError(f"The {what} tokenizer does not give the MageFlow templates the engine builds: "
                             f"{'; '.join(wrong)}. Use the Qwen3 / pig_clip tokenizer files.")


# ---------------------------------------------------------------- reference images

def token_runs(ids: Sequence[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of every run of `token` in `ids` (the image slots of a template)."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == token:
            j = i
            while j < len(ids) and ids[j] == token:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs


def llround(x: float) -> int:
    """std::llround: to the nearest integer, halves away from zero."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def target_size(width: int, height: int) -> tuple[int, int]:
    """(w_bar, h_bar): ggk 0.9.7's reference-image size (double precision, see the module doc)."""
    if width < 1 or height < 1:
        raise ValueError(f"an image must have positive sides, got {width}×{height}")
    w_bar = max(FACTOR, llround(width / FACTOR) * FACTOR)
    h_bar = max(FACTOR, llround(height / FACTOR) * FACTOR)
    longest = max(width, height)
    if longest > MAX_SIDE:
        beta = MAX_SIDE / longest                                       # a Python float is a C double
        w_bar = max(FACTOR, math.floor(width * beta / FACTOR) * FACTOR)
        h_bar = max(FACTOR, math.floor(height * beta / FACTOR) * FACTOR)
    return w_bar, h_bar


def image_tokens(width: int, height: int) -> int:
    w_bar, h_bar = target_size(width, height)
    return (w_bar // FACTOR) * (h_bar // FACTOR)


def merged_tokens(image: np.ndarray) -> int:
    """Slots of a preprocessed [h, w, 3] image: one per 32 × 32 pixels."""
    return (image.shape[0] // FACTOR) * (image.shape[1] // FACTOR)


def load_rgb(source: str | os.PathLike | bytes) -> np.ndarray:
    """[H, W, 3] float32 in 0…1 (alpha dropped, not composited, as the engine does)."""
    from PIL import Image
    handle = io.BytesIO(source) if isinstance(source, bytes) else Path(source)
    with Image.open(handle) as img:
        return np.asarray(img.convert("RGB"), dtype=np.float32) / np.float32(255.0)


def _nearest(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Nearest resize with the engine's integer index: in = (out · in_size) // out_size."""
    h, w = image.shape[:2]
    rows = (np.arange(height) * h) // height
    cols = (np.arange(width) * w) // width
    return image[rows][:, cols]


def clip_preprocess(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """The engine's clip_preprocess to width × height: [H, W, 3] float32, normalized."""
    ih, iw = image.shape[:2]
    scale = np.float32(max(np.float32(width) / np.float32(iw), np.float32(height) / np.float32(ih)))
    rw, rh = int(scale * np.float32(iw)), int(scale * np.float32(ih))
    resized = _nearest(image, rw, rh)
    if rw < width or rh < height:                                   # one pixel short: edge pad
        resized = np.pad(resized, ((0, max(0, height - rh)), (0, max(0, width - rw)), (0, 0)), mode="edge")
        rh, rw = resized.shape[:2]
    top, left = (rh - height) // 2, (rw - width) // 2
    crop = np.clip(resized[top:top + height, left:left + width], 0.0, 1.0)
    return ((crop - np.asarray(CLIP_MEAN, np.float32)) / np.asarray(CLIP_STD, np.float32)).astype(np.float32)


def preprocess(source: str | os.PathLike | bytes) -> np.ndarray:
    """A reference image as the engine feeds the vision tower: [h_bar, w_bar, 3] float32."""
    image = load_rgb(source)
    w_bar, h_bar = target_size(image.shape[1], image.shape[0])
    return clip_preprocess(image, w_bar, h_bar)


def patchify(image: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(rows [gh·gw, 3·2·16·16] float32, grid_thw (1, gh, gw)) of a preprocessed [H, W, 3] image,
    in Qwen2-VL's merge-window-major order with the frame repeated over the temporal patch."""
    h, w = image.shape[:2]
    if h % (PATCH * MERGE) or w % (PATCH * MERGE):
        raise ValueError(f"the image must be a multiple of {PATCH * MERGE} pixels a side, got {w}×{h}")
    gh, gw = h // PATCH, w // PATCH
    frames = np.repeat(image.transpose(2, 0, 1)[None], TEMPORAL, axis=0)          # [T, C, H, W]
    x = frames.reshape(1, TEMPORAL, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)                                       # windows, then C, T, p, p
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * TEMPORAL * PATCH * PATCH)), (1, gh, gw)
