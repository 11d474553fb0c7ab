"""The PixArt T5 seed window exactly as ggk 0.9.7 builds it (T5UniGramTokenizer + pad_tokens).

The engine does not run sentencepiece or Hugging Face's T5 tokenizer: it has its own port of the
unigram model (tokenizers/t5_unigram_tokenizer.cpp), and the window is built from that port's
ids (conditioning/conditioner.hpp:1812-1823, tokenizer.cpp:39-196). This module reproduces it
rule for rule, quirks included, because the window is both the teacher's input and the
adapter's seed ids:

* Per chunk (`encode`): the only normalisation is " {2,}" → " " (no NFKC, no strip; tabs,
  newlines, NBSP stay); then `<pad>`, `</s>` and `<unk>` are split out as ids 0, 1 and unk_id;
  each other segment gets the Metaspace with `std::getline` semantics ("▁" + the fields split
  at " ", no empty field after a trailing space: `""` → `▁`, `" a"` → `▁▁a`, `"a "` → `▁a`);
  then a Viterbi over all pieces with their scores (the specials and `<extra_id_*>` score 0),
  in float32 like the engine. Where no piece covers a character exactly, one `<unk>` candidate
  spans that character and scores min_score − 10; ties keep the first candidate; unknown
  characters are never fused; there is no byte fallback.
* Per prompt (`window`): the engine's attention parse splits the prompt into chunks, each is
  encoded alone, the ids are concatenated, then EOS (1) and PAD (0) up to the window length;
  a prompt that overflows keeps its first length − 1 ids and EOS.

The vocabulary is the teacher snapshot's `spiece.model` (the pieces, then the 100 sentinels
`<extra_id_99..0>`, `<extra_id_0>` last, as Hugging Face's T5 conversion writes them; that is
the engine's compiled-in t5 `tokenizer.json` for T5 v1.1) or a `tokenizer.json` of that form.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.prompt_attention import parse_prompt_attention

if TYPE_CHECKING:
    import torch

__all__ = ["PAD_ID", "EOS_ID", "SENTINELS", "EngineT5"]

PAD_ID = 0       # <pad>: the engine's PAD_TOKEN_ID for T5, whatever the vocabulary says
EOS_ID = 1       # </s>: its EOS_TOKEN_ID, appended after a prompt's pieces
SENTINELS = 100  # <extra_id_99..0> follow the pieces in the engine's T5 vocabulary
_UNK_PENALTY = np.float32(10.0)   # kUnkPenalty (t5_unigram_tokenizer.h:45)
_SPACE_RUNS = re.compile(" {2,}")
_SPECIALS = re.compile("<pad>|</s>|<unk>")


class EngineT5:
    """The engine's T5 unigram tokenizer over a vocabulary of (piece, score), ids in order."""

    def __init__(self, vocab: Sequence[tuple[str, float]], unk_id: int, replacement: str = "▁",
                 add_prefix_space: bool = True):
        if not vocab:
            raise ValueError("the T5 vocabulary is empty")
        if not 0 <= unk_id < len(vocab):
            raise ValueError(f"unk_id {unk_id} is outside the vocabulary of {len(vocab)} pieces")
        # an empty piece becomes "<empty_token>" in the engine (t5_unigram_tokenizer.cpp:80-82)
        self.pieces = [piece or "<empty_token>" for piece, _ in vocab]
        self.scores = [np.float32(score) for _, score in vocab]            # float, as the engine reads them
        self.unk_id = int(unk_id)
        self.replacement, self.add_prefix_space = replacement, bool(add_prefix_space)
        self._ids: dict[str, int] = {}
        self._prefixes: set[str] = set()      # every prefix of a piece: where the engine's trie goes on
        for i, piece in enumerate(self.pieces):
            self._ids.setdefault(piece, i)
            self._prefixes.update(piece[:k] for k in range(1, len(piece) + 1))
        self._unk_score = np.float32(min(self.scores) - _UNK_PENALTY)
        self._special_ids = {"<pad>": PAD_ID, "</s>": EOS_ID, "<unk>": self.unk_id}

    # ------------------------------------------------------------ loading

    @classmethod
    def from_folder(cls, root: str | os.PathLike) -> "EngineT5":
        """The vocabulary of a T5 snapshot folder: its spiece.model, else its tokenizer.json."""
        root = Path(root)
        if (root / "spiece.model").is_file():
            return cls.from_spiece(root / "spiece.model")
        if (root / "tokenizer.json").is_file():
            return cls.from_tokenizer_json(root / "tokenizer.json")
        raise ModelFileError(f"The T5 teacher folder {root} has neither spiece.model nor tokenizer.json; "
                             "download the teacher snapshot again.")

    @classmethod
    def from_spiece(cls, path: str | os.PathLike) -> "EngineT5":
        """spiece.model's pieces and scores, then the 100 sentinels `<extra_id_99..0>` scoring 0."""
        try:
            import sentencepiece as spm
        except ImportError as e:
            raise ModelFileError(f"Reading {path} needs sentencepiece ({e}); install it with: "
                                 "pip install sentencepiece") from None
        try:
            sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError, ValueError) as e:
            raise ModelFileError(f"The T5 sentencepiece model {path} cannot be read ({e}); download the "
                                 "teacher snapshot again.") from None
        vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
        vocab += [(f"<extra_id_{k}>", 0.0) for k in range(SENTINELS - 1, -1, -1)]
        return cls(vocab, unk_id=sp.unk_id())

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike) -> "EngineT5":
        """What the engine reads of a tokenizer.json: model.vocab, model.unk_id and the Metaspace's
        replacement and add_prefix_space (the normalizer and post-processor are ignored)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            model = data["model"]
            vocab = [(str(piece), float(score)) for piece, score in model["vocab"]]
            meta = data.get("pre_tokenizer") or {}
            return cls(vocab, unk_id=int(model.get("unk_id", 2)), replacement=meta.get("replacement", "▁"),
                       add_prefix_space=meta.get("add_prefix_space", True))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelFileError(f"The T5 tokenizer {path} is not a unigram tokenizer.json the engine can "
                                 f"read ({e}); download the teacher snapshot again.") from None

    def __len__(self) -> int:
        return len(self.pieces)

    def piece_id(self, piece: str) -> int | None:
        return self._ids.get(piece)

    # ------------------------------------------------------------ T5UniGramTokenizer::encode

    def encode(self, chunk: str) -> list[int]:
        """The ids of one attention chunk (t5_unigram_tokenizer.cpp:290-339); no EOS."""
        normalized = _SPACE_RUNS.sub(" ", chunk)
        ids: list[int] = []
        for segment in _split_specials(normalized) or [normalized]:
            if segment in self._special_ids:
                ids.append(self._special_ids[segment])
            else:
                ids += self._viterbi(self._metaspace(segment))
        return ids

    def _metaspace(self, segment: str) -> str:
        """MetaspacePreTokenizer::tokenize: getline yields no empty field after a trailing " "."""
        fields = segment.split(" ")
        if fields[-1] == "":
            fields.pop()
        return (self.replacement if self.add_prefix_space else "") + self.replacement.join(fields)

    def _viterbi(self, text: str) -> list[int]:
        """EncodeOptimized (t5_unigram_tokenizer.cpp:145-211) over code points: pieces are whole
        UTF-8 characters, so the engine's byte trie never ends a match inside one."""
        n = len(text)
        score = [np.float32(0.0)] * (n + 1)   # best path score ending at each position
        start_of = [-1] * (n + 1)             # where that path's last piece starts (-1: none yet)
        id_of = [-1] * (n + 1)
        for start in range(n):
            till_here, single = score[start], False
            end = start + 1
            while end <= n and (piece := text[start:end]) in self._prefixes:
                i = self._ids.get(piece)
                if i is not None:
                    candidate = self.scores[i] + till_here               # float32 + float32
                    if start_of[end] == -1 or candidate > score[end]:    # strict: ties keep the first
                        score[end], start_of[end], id_of[end] = candidate, start, i
                    single = single or end == start + 1
                end += 1
            if not single:      # no piece is exactly this character: a one-character <unk> candidate
                candidate = self._unk_score + till_here
                if start_of[start + 1] == -1 or candidate > score[start + 1]:
                    score[start + 1], start_of[start + 1], id_of[start + 1] = candidate, start, self.unk_id
        ids, end = [], n
        while end > 0:
            ids.append(id_of[end])
            end = start_of[end]
        return ids[::-1]

    # ------------------------------------------------------------ the PixArt window

    def window(self, prompt: str, length: int) -> tuple[list[int], int]:
        """(the `length`-slot window, its real slots = pieces + EOS) of one raw prompt."""
        if length < 1:
            raise ValueError(f"the window needs at least 1 slot, got {length}")
        # The chunks' weights are left out on purpose: they never change ids, and the engine
        # multiplies the adapter's output rows by them (apply_token_weights) after the adapter
        # ran, so the adapter is trained on the ids alone.
        pieces = [i for chunk, _ in parse_prompt_attention(prompt) for i in self.encode(chunk)]
        if len(pieces) + 1 > length:           # pad_tokens without overflow expansion: cut, EOS last
            return pieces[:length - 1] + [EOS_ID], length
        real = pieces + [EOS_ID]
        return real + [PAD_ID] * (length - len(real)), len(real)

    def windows(self, prompts: Sequence[str], length: int) -> tuple["torch.Tensor", "torch.Tensor"]:
        """(ids LongTensor [B, length], lens LongTensor [B]) of the raw prompts."""
        import torch

        rows = [self.window(p, length) for p in prompts]
        ids = torch.tensor([w for w, _ in rows], dtype=torch.long).reshape(len(rows), length)   # [B, length]
        lens = torch.tensor([n for _, n in rows], dtype=torch.long)                             # [B]
        return ids, lens


def _split_specials(text: str) -> list[str]:
    """split_with_special_tokens: the text between `<pad>`, `</s>` and `<unk>`, and those, in order;
    no empty segment, so "" gives []."""
    out, pos = [], 0
    for m in _SPECIALS.finditer(text):
        if m.start() > pos:
            out.append(text[pos:m.start()])
        out.append(m.group(0))
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out
