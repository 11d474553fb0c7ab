"""The vision contract of the Qwen-Image 2.1 pack (engine-contract §3, packs-contract §B.3).

* **Template**, one for both modes: the 14-token system turn (the DiT drops it: the engine's
  slice starts at 14), "<|im_start|>user\\n", then per image "<imageN><|vision_start|>" (plain
  text, 4 BPE tokens; a space before the second and later blocks merges into their "<"), the
  <|image_pad|> run and <|vision_end|>, then the text — " " when it is empty, Qwen has no BOS —
  and the suffix. The first slot is at 22; an empty text-to-image sample is 23 tokens.
* **Consumed rows.** The DiT substitutes reference latents for the slot rows, so only the text
  rows from position 14 on are consumed; they are the only rows supervised and the only rows the
  target statistics see.
* **References** are resized to the render area: vw = √((A·w) // h) in double, vh = vw·h/w,
  each side rounded to 32 (Python round, at least 32); alpha is composited over white; a
  nearest resize straight to that size (no crop) and 2x − 1. One slot per 32 × 32 pixels.
* **The area** is drawn per sample from `corpus.ref_areas` by the SHA-1 of its image paths and
  text, so the same sample always gets the same size; two-image samples only draw among the areas
  up to `corpus.two_image_max_area` (the smallest area when none is that small).
"""
from __future__ import annotations

import hashlib
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.common.qwen3vl.vision_data import (FACTOR, IMAGE_PAD, SUFFIX, SUFFIX_IDS, VISION_END,
                                                           VISION_START, encode_chunks, token_runs)

__all__ = ["SYSTEM", "USER", "START", "SYSTEM_TOKENS", "FIRST_SLOT", "image_block", "sample_string", "sample_chunks",
           "Sample", "build_sample", "check_templates", "target_size", "choose_area", "load_rgb_over_white",
           "preprocess", "mean_slots"]

SYSTEM = "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n"
USER = "<|im_start|>user\n"
SYSTEM_TOKENS = START = 14                # the engine's slice starts here: the system turn is dropped
FIRST_SLOT = 22                           # 14 + 3 (user turn) + 4 ("<image1>") + 1 (<|vision_start|>)


def image_block(index: int, n: int) -> str:
    return ("" if index == 0 else " ") + f"<image{index + 1}><|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|>"


def sample_string(text: str, image_tokens: Sequence[int] = ()) -> str:
    blocks = "".join(image_block(i, n) for i, n in enumerate(image_tokens))
    return SYSTEM + USER + blocks + (text or " ") + SUFFIX


def sample_chunks(text: str, image_tokens: Sequence[int] = ()) -> list[str]:
    """The pieces the engine encodes one by one: system, user turn and image blocks; the text (a
    single space when empty) split by the attention parse; the suffix."""
    head = SYSTEM + USER + "".join(image_block(i, n) for i, n in enumerate(image_tokens))
    return [head, *(chunk for chunk, _ in parse_prompt_attention(text or " ")), SUFFIX]


@dataclass(frozen=True)
class Sample:
    ids: list[int]
    slots: list[tuple[int, int]]     # (first <|image_pad|> position, token count) per image
    sup_start: int = START


def build_sample(tokenizer: Any, text: str, image_tokens: Sequence[int] = (), what: str = "student") -> Sample:
    """Token ids and image slots (the runs of <|image_pad|>, checked against the requested counts
    and the vision markers around them)."""
    ids = encode_chunks(tokenizer, sample_chunks(text, image_tokens))
    slots = token_runs(ids, IMAGE_PAD)
    ok = ([n for _, n in slots] == list(image_tokens)
          and all(ids[s - 1] == VISION_START and s + n < len(ids) and ids[s + n] == VISION_END for s, n in slots))
    if not ok:
        raise ModelFileError(f"The {what} tokenizer does not give the image slots the engine builds "
                             f"({len(image_tokens)} image(s) of {list(image_tokens)} tokens, found runs "
                             f"{[n for _, n in slots]}); use the "
                             "pig_clip / Qwen3 tokenizer files.")
    return Sample(ids, slots)


def check_templates(tokenizer: Any, what: str) -> None:
    """Refuse a tokenizer whose system turn is not 14 tokens or whose suffix ids differ."""
    system = len(tokenizer.encode(SYSTEM, add_special_tokens=False).ids)
    suffix = tokenizer.encode(SUFFIX, add_special_tokens=False).ids
    wrong = [f"system turn {system} tokens (the engine drops {SYSTEM_TOKENS})"] if system != SYSTEM_TOKENS else []
    if tuple(suffix) != SUFFIX_IDS:
        wrong.append(f"suffix ids {suffix} (the engine's: {list(SUFFIX_IDS)})")
    if wrong:
        raise ModelFileError(f"The {what} tokenizer does not give the Qwen-Image 2.1 template the engine builds: "
                             f"{'; '.join(wrong)}. Use the Qwen3 / pig_clip tokenizer files.")


# ---------------------------------------------------------------- references

def target_size(width: int, height: int, area: int) -> tuple[int, int]:
    """(w_bar, h_bar) of a reference rendered at `area` pixels (multiples of 32, at least 32); area 0 =
    the image's own."""
    area = area or width * height
    if width < 1 or height < 1 or area < 1:
        raise ValueError(f"an image must have positive sides and area, got {width}×{height} at {area}")
    vw = math.sqrt(float((area * width) // height))
    vh = vw * height / width
    return max(FACTOR, round(vw / FACTOR) * FACTOR), max(FACTOR, round(vh / FACTOR) * FACTOR)


def mean_slots(ref_areas: Sequence[Sequence[float]], own: float) -> float:
    """A reference's slots on average over the weighted `ref_areas` (one per 32 × 32 pixels), for the
    estimates; `own` stands for an area of 0 (the image's own size, not known before it is read)."""
    total = sum(float(w) for _, w in ref_areas)
    if total <= 0:
        return float(own)
    return sum(float(w) * (int(a) / FACTOR**2 if int(a) else own) for a, w in ref_areas) / total


def choose_area(rel_paths: Sequence[str], text: str, ref_areas: Sequence[Sequence[float]], two_image_max_area: int
                ) -> int:
    """The render area of a sample: a draw from the weighted `ref_areas` keyed by SHA-1 of its image
    paths (as written in the corpus) and text; samples with two or more images draw only among the
    areas ≤ two_image_max_area (the smallest area when there is none)."""
    choices = [(int(a), float(w)) for a, w in ref_areas]
    if len(rel_paths) > 1:
        capped = [(a, w) for a, w in choices if a <= two_image_max_area]
        choices = capped or [min(choices)]
    u = int.from_bytes(hashlib.sha1("|".join([*rel_paths, text]).encode("utf-8")).digest()[:8], "big") / 2**64
    total = sum(w for _, w in choices)
    cumulative = 0.0
    for area, weight in choices:
        cumulative += weight / total
        if u < cumulative:
            return area
    return choices[-1][0]


def load_rgb_over_white(source: str | os.PathLike | bytes) -> np.ndarray:
    """[H, W, 3] float32 in 0…1; an alpha channel (RGBA, LA, or P with transparency) is composited
    over white."""
    from PIL import Image
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else Path(source)) as img:
        if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
            rgba = np.asarray(img.convert("RGBA"), dtype=np.float32) / np.float32(255.0)
            alpha = rgba[..., 3:]
            return rgba[..., :3] * alpha + (np.float32(1.0) - alpha)
        return np.asarray(img.convert("RGB"), dtype=np.float32) / np.float32(255.0)


def preprocess(source: str | os.PathLike | bytes, area: int) -> np.ndarray:
    """A reference as the Qwen-Image 2.1 pipeline feeds the vision tower: [h_bar, w_bar, 3] in −1…1."""
    image = load_rgb_over_white(source)
    h, w = image.shape[:2]
    w_bar, h_bar = target_size(w, h, area)
    rows = (np.arange(h_bar) * h) // h_bar
    cols = (np.arange(w_bar) * w) // w_bar
    return (image[rows][:, cols] * np.float32(2.0) - np.float32(1.0)).astype(np.float32)
