"""The Ming-Image template and image rule as ggk builds them (packs-contract-more §D.1 2, 7).

The engine is the contract (ggk 0.9.7: model/te/ming_image_te.hpp, gk-diffuser.cpp); the facts
below were checked against its own code compiled by bench/engine_ming_fixture.py
(tests/data/engine_ming_images.json).

* **Prompt ids** (`build_prompt_tokens`): SYSTEM_PREFIX is tokenized alone; with an input image
  the ids <image> 157158, n × <imagePatch> 157157, </image> 157159 are appended as ids, the
  image's first slot is len(prefix ids) + 1 and the body becomes "\\n" + text; then body +
  SUFFIX is tokenized as one piece. No BOS/EOS; the empty prompt stays empty. The teacher's
  thinker appends the generation block <image> + 256 × <imagePatch> + </image>.
* **Ids.** The engine hard-codes only the three image ids (and BOS 156891, EOS/PAD/UNK 156892
  of its Ling tokenizer, which nothing here uses). <|role_end|>, the teacher's right padding,
  is not hard-coded anywhere: `pad_id` asks the tokenizer.
* **Image size**: `smart_resize(h, w, 28, 4·28², 1024·28²)`, then again with min = max =
  451584 (672²). The first rounding is std::nearbyint (half to even, Python's `round`): a side
  of 70 px becomes 56, where std::llround would give 84, and the final size differs. Over max:
  β = √(h·w / max), sides floor(side / β / 28)·28; under min: β = √(min / (h·w)), sides
  ceil(side·β / 28)·28; each side at least 28 at the end. Tokens = (h̄/28)·(w̄/28): 576 for
  squares, 609 for a 500 × 375 photo, up to thousands for extreme aspect ratios (the engine
  has no aspect limit).
* **Pixels** (`preprocess_vision_image`): the first three channels (alpha dropped, not
  composited; grey replicated), value / 255 in float32, ONE resample straight to (w̄, h̄) with
  the engine's own bicubic: Keys a = −0.75, antialias (the kernel widened by the downscale
  factor and every row of weights normalised), edge pixels replicated, summed in double; then
  clamp to 0…1 and CLIP mean/std. No EXIF orientation. This is neither PIL's bicubic (a = −0.5)
  nor torch's antialiased one (a = −0.5, no edge replication).
* **Patches** are Qwen2-VL's at 14 px: rows of 3·2·14·14 = 1176 values (channel, then the
  frame repeated over the temporal patch of 2, then the 14 × 14 pixels), merge-window-major;
  grid_thw = (1, h/14, w/14). qwen3vl.vision_data.patchify hard-codes 16 px, so `patchify`
  here takes the patch size.
* **Layer count** (Ming-Image-Layer, `parse_ming_image_layers`): the ASCII-lowercased prompt
  is searched for "decompose this image into<ws>N<ws>layer[s]" (N = max(1, atoi)), else the
  first line that, after leading spaces/tabs/CRs, starts with "number of layers:" and has a
  positive atoi; else 5. There is no upper bound: atoi's int wraps (99999999999 → 1215752191
  on 64-bit Linux).
"""
from __future__ import annotations

import math
import os
import re
from typing import Callable, Sequence

import numpy as np

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.qwen3vl.vision_data import CLIP_MEAN, CLIP_STD, load_rgb

__all__ = [
    "seed_ids_from_file",
    "SYSTEM_PREFIX", "SUFFIX", "IMAGE_PATCH", "IMAGE_START", "IMAGE_END", "PAD_TOKEN",
    "NUM_QUERIES", "TEMPLATE_CHECKS", "FACTOR", "LOADER_MIN_PIXELS", "LOADER_MAX_PIXELS", "VISION_PIXELS",
    "PATCH", "MERGE", "TEMPORAL", "DEFAULT_LAYERS", "encoder", "pad_id", "build_prompt_ids", "prompt_string",
    "thinker_ids", "check_template", "smart_resize", "image_grid", "image_tokens", "resize_bicubic",
    "preprocess_pixels", "preprocess_image", "patchify", "layer_count", "layer_prompt",
]

Encode = Callable[[str], Sequence[int]]

SYSTEM_PREFIX = "<role>SYSTEM</role>你是一个友好的AI助手。\n\ndetailed thinking off<|role_end|><role>HUMAN</role>"
SUFFIX = "<|role_end|><role>ASSISTANT</role>"
IMAGE_PATCH, IMAGE_START, IMAGE_END = 157157, 157158, 157159      # <imagePatch>, <image>, </image>
PAD_TOKEN = "<|role_end|>"
NUM_QUERIES = 256                                                   # the generation block's query tokens

FACTOR = 28                                                         # patch 14 × merge 2
LOADER_MIN_PIXELS, LOADER_MAX_PIXELS = 4 * 28 * 28, 1024 * 28 * 28
VISION_PIXELS = 451584                                              # 672²: the processor's fixed area
PATCH, MERGE, TEMPORAL = 14, 2, 2
DEFAULT_LAYERS = 5

_IMAGE_TEXT = {IMAGE_START: "<image>", IMAGE_PATCH: "<imagePatch>", IMAGE_END: "</image>"}
_HELP = "use the mllm/tokenizer.json of the Ming-Image-0.1-Design snapshot"


# ---------------------------------------------------------------- prompt ids

def encoder(tokenizer) -> Callable[[str], list[int]]:
    """`encode(text) -> ids` with no special tokens added, for a tokenizers.Tokenizer or a
    transformers tokenizer."""
    def encode(text: str) -> list[int]:
        out = tokenizer.encode(text, add_special_tokens=False)
        return list(getattr(out, "ids", out))
    return encode


def pad_id(encode: Encode, what: str = "the Ming teacher") -> int:
    """The id of <|role_end|>, which right-pads the teacher's batches."""
    ids = list(encode(PAD_TOKEN))
    if len(ids) != 1:
        raise ModelFileError(f"The tokenizer of {what} splits {PAD_TOKEN} into {len(ids)} tokens ({ids}); {_HELP}.")
    return ids[0]


def build_prompt_ids(encode: Encode, text: str, n_image_tokens: int = 0) -> tuple[list[int], int]:
    """(Ling ids of the prompt, index of the first <imagePatch> or −1 without an image), as
    the engine's build_prompt_tokens assembles them."""
    ids = list(encode(SYSTEM_PREFIX))
    body, image_start = text, -1
    if n_image_tokens > 0:
        image_start = len(ids) + 1                                   # after <image>
        ids += [IMAGE_START] + [IMAGE_PATCH] * n_image_tokens + [IMAGE_END]
        body = "\n" + text                                           # "</image>\n" precedes the text
    return ids + list(encode(body + SUFFIX)), image_start


def prompt_string(text: str, n_image_tokens: int = 0) -> str:
    """The same prompt as one string (the image block written out as its special tokens)."""
    block = "<image>" + "<imagePatch>" * n_image_tokens + "</image>\n" if n_image_tokens > 0 else ""
    return SYSTEM_PREFIX + block + text + SUFFIX


def thinker_ids(prompt_ids: Sequence[int]) -> list[int]:
    """The teacher's thinker sequence: the prompt, then <image> + 256 query slots + </image>."""
    return [*prompt_ids, IMAGE_START, *([IMAGE_PATCH] * NUM_QUERIES), IMAGE_END]


# (text, image tokens): the prompts check_template tokenizes both ways
TEMPLATE_CHECKS = (("a sheep in sunglasses", 0), ("make it night", 4), ("", 0), ("", 2),
                   ("Add snow, heavy\nLayer 1: x", 6))


def check_template(encode: Encode, what: str = "the Ming teacher") -> None:
    """Refuse a tokenizer for which the engine's piecewise ids differ from the whole prompt
    string's, or whose image tokens or <|role_end|> are not the single ids the engine uses."""
    wrong = [f"{t} is {list(encode(t))}, not [{i}]" for i, t in _IMAGE_TEXT.items() if list(encode(t)) != [i]]
    if not wrong:
        pad_id(encode, what)
        for text, n in TEMPLATE_CHECKS:
            piecewise, whole = build_prompt_ids(encode, text, n)[0], list(encode(prompt_string(text, n)))
            if piecewise != whole:
                wrong.append(f"{text!r} with {n} image tokens gives {len(piecewise)} ids piece by piece and "
                             f"{len(whole)} as one string")
    if wrong:
        raise ModelFileError(f"The tokenizer of {what} does not tokenize the template as the engine does "
                             f"({'; '.join(wrong)}); {_HELP}.")


# ---------------------------------------------------------------- image size

def smart_resize(h: int, w: int, factor: int = FACTOR, min_pixels: int = LOADER_MIN_PIXELS,
                 max_pixels: int = LOADER_MAX_PIXELS) -> tuple[int, int]:
    """(h_bar, w_bar) as the engine's smart_resize computes them, in the same double-precision
    operations (Python's round is std::nearbyint's half-to-even)."""
    if h < 1 or w < 1:
        raise ValueError(f"an image must have positive sides, got {w}×{h}")
    h_bar, w_bar = max(factor, round(h / factor) * factor), max(factor, round(w / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(float(h) * w / max_pixels)
        h_bar, w_bar = math.floor(h / beta / factor) * factor, math.floor(w / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(float(min_pixels) / (float(h) * w))
        h_bar, w_bar = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return max(factor, h_bar), max(factor, w_bar)


def image_grid(h: int, w: int) -> tuple[int, int]:
    """(h_bar, w_bar) the vision tower sees for an h × w image: the loader's pass, then the
    processor's fixed-area pass."""
    first = smart_resize(h, w)
    return smart_resize(*first, min_pixels=VISION_PIXELS, max_pixels=VISION_PIXELS)


def image_tokens(h: int, w: int) -> int:
    """<imagePatch> slots of an h × w input image (one per merged 28 × 28 cell)."""
    h_bar, w_bar = image_grid(h, w)
    return (h_bar // FACTOR) * (w_bar // FACTOR)


# ---------------------------------------------------------------- pixels

def _cubic(x: np.ndarray) -> np.ndarray:
    """The engine's cubic_interpolate_weight (Keys, a = −0.75)."""
    a, x = -0.75, np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return np.where(x <= 1.0, near, np.where(x < 2.0, far, 0.0))


def _taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights) [out, K] of the engine's antialiased bicubic along one axis
    (make_interpolate_contributors); unused taps have weight 0."""
    scale = in_size / out_size
    filter_scale = max(1.0, scale)
    support = 2.0 * filter_scale
    centers = (np.arange(out_size, dtype=np.float64) + 0.5) * scale - 0.5
    starts = np.ceil(centers - support).astype(np.int64)
    ends = np.floor(centers + support).astype(np.int64)
    taps = starts[:, None] + np.arange(int((ends - starts).max()) + 1)[None, :]
    weights = np.where(taps <= ends[:, None], _cubic((centers[:, None] - taps) / filter_scale), 0.0)
    total = np.cumsum(weights, axis=1)[:, -1:]                      # summed in order, as the engine does
    weights = np.where(np.abs(total) > 1e-12, weights / total, weights)
    return np.clip(taps, 0, in_size - 1), weights


def resize_bicubic(image: np.ndarray, h_out: int, w_out: int) -> np.ndarray:
    """[h_out, w_out, C] float32: the engine's sd::ops::interpolate(Bicubic, antialias) of an
    [H, W, C] float image (the same taps; separable passes in float64)."""
    h, w = image.shape[:2]
    if (h, w) == (h_out, w_out):
        return np.asarray(image, dtype=np.float32)
    import torch
    src = torch.from_numpy(np.asarray(image, dtype=np.float64))
    rows, row_w = map(torch.from_numpy, _taps(h, h_out))
    cols, col_w = map(torch.from_numpy, _taps(w, w_out))
    # each pass gathers whole rows along the leading axis and accumulates tap by tap in float64 (torch's
    # addcmul: the same sums in the same order as the engine's loop, ~2.5x numpy's gather-multiply-add)
    tall = torch.zeros((h_out, w, src.shape[2]), dtype=torch.float64)              # [h_out, W, C]
    for k in range(rows.shape[1]):
        tall.addcmul_(row_w[:, k, None, None], src.index_select(0, rows[:, k]))
    tall = tall.transpose(0, 1).contiguous()                                      # [W, h_out, C]
    out = torch.zeros((w_out, h_out, src.shape[2]), dtype=torch.float64)           # [w_out, h_out, C]
    for k in range(cols.shape[1]):
        out.addcmul_(col_w[:, k, None, None], tall.index_select(0, cols[:, k]))
    return out.transpose(0, 1).to(torch.float32).contiguous().numpy()


def preprocess_pixels(rgb: np.ndarray) -> np.ndarray:
    """[h_bar, w_bar, 3] float32 for the vision tower from an [H, W, C] float32 image in 0…1
    (C ≥ 3: channels after the third dropped; C = 1: replicated)."""
    rgb = np.asarray(rgb, dtype=np.float32)
    rgb = rgb[..., :3] if rgb.shape[2] >= 3 else np.repeat(rgb[..., :1], 3, axis=2)
    h_bar, w_bar = image_grid(rgb.shape[0], rgb.shape[1])
    import torch
    # clamp, − mean, ÷ std in place in float32 (the same operations as numpy's, without three new arrays)
    resized = torch.from_numpy(resize_bicubic(rgb, h_bar, w_bar)).clamp_(0.0, 1.0)
    mean, std = (torch.tensor(v, dtype=torch.float32) for v in (CLIP_MEAN, CLIP_STD))
    return resized.sub_(mean).div_(std).numpy()


def preprocess_image(source: str | os.PathLike | bytes) -> np.ndarray:
    """An image file as the engine feeds the Ling vision tower: [h_bar, w_bar, 3] float32."""
    return preprocess_pixels(load_rgb(source))


def patchify(image: np.ndarray, patch: int = PATCH) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(rows [gh·gw, 3·2·patch²] float32, grid_thw (1, gh, gw)) of a preprocessed [H, W, 3]
    image, in Qwen2-VL's merge-window-major order with the frame repeated over the temporal
    patch (what Qwen2_5_VisionTransformerPretrainedModel's patch_embed unpacks)."""
    h, w = image.shape[:2]
    if h % (patch * MERGE) or w % (patch * MERGE):
        raise ValueError(f"the image must be a multiple of {patch * MERGE} pixels a side, got {w}×{h}")
    gh, gw = h // patch, w // patch
    frames = np.repeat(np.asarray(image, np.float32).transpose(2, 0, 1)[None], TEMPORAL, axis=0)  # [T, C, H, W]
    x = frames.reshape(TEMPORAL, 3, gh // MERGE, MERGE, patch, gw // MERGE, MERGE, patch)
    x = x.transpose(2, 5, 3, 6, 1, 0, 4, 7)                  # windows (h, w), in-window (h, w), C, T, p, p
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * TEMPORAL * patch * patch)), (1, gh, gw)


# ---------------------------------------------------------------- layer prompts

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_WS = "[ \t\n\x0b\x0c\r]"                                            # std::regex \s in the C locale
_DECOMPOSE = re.compile(f"decompose this image into{_WS}+([0-9]+){_WS}+layers?")
_ATOI = re.compile("[ \t\n\x0b\x0c\r]*([+-]?[0-9]*)")
_LINE_KEY = "number of layers:"


def _atoi(text: str) -> int:
    """glibc atoi: (int) strtol, saturating at the 64-bit long range, then wrapped to 32 bits."""
    digits = _ATOI.match(text).group(1)
    value = int(digits) if digits.lstrip("+-") else 0
    value = max(-2**63, min(2**63 - 1, value))
    return (value + 2**31) % 2**32 - 2**31


def layer_count(prompt: str) -> int:
    """The number of layers Ming-Image-Layer decomposes into for this prompt."""
    lower = prompt.translate(_ASCII_LOWER)                          # std::tolower in the C locale
    match = _DECOMPOSE.search(lower)
    if match:
        return max(1, _atoi(match.group(1)))
    for line in lower.split("\n"):                                  # std::getline
        line = line.lstrip(" \t\r")
        if line.startswith(_LINE_KEY) and _atoi(line[len(_LINE_KEY):]) > 0:
            return _atoi(line[len(_LINE_KEY):])
    return DEFAULT_LAYERS


def layer_prompt(text: str, n: int, style: str = "decompose") -> str:
    """A layer-decomposition prompt asking for `n` layers: "Decompose this image into N
    layers." on its own line before the text (style "decompose") or a "Number of layers: N"
    line after it (style "number"). Refuses a text that would make the engine read another count."""
    if n < 1:
        raise ValueError(f"a decomposition needs at least one layer, got {n}")
    if style == "decompose":
        head = f"Decompose this image into {n} layer{'s' if n > 1 else ''}."
        prompt = head + ("\n" + text if text else "")
    elif style == "number":
        prompt = (text + "\n" if text else "") + f"Number of layers: {n}"
    else:
        raise ValueError(f"style must be 'decompose' or 'number', got {style!r}")
    if layer_count(prompt) != n:
        raise ValueError(f"the engine would read {layer_count(prompt)} layers from this prompt, not {n}: the text "
                         f"already names a layer count")
    return prompt


def seed_ids_from_file(path: str | os.PathLike, prompt: str, n_image: int = 0) -> tuple[list[int], int]:
    """(the Ling ids of the Ming template around `prompt`, the first <imagePatch> slot or −1), tokenized
    with the tokenizer an adapter file carries (its `tokenizer_json` tensor), as the engine does."""
    import gguf
    from tokenizers import Tokenizer

    from trainer_core.contract.adapter_layout import TOKENIZER_JSON
    reader = gguf.GGUFReader(str(path))
    found = [t for t in reader.tensors if t.name == TOKENIZER_JSON]
    if not found:
        raise ModelFileError(f"{path} carries no {TOKENIZER_JSON}, so the Ming template cannot be tokenized from "
                             "it; pass the ids with --seed-ids or export the adapter again.")
    data = np.asarray(found[0].data, np.float32).astype(np.uint8).tobytes()
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - bad UTF-8, or the tokenizers library's own error type
        raise ModelFileError(f"the {TOKENIZER_JSON} tensor of {path} is not a tokenizer.json ({e}); export the "
                             "adapter again.") from None
    return build_prompt_ids(encoder(tokenizer), prompt, n_image)
