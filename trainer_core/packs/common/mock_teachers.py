"""Mock teachers: synthetic targets of the right shapes, deterministic per prompt, no files.

They exist to smoke-test the machinery (GGUF_TRAINER_MOCK_TEACHER=1 or precompute.mock_teacher)
— never to train a usable adapter. The rows depend on the prompt's words (hashed into a
small low-rank table) and on the row position, so a mock run still has something to learn
and a loss that falls. The PixArt mock lives with its teacher (t5_teacher.MockT5Teacher).
"""
from __future__ import annotations

import os
import re
import zlib
from typing import Any, Mapping

import numpy as np
import torch

from trainer_core.base.errors import ModelFileError

__all__ = ["MockQueryTeacher", "MockTokenTeacher", "word_ids", "cell_features", "mock_tokenizer", "HashTokenizer",
           "seeded_normal"]

_BUCKETS = 4096
_RANK = 32
_SEED = 4321


def word_ids(text: str) -> list[int]:
    """Whitespace words hashed into the mock's table (crc32, as the peer's mock tokenizer)."""
    return [zlib.crc32(w.encode("utf-8")) % _BUCKETS for w in text.split()] or [0]


def _tables(out_dim: int, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    words = torch.randn(_BUCKETS, _RANK, generator=g)                    # [V, r]
    proj = torch.randn(_RANK, out_dim, generator=g) / _RANK ** 0.5      # [r, out]
    pos = torch.randn(rows, out_dim, generator=g) * 0.5                 # [rows, out]
    mix = torch.randn(rows, _RANK, generator=g)                         # [rows, r]
    return words, proj, pos, mix


class MockQueryTeacher:
    """Resampler packs (LLaDA): `num_queries` rows of `out_dim` per prompt."""

    mode = "mock"

    def __init__(self, out_dim: int, num_queries: int):
        self.out_dim, self.num_queries = out_dim, num_queries
        self.words, self.proj, self.pos, self.mix = _tables(out_dim, num_queries, _SEED)

    def forward_prompts(self, prompts: list[str]) -> torch.Tensor:
        """[B, num_queries, out_dim] float32."""
        out = []
        for text in prompts:
            e = self.words[word_ids(text)].mean(0)                          # [r]
            out.append(self.pos + (self.mix * e) @ self.proj)               # [NQ, out]
        return torch.stack(out)


class MockTokenTeacher:
    """Token-aligned packs: one row of `out_dim` per student token (a causal running mix)."""

    mode = "mock"

    def __init__(self, out_dim: int, max_positions: int = 4096):
        self.out_dim = out_dim
        self.words, self.proj, self.pos, self.mix = _tables(out_dim, max_positions, _SEED + 1)

    def forward_tokens(self, token_lists: list[list[int]]) -> list[torch.Tensor]:
        """Per sample [len_i, out_dim] float32, row j depending on tokens 0..j."""
        out = []
        for tokens in token_lists:
            e = self.words[torch.tensor(tokens) % _BUCKETS]                  # [L, r]
            context = e.cumsum(0) / torch.arange(1, len(tokens) + 1)[:, None]   # causal mean
            rows = self.pos[: len(tokens)] + (self.mix[: len(tokens)] * (e + context)) @ self.proj
            out.append(rows)
        return out


def cell_features(image: np.ndarray, gh: int, gw: int, factor: int) -> torch.Tensor:
    """The vision mocks' [gh·gw, 48] features of an image [h, w, 3]: per factor×factor cell its mean colour,
    its square, and 42 sines of the cell index."""
    cells = torch.from_numpy(np.ascontiguousarray(image[:gh * factor, :gw * factor], dtype=np.float32))
    x = cells.view(gh, factor, gw, factor, 3).mean(dim=(1, 3)).reshape(gh * gw, 3)   # torch: ~10x numpy
    index = torch.arange(gh * gw, dtype=torch.float32)[:, None]
    return torch.cat([x, x ** 2, torch.sin(index * torch.arange(1, 43) / 7)], dim=1)


def mock_tokenizer(tokenizer: Any, what: str, repo: str) -> Any:
    """A mock teacher's tokenizer: a tokenizers.Tokenizer as given, one loaded from a tokenizer.json path, or
    None (the mock's word-hash ids); ModelFileError naming the file when it cannot be loaded."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(tokenizer))
    except Exception as e:  # noqa: BLE001 — the tokenizers library raises plain Exception subclasses
        raise ModelFileError(f"The {what} tokenizer {tokenizer} cannot be loaded ({e}); download {repo} "
                             "again.") from None


class HashTokenizer:
    """A mock teacher's ids when it has no tokenizer.json: each special string by its id, "\\n" and a blank
    stretch by theirs, a word by `words` or else `base` + crc32 mod `buckets`."""

    def __init__(self, specials: Mapping[str, int], newline: int, blank: int, buckets: int,
                 words: Mapping[str, int] | None = None, base: int = 1000):
        self.specials, self.newline, self.blank = dict(specials), newline, blank
        self.buckets, self.words, self.base = buckets, dict(words or {}), base
        self.split = re.compile("(" + "|".join(re.escape(s) for s in self.specials) + ")")

    def __call__(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self.split.split(text):
            if piece in self.specials:
                ids.append(self.specials[piece])
                continue
            for part in re.split(r"(\n)", piece):
                if part == "\n":
                    ids.append(self.newline)
                elif part and not part.strip():
                    ids.append(self.blank)
                else:
                    ids.extend(self.words.get(w, self.base + zlib.crc32(w.encode("utf-8")) % self.buckets)
                               for w in part.split())
        return ids


def seeded_normal(*shapes: tuple[int, ...], seed: int = _SEED) -> list[torch.Tensor]:
    """Standard normal tensors of `shapes`, drawn in that order from one generator seeded with `seed` (the
    vision mocks' bases: the same numbers on every machine)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for shape in shapes]
