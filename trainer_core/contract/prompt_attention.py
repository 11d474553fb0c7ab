"""The engine's prompt-weighting parse (ggk 0.9.7 `parse_prompt_attention`), quirks included.

The engine splits a prompt's user text into (text, weight) chunks with A1111-style syntax and
tokenizes each chunk separately; the brackets and weights never reach the tokenizer. What the
engine does, which differs from A1111 and is reproduced here on purpose:

* `(x)` ×1.1, `[x]` ÷1.1 (in float32: `((x))` weighs 1.21000004), `(x:1.3)` ×1.3; an unclosed
  `(` or `[` weighs everything after it; a `)` or `]` with nothing open stays as text.
* Only `\\(` is unescaped (to `(`); `\\)`, `\\[`, `\\]` and `\\\\` stay as written, backslash
  included.
* `:<number>)` always closes a weight: `aspect (16:9)` weighs the chunk `16` by 9; with no `(`
  open the match is dropped, text and all.
* The word `BREAK` is a chunk of text `BREAK` with weight −1 (the engine negates its rows); the
  start of what is left to parse always counts as a word boundary, so `xBREAK` gives one too.
* Adjacent chunks of equal weight merge; an empty result is one empty chunk.
* A weight the engine's `std::stof` cannot read (`(x:.)`) aborts the engine; here the match is
  kept as text, since a prompt like that never reaches an adapter at inference.

Weights never change token ids: the engine scales the adapter's output rows by them after the
adapter ran, so adapters are trained on the chunks' ids alone.
"""
from __future__ import annotations

import re

import numpy as np

__all__ = ["parse_prompt_attention", "plain_text"]

# the engine's pattern (std::regex ECMAScript over UTF-8 bytes in the "C" locale, so \b, \d and \s
# are ASCII: re.ASCII). `\b` is evaluated on the remaining text, whose start is a boundary: that
# is why the search restarts on the suffix
_ATTENTION = re.compile(r"\\\(|\\\)|\\\[|\\\]|\\\\|\\|\(|\[|:([+-]?[.\d]+)\)|\)|\]|\bBREAK\b|[^\\()\[\]:B]+|:|\bB",
                        re.ASCII)
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.ASCII)
_ROUND, _SQUARE = np.float32(1.1), np.float32(1.0) / np.float32(1.1)


def _stof(text: str) -> np.float32 | None:
    """std::stof on the weight's digits: None where it throws (no digits, out of range)."""
    match = re.match(r"[+-]?(\d+\.?\d*|\.\d+)", text, re.ASCII)
    if not match:
        return None
    value = np.float32(float(match.group(0)))
    return None if not np.isfinite(value) else value


def parse_prompt_attention(text: str) -> list[tuple[str, float]]:
    """[(chunk text, weight)] as the engine builds them; at least one chunk."""
    res: list[list] = []                      # [text, float32 weight]
    round_open: list[int] = []
    square_open: list[int] = []

    def scale(start: int, factor: np.float32) -> None:
        for item in res[start:]:
            item[1] = np.float32(item[1] * factor)

    remaining = text
    while True:
        m = _ATTENTION.search(remaining)
        if m is None:
            break
        token, weight = m.group(0), m.group(1)
        if token == "(":
            round_open.append(len(res))
        elif token == "[":
            square_open.append(len(res))
        elif weight is not None and (not round_open or _stof(weight) is not None):
            if round_open:                    # with no "(" open the weight is dropped, unread
                scale(round_open.pop(), _stof(weight))
        elif token == ")" and round_open:
            scale(round_open.pop(), _ROUND)
        elif token == "]" and square_open:
            scale(square_open.pop(), _SQUARE)
        elif token == "\\(":
            res.append(["(", np.float32(1.0)])
        elif _BREAK.search(token):
            res.append(["BREAK", np.float32(-1.0)])
        else:
            res.append([token, np.float32(1.0)])
        remaining = remaining[m.end():]
    for start in round_open:
        scale(start, _ROUND)
    for start in square_open:
        scale(start, _SQUARE)
    if not res:
        return [("", 1.0)]
    merged = [res[0]]
    for item in res[1:]:
        if item[1] == merged[-1][1]:
            merged[-1] = [merged[-1][0] + item[0], merged[-1][1]]
        else:
            merged.append(item)
    return [(t, float(w)) for t, w in merged]


def plain_text(text: str) -> str:
    """The prompt as the engine's tokenizer reads it: the chunks' text joined, no syntax."""
    return "".join(chunk for chunk, _ in parse_prompt_attention(text))
