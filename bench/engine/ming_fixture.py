"""tests/data/engine_ming_images.json: the Ming-Image facts computed by ggk's own code (bench/engine_ming_fixture.py
writes it).

The engine functions are taken from the unpacked ggk 0.9.7 sdist UNCHANGED: `extract_engine_code` cuts them out by
brace matching into BUILD/ming_extract.hpp, with #line directives back to the engine files,
and bench/engine_driver/ming_image.cpp (a JSON-lines driver) is compiled against them and the
engine's core/tensor.hpp with g++ (a few seconds). The cut-out pieces:

* model/te/ming_image_te.hpp: the image token ids, the VISION_* constants, smart_resize,
  vision_input_size, preprocess_vision_image, ImageBlock, build_prompt_tokens;
* gk-diffuser.cpp: parse_ming_image_layers.

The file holds, per image size, the engine's first smart_resize pass, the final (h_bar, w_bar)
and the token count; the layer count of each prompt; the prompt layout of build_prompt_tokens
over a byte-per-token stand-in tokenizer (ids and the strings it was handed); and, for a few
generated images (the pixel formula is in the file), the shape, channel means and sampled
values of preprocess_vision_image. The sha256 of every engine file read is recorded. The tests
never run this: they read the file it writes.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from . import DRIVERS, REPO

DRIVER = DRIVERS / "ming_image.cpp"
OUT = REPO / "tests" / "data" / "engine_ming_images.json"
ENGINE = "ggk 0.9.7"
SRC = Path("vendor/engine/diffusion/src")
TE = "model/te/ming_image_te.hpp"
DIFFUSER = "gk-diffuser.cpp"

# (file, anchor, kind): kind "line" takes the anchor's line, "block" the declaration from the
# anchor's line (and a `template <...>` line just above it) to its matching closing brace
PIECES = [
    (TE, "constexpr int64_t IMAGE_START_TOKEN", "line"),
    (TE, "constexpr int64_t IMAGE_PATCH_TOKEN", "line"),
    (TE, "constexpr int64_t IMAGE_END_TOKEN", "line"),
    (TE, "constexpr int VISION_FACTOR", "line"),
    (TE, "constexpr int VISION_PIXELS", "line"),
    (TE, "constexpr int VISION_LOADER_MIN_PIXELS", "line"),
    (TE, "constexpr int VISION_LOADER_MAX_PIXELS", "line"),
    (TE, "inline std::pair<int, int> smart_resize(", "block"),
    (TE, "inline std::pair<int, int> vision_input_size(", "block"),
    (TE, "inline sd::Tensor<float> preprocess_vision_image(", "block"),
    (TE, "struct ImageBlock {", "block"),
    (TE, "inline std::vector<int> build_prompt_tokens(", "block"),
    (DIFFUSER, "static int parse_ming_image_layers(", "block"),
]

# (label, width, height)
SIZES = [
    ("square_20", 20, 20), ("square_28", 28, 28), ("square_224", 224, 224), ("square_512", 512, 512),
    ("square_672", 672, 672), ("square_1024", 1024, 1024), ("square_4096", 4096, 4096),
    ("flickr_landscape", 500, 375), ("flickr_portrait", 375, 500), ("flickr_333", 500, 333),
    ("flickr_333_portrait", 333, 500), ("vga", 640, 480), ("vga_portrait", 480, 640), ("hd", 1280, 720),
    ("full_hd", 1920, 1080), ("full_hd_portrait", 1080, 1920), ("svga", 800, 600), ("phone_portrait", 1170, 2532),
    ("tiny_1", 1, 1), ("tiny_14", 14, 14), ("tiny_27x500", 27, 500), ("tiny_50x40", 50, 40),
    ("huge_8000x6000", 8000, 6000), ("huge_6000x8000", 6000, 8000), ("huge_12000x9000", 12000, 9000),
    ("extreme_10000x20", 10000, 20), ("extreme_20x10000", 20, 10000), ("extreme_50000x1", 50000, 1),
    ("extreme_4000x100", 4000, 100), ("extreme_3000x28", 3000, 28), ("panorama_3:1", 1800, 600),
    # a first-pass side of 28k + 14 (an exact .5): nearbyint's half-to-even and llround's
    # half-away-from-zero give different final sizes (checked below)
    ("half_even_300x70", 300, 70), ("half_even_500x126", 500, 126), ("half_even_640x238", 640, 238),
    ("half_even_1000x182", 1000, 182), ("half_even_70x700", 70, 700),
]

LAYER_PROMPTS = [
    ("none", "a red car on a street"),
    ("empty", ""),
    ("decompose", "Decompose this image into 3 layers"),
    ("decompose_upper", "DECOMPOSE THIS IMAGE INTO 7 LAYERS, background first"),
    ("decompose_singular", "Decompose this image into 1 layer"),
    ("decompose_zero", "Decompose this image into 0 layers"),
    ("decompose_newline_spaces", "please decompose this image into\n  12\tlayers"),
    ("decompose_glued", "Decompose this image into 4layers"),
    ("decompose_no_space", "Decompose this image into3 layers"),
    ("decompose_huge", "Decompose this image into 99999999999 layers"),
    ("decompose_then_line", "Number of layers: 2\nDecompose this image into 6 layers"),
    ("line", "a cat on a sofa\nNumber of layers: 4"),
    ("line_indented", "a cat\n \t Number of Layers:   9 (foreground)"),
    ("line_crlf", "a cat\r\nnumber of layers: 3\r\n"),
    ("line_zero_then_valid", "Number of layers: 0\nNumber of layers: 6"),
    ("line_negative", "Number of layers: -3"),
    ("line_plus", "Number of layers: +8"),
    ("line_not_at_start", "the Number of layers: 4"),
    ("line_no_digits", "Number of layers: many"),
    ("line_first_wins", "Number of layers: 2\nNumber of layers: 8"),
    ("line_vertical_tab_indent", "\x0bNumber of layers: 3"),
    ("inline_mention", "layers: 3, decompose into 3 layers"),
    ("unicode_around", "Décompose — Decompose this image into 6 layers 猫"),
]

PROMPTS = [
    ("plain", "a sheep in sunglasses", 0),
    ("empty", "", 0),
    ("edit", "make it night", 4),
    ("edit_empty", "", 3),
    ("multiline_edit", "Add snow, heavy\nLayer 1: x", 6),
    ("unicode", "一只戴墨镜的羊", 2),
]

PIXEL_FORMULA = ("pixel[y, x, c] = (7*x + 13*y + 101*c + (x*y) % 251 + ((x ^ y) % 17) * 9) % 256, uint8, "
                 "HWC row-major")
# (label, width, height, channels)
IMAGES = [("up_rgb_50x40", 50, 40, 3), ("up_rgba_64x30", 64, 30, 4), ("down_rgb_900x700", 900, 700, 3),
          ("down_rgba_1000x420", 1000, 420, 4), ("same_rgb_672x672", 672, 672, 3), ("up_grey_45x45", 45, 45, 1)]
SAMPLES = 256


def pattern_image(width: int, height: int, channels: int) -> np.ndarray:
    """The generated test image of PIXEL_FORMULA."""
    y, x, c = np.meshgrid(np.arange(height), np.arange(width), np.arange(channels), indexing="ij")
    return ((7 * x + 13 * y + 101 * c + (x * y) % 251 + ((x ^ y) % 17) * 9) % 256).astype(np.uint8)


def sample_positions(h: int, w: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    corners = [[0, 0, 0], [h - 1, w - 1, 2], [0, w - 1, 1], [h - 1, 0, 0]]
    rest = np.stack([rng.integers(0, h, SAMPLES), rng.integers(0, w, SAMPLES), rng.integers(0, 3, SAMPLES)], 1)
    return corners + rest.tolist()


# ---------------------------------------------------------------- extraction

def _block_end(lines: list[str], start: int) -> int:
    """Index of the line that closes the first brace opened at or after `start` (strings, char
    literals and comments skipped)."""
    depth, opened, in_block_comment = 0, False, False
    for i in range(start, len(lines)):
        text, j = lines[i], 0
        while j < len(text):
            ch = text[j]
            if in_block_comment:
                if text.startswith("*/", j):
                    in_block_comment, j = False, j + 2
                    continue
            elif text.startswith("//", j):
                break
            elif text.startswith("/*", j):
                in_block_comment = True
            elif ch in "\"'":
                j += 1
                while j < len(text) and text[j] != ch:
                    j += 2 if text[j] == "\\" else 1
            elif ch == "{":
                depth, opened = depth + 1, True
            elif ch == "}":
                depth -= 1
                if opened and depth == 0:
                    return i
            j += 1
    raise SystemExit(f"unbalanced braces after line {start + 1}")


def extract_engine_code(src: Path) -> tuple[str, list[dict]]:
    """(the header text, [{file, anchor, first_line, last_line}]) of PIECES, cut unchanged."""
    te_parts, other_parts, where = [], [], []
    for rel, anchor, kind in PIECES:
        path = src / rel
        lines = path.read_text(encoding="utf-8").splitlines()
        hits = [i for i, line in enumerate(lines) if anchor in line]
        if len(hits) != 1:
            raise SystemExit(f"{rel}: anchor {anchor!r} found {len(hits)} times; the engine source changed")
        first = last = hits[0]
        if kind == "block":
            if first > 0 and lines[first - 1].strip().startswith("template"):
                first -= 1
            last = _block_end(lines, hits[0])
        piece = f'#line {first + 1} "{path}"\n' + "\n".join(lines[first:last + 1]) + "\n"
        (te_parts if rel == TE else other_parts).append(piece)
        where.append({"file": rel, "anchor": anchor, "first_line": first + 1, "last_line": last + 1})
    header = ("// generated by bench/engine_ming_fixture.py from the ggk 0.9.7 sources, unchanged; do not edit\n"
              "#pragma once\nnamespace MingImageTE {\n" + "".join(te_parts) + "}  // namespace MingImageTE\n"
              + "".join(other_parts))
    return header, where


def build_driver(engine: Path, build: Path) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise SystemExit("no C++ compiler (g++, c++ or clang++) on PATH; set CXX")
    src = engine / SRC
    header, _ = extract_engine_code(src)
    build.mkdir(parents=True, exist_ok=True)
    (build / "ming_extract.hpp").write_text(header, encoding="utf-8")
    binary = build / "ggk_ming"
    subprocess.run([cxx, "-std=c++17", "-O1", "-w", f"-I{build}", f"-I{src}", f"-I{src / 'core'}",
                    f"-I{engine / 'vendor/engine/diffusion/thirdparty'}", str(DRIVER), "-o", str(binary)],
                   check=True)
    return binary


def run_driver(binary: Path, requests: list[dict]) -> list[dict]:
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests).encode("utf-8")
    done = subprocess.run([str(binary)], input=payload, capture_output=True, check=True)
    rows = [json.loads(line) for line in done.stdout.split(b"\n") if line.strip()]
    if len(rows) != len(requests):
        raise SystemExit(f"the driver answered {len(rows)} lines for {len(requests)} requests")
    for row, req in zip(rows, requests):
        if "error" in row:
            raise SystemExit(f"the driver failed on {req}: {row['error']}")
    return rows


# ---------------------------------------------------------------- sanity of the chosen cases

def _half_away_first_pass(h: int, w: int) -> tuple[int, int]:
    """The engine's double pass with std::llround instead of nearbyint (only to prove the
    half_even cases are ones where the rounding mode matters)."""
    def one(h, w, f, lo, hi):
        hb, wb = max(f, math.floor(h / f + 0.5) * f), max(f, math.floor(w / f + 0.5) * f)
        if hb * wb > hi:
            b = math.sqrt(float(h) * w / hi)
            hb, wb = math.floor(h / b / f) * f, math.floor(w / b / f) * f
        elif hb * wb < lo:
            b = math.sqrt(float(lo) / (float(h) * w))
            hb, wb = math.ceil(h * b / f) * f, math.ceil(w * b / f) * f
        return max(f, hb), max(f, wb)
    return one(*one(h, w, 28, 4 * 28 * 28, 1024 * 28 * 28), 28, 451584, 451584)


# ---------------------------------------------------------------- main

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def collect(binary: Path, work: Path) -> dict:
    ids = run_driver(binary, [{"op": "ids"}])[0]
    sizes = run_driver(binary, [{"op": "size", "w": w, "h": h} for _, w, h in SIZES])
    layers = run_driver(binary, [{"op": "layers", "prompt": p} for _, p in LAYER_PROMPTS])
    prompts = run_driver(binary, [{"op": "prompt", "text": t, "n_image": n} for _, t, n in PROMPTS])
    size_cases = []
    for (label, w, h), row in zip(SIZES, sizes):
        h_bar, w_bar = row["final"]
        if label.startswith("half_even") and _half_away_first_pass(h, w) == (h_bar, w_bar):
            raise SystemExit(f"{label}: llround would give the same size; pick another half-to-even case")
        size_cases.append({"label": label, "w": w, "h": h, "first": row["first"], "h_bar": h_bar, "w_bar": w_bar,
                           "n_tokens": (h_bar // 28) * (w_bar // 28)})
    image_cases = []
    for k, (label, w, h, c) in enumerate(IMAGES):
        src, dst = work / f"{label}.u8", work / f"{label}.f32"
        src.write_bytes(pattern_image(w, h, c).tobytes())
        row = run_driver(binary, [{"op": "preprocess", "in": str(src), "out": str(dst), "w": w, "h": h, "c": c}])[0]
        out = np.fromfile(dst, dtype=np.float32).reshape(row["h_bar"], row["w_bar"], 3)
        where = sample_positions(row["h_bar"], row["w_bar"], seed=k)
        image_cases.append({
            "label": label, "w": w, "h": h, "channels": c, "h_bar": row["h_bar"], "w_bar": row["w_bar"],
            "channel_mean": [float(out[..., i].astype(np.float64).mean()) for i in range(3)],
            "min": float(out.min()), "max": float(out.max()),
            "samples": [[y, x, ch, float(out[y, x, ch])] for y, x, ch in where]})
    return {
        "ids": ids, "sizes": size_cases,
        "layers": [{"label": label, "prompt": p, "layers": row["layers"]} for (label, p), row in zip(LAYER_PROMPTS,
                                                                                                   layers)],
        "prompts": [{"label": label, "text": t, "n_image": n, "ids": row["ids"], "encode_calls": row["encode_calls"],
                     "block_start": row["block_start"]} for (label, t, n), row in zip(PROMPTS, prompts)],
        "images": image_cases,
    }


def write_fixture(engine: Path, build: Path | None = None, out: Path = OUT) -> str:
    """Build the driver against the unpacked sdist `engine` (under `build`, else a temporary folder), collect every
    case and write the fixture to `out`; what was written, in one line."""
    src = engine / SRC
    if not (src / TE).is_file():
        raise SystemExit(f"engine source not found under {engine} (expected {SRC / TE})")
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_driver(engine, build or Path(tmp) / "build")
        data = collect(binary, Path(tmp))
    _, where = extract_engine_code(src)
    header = {
        "what": "Ming-Image vision sizes, layer counts, prompt layout and image preprocessing computed by the "
                "engine's own code",
        "engine": ENGINE,
        "driver": "bench/engine_driver/ming_image.cpp over the engine functions cut out unchanged "
                  "(bench/engine/ming_fixture.py extract_engine_code)",
        "generated_by": "python bench/engine_ming_fixture.py",
        "engine_code": where,
        "engine_sha256": {rel: sha256(src / rel) for rel in (TE, DIFFUSER, "core/tensor.hpp")},
        "prompt_tokenizer": "one id per UTF-8 byte (the byte value); encode_calls are the strings the engine "
                            "tokenized, in order",
        "pixel_formula": PIXEL_FORMULA,
        "image_samples": "[y, x, channel, value] of the HWC float32 output; first four are corners",
    }
    head = json.dumps(header, ensure_ascii=False, indent=1)
    body = []
    for key in ("ids", "sizes", "layers", "prompts", "images"):
        value = data[key]
        if isinstance(value, list):
            text = "[\n" + ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in value) + "\n ]"
        else:
            text = json.dumps(value)
        body.append(f' "{key}": {text}')
    text = head[:-2] + ",\n" + ",\n".join(body) + "\n}\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    json.loads(out.read_text(encoding="utf-8"))
    return (f"{len(data['sizes'])} sizes, {len(data['layers'])} layer prompts, {len(data['prompts'])} prompts, "
            f"{len(data['images'])} images to {out}")
