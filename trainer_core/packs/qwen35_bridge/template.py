"""The MOSS-Image side of the Qwen3.5 bridge as ggk builds it (packs-contract-more §D.2 2, Part E 2).

* **Template.** `<|im_start|>user\\n` + per reference `<|vision_start|>` + one `<|image_pad|>`
  per merged 32 × 32 cell + `<|vision_end|>` (no headers, nothing between images) + the text (a
  single space when empty) + `<|im_end|>\\n<|im_start|>assistant\\n<think>\\n`, tokenized as ONE
  string with no special tokens added. Every row goes to the DiT. The slot of a reference's first
  pad is the token count through its `<|vision_start|>`, which the run scan below finds.
* **Ids.** The Qwen3.5 specials sit at 248044 … 248076 (`SPECIAL_TOKENS` in id order). The
  real tokenizer gives "user" = 846 and "assistant" = 74455; `check_template` only asks that
  each is one token, so the tiny test tokenizer passes too.
* **References** follow the engine, not the published trainer: `smart_resize` rounds each side
  to a multiple of 32 with std::llround (half away from zero: 80 px → 96, where Python's round
  gives 64), then fits the area into [65536, 1024²] px; the pixels are resized as floats by a
  bilinear filter with antialias, then 2x − 1. An alpha channel is dropped, the colours under it
  kept: the engine's pipeline cuts every reference to get_image_channels() = 3 channels for FLUX.3
  and MOSS, the versions that load this adapter (gk-diffuser.cpp:3731-3733, 5892-5893, 5984-5987), so
  the conditioner's composite over white (conditioner.hpp:4323-4329) never sees one.
  No EXIF orientation is applied. At training time a sample's drawn area first rescales the file
  (bicubic, uint8) when it differs by more than 2 %.
* **Patches** are Qwen2-VL's (16 px, 2 × 2 merge windows, the frame doubled over the temporal
  patch of 2): the same layout as the MageFlow pack's, so `patchify` is that one.
"""
from __future__ import annotations

import functools
import io
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.qwen3vl.vision_data import llround, patchify, token_runs

__all__ = ["SPECIAL_TOKENS", "FIRST_SPECIAL_ID", "ENDOFTEXT", "PAD_ID", "IM_START", "IM_END", "VISION_START",
           "VISION_END", "IMAGE_PAD", "THINK", "NEWLINE", "PREFIX", "SUFFIX", "FACTOR", "MIN_PIXELS", "MAX_PIXELS",
           "prompt_string", "build_prompt_ids", "check_template", "smart_resize", "merged_tokens", "load_reference",
           "patchify"]

# The 33 added tokens of the Qwen3.5 tokenizer, in id order from FIRST_SPECIAL_ID.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
FIRST_SPECIAL_ID = 248044
ENDOFTEXT = PAD_ID = 248044             # <|endoftext|>: right padding of the teacher's batches
IM_START, IM_END = 248045, 248046
VISION_START, VISION_END, IMAGE_PAD = 248053, 248054, 248056
THINK = 248068
NEWLINE = 198                           # "\n", the same byte-level id as in every Qwen BPE

PREFIX = "<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n"

FACTOR = 32                             # patch 16 × merge 2: one merged token per 32 × 32 pixels
MIN_PIXELS, MAX_PIXELS = 65536, 1024 * 1024
_AREA_TOLERANCE = 0.02                  # a drawn area within 2 % of the file's own keeps the file's pixels


# ---------------------------------------------------------------- template

def prompt_string(text: str, grids: Sequence[int | tuple[int, int]] = ()) -> str:
    """The whole MOSS prompt; one entry of `grids` per reference: its merged token count, or its merged
    grid (gh, gw)."""
    counts = [int(g[0]) * int(g[1]) if isinstance(g, (tuple, list)) else int(g) for g in grids]
    blocks = "".join("<|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|>" for n in counts)
    return PREFIX + blocks + (text or " ") + SUFFIX


def build_prompt_ids(encode: Callable[[str], list[int]], text: str, image_tokens: Sequence[int]
                     ) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids of the whole prompt string, [(first pad slot, count)] per reference); the runs are checked
    against the requested counts and the vision markers around them."""
    ids = list(encode(prompt_string(text, list(image_tokens))))
    runs = token_runs(ids, IMAGE_PAD)
    ok = ([n for _, n in runs] == list(image_tokens)
          and all(s > 0 and ids[s - 1] == VISION_START and s + n < len(ids) and ids[s + n] == VISION_END
                  for s, n in runs))
    if not ok:
        raise ModelFileError(f"The teacher tokenizer does not give the image slots the engine builds "
                             f"({len(image_tokens)} reference(s) of {list(image_tokens)} tokens, found runs "
                             f"{[n for _, n in runs]}); use the Qwen3.5 tokenizer.json of the teacher snapshot.")
    return ids, runs


def seed_ids_from_file(path: str | os.PathLike, text: str, image_tokens: Sequence[int] = ()
                       ) -> tuple[list[int], list[tuple[int, int]]]:
    """build_prompt_ids with the Qwen3.5 vocabulary the adapter file carries, tokenized as the engine's
    Qwen35Tokenizer does (its BPE over those arrays, its 33 added tokens; EngineBPE is the same BPETokenizer)."""
    try:
        stat = os.stat(path)
    except OSError:                     # not cached: reading it says what is wrong with it
        bpe = _file_bpe.__wrapped__(str(path), 0, 0, 0)
    else:
        bpe = _file_bpe(str(Path(path).resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return build_prompt_ids(bpe.encode, text, image_tokens)


@functools.lru_cache(maxsize=2)
def _file_bpe(path: str, inode: int, size: int, mtime_ns: int) -> Any:
    """The EngineBPE over the vocabulary a file carries, read once per process per file version (~1 CPU-s for
    Qwen3.5's 248k tokens and merges; `infer` and the engine checks tokenize prompt after prompt)."""
    from trainer_core.contract.engine_bpe import EngineBPE
    from trainer_core.contract.gguf_read import read_gguf_string_array
    tokens = read_gguf_string_array(path, "tokenizer.ggml.tokens")
    merges = read_gguf_string_array(path, "tokenizer.ggml.merges")
    ids = {t: i for i, t in enumerate(tokens)}
    return EngineBPE({"model": {"type": "BPE", "vocab": ids, "merges": merges},
                      "added_tokens": [{"content": t, "id": ids[t]} for t in SPECIAL_TOKENS if t in ids]},
                     engine_extras=False)


def check_template(encode: Callable[[str], list[int]], what: str) -> None:
    """Refuse a tokenizer (`encode(text) -> ids`, no special tokens added) whose MOSS prefix and suffix
    are not [<|im_start|>, "user", "\\n"] and [<|im_end|>, "\\n", <|im_start|>, "assistant", "\\n",
    <think>, "\\n"] with the engine's special ids and one token for each word."""
    user, assistant = list(encode("user")), list(encode("assistant"))
    wrong = [f"{word!r} is {len(ids)} tokens, not 1" for word, ids in (("user", user), ("assistant", assistant))
             if len(ids) != 1]
    if not wrong:
        for piece, want in ((PREFIX, [IM_START, *user, NEWLINE]),
                            (SUFFIX, [IM_END, NEWLINE, IM_START, *assistant, NEWLINE, THINK, NEWLINE])):
            got = list(encode(piece))
            if got != want:
                wrong.append(f"{piece!r} encodes as {got}, not {want}")
    if wrong:
        raise ModelFileError(f"The {what} tokenizer does not give the MOSS template the engine builds "
                             f"({'; '.join(wrong)}); use the Qwen3.5 tokenizer.json of the teacher snapshot.")


# ---------------------------------------------------------------- references

def smart_resize(h: int, w: int, factor: int = FACTOR, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
                 ) -> tuple[int, int]:
    """(h_bar, w_bar): each side rounded to a multiple of `factor` (llround, at least `factor`); when that
    area exceeds max_pixels both sides are scaled by 1/β, β = √(h·w / max), and floored to the factor
    (at least `factor`); when it is below min_pixels, scaled by β = √(min / (h·w)) and ceiled."""
    if h < 1 or w < 1:
        raise ValueError(f"an image must have positive sides, got {w}×{h}")
    h_bar = max(factor, llround(h / factor) * factor)
    w_bar = max(factor, llround(w / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        h_bar = max(factor, math.floor(h / beta / factor) * factor)
        w_bar = max(factor, math.floor(w / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar = math.ceil(h * beta / factor) * factor
        w_bar = math.ceil(w * beta / factor) * factor
    return h_bar, w_bar


def merged_tokens(h: int, w: int) -> int:
    """Slots of a preprocessed h × w reference: one per 32 × 32 pixels."""
    return (h // FACTOR) * (w // FACTOR)


def _decode(source: str | os.PathLike | bytes, area: int) -> np.ndarray:
    """[H, W, 3] float32 RGB in 0…1, any alpha channel dropped (the colours under it kept, as the engine keeps
    them), rescaled to `area` pixels (bicubic on uint8) when that differs from the file's own by more than 2 %."""
    from PIL import Image
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else Path(source)) as img:
        img = img.convert("RGBA").convert("RGB") if img.mode in ("P", "PA", "LA", "La", "RGBa") else img.convert("RGB")
        w, h = img.size
        if area and abs(area - w * h) > _AREA_TOLERANCE * w * h:
            s = math.sqrt(area / (w * h))
            img = img.resize((max(FACTOR, round(w * s)), max(FACTOR, round(h * s))), Image.Resampling.BICUBIC)
        return np.asarray(img, dtype=np.float32) / np.float32(255.0)


def load_reference(source: str | os.PathLike | bytes, area: int = 0, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """A reference as the engine feeds Qwen3.5's vision tower: [h_bar, w_bar, 3] float32 in −1…1.
    `area` 0 keeps the file's size; otherwise the file is first rescaled to that many pixels."""
    import torch
    import torch.nn.functional as F

    rgb = _decode(source, area)
    h_bar, w_bar = smart_resize(rgb.shape[0], rgb.shape[1], max_pixels=max_pixels)
    x = torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1)))[None]           # [1, 3, H, W]
    x = F.interpolate(x, size=(h_bar, w_bar), mode="bilinear", antialias=True, align_corners=False)[0]
    return (x * 2.0 - 1.0).permute(1, 2, 0).contiguous().numpy().astype(np.float32)
