"""pig_clip's tokenizer as the engine runs it: ggk 0.9.7's Qwen2 byte-level BPE, chunk by chunk.

The engine assembles a prompt as chunks (template pieces, then the user text split by the
attention parse) and encodes each chunk on its own, so no merge crosses a chunk boundary. Inside
a chunk it differs from a Hugging Face tokenizer of the same vocabulary in its pre-tokenizer,
which emulates the Qwen2 regex with its own character classes (ggk tokenize_util.cpp):

* no NFC normalisation; only ASCII 0-9 are numbers; letters are Unicode letters;
* contractions are matched case-insensitively but emitted lower-cased, and `'d` never splits;
* the "whitespace" of the regex's punctuation rules is the C library's `isspace()` of the code
  point: ASCII whitespace only below 256 (NBSP, U+3000 are punctuation there), and above 255 the
  glibc list in engine_cspace — such a character is dropped unless a letter follows it;
* the whitespace-run rules use the engine's own 22-code-point space class.

Pieces are then mapped to bytes (GPT-2's byte alphabet) and merged with the student's merges
(the same list the engine compiles in). Added tokens (`<|im_start|>` …, and the five the engine
adds after Qwen3's: `<|boi_token|>` … `<|tms_token|>`) are split out first, earliest match
first. An empty result is the engine's single `<|endoftext|>`.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Iterable

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.engine_cspace import GLIBC_SPACE_ABOVE_255

__all__ = ["EngineBPE", "EMPTY_TOKEN_ID", "ENGINE_EXTRA_TOKENS", "TOKENIZATION", "token_split"]

# the tokenization every shard records in its CONTRACT (student ids and T5 windows as ggk 0.9.7
# builds them); shards of an earlier tokenization are discarded and recomputed
TOKENIZATION = "tokens:ggk-0.9.7"

EMPTY_TOKEN_ID = 151643          # <|endoftext|>: what an empty prompt becomes
# the engine's special tokens after Qwen3's last (151668), matched in prompts like the others
ENGINE_EXTRA_TOKENS = ("<|boi_token|>", "<|bor_token|>", "<|eor_token|>", "<|bot_token|>", "<|tms_token|>")
_FIRST_EXTRA_ID = 151669

_ENGINE_SPACE = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0xA0, 0x1680, *range(0x2000, 0x200B),
                           0x202F, 0x205F, 0x3000])
_C_SPACE_ASCII = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20])
_NEWLINES = frozenset([0x0A, 0x0D])


def _is_letter(c: str) -> bool:
    return c.isalpha()                           # Unicode L*: the engine's letter table


def _is_number(c: str) -> bool:
    return "0" <= c <= "9"


def _is_space(c: str) -> bool:
    return ord(c) in _ENGINE_SPACE


def _c_isspace(c: str) -> bool:
    cp = ord(c)
    return cp in _C_SPACE_ASCII if cp < 256 else cp in GLIBC_SPACE_ABOVE_255


def _punct(c: str) -> bool:
    return not _is_letter(c) and not _is_number(c) and not _c_isspace(c)


def _span(text: str, i: int, keep) -> int:
    """The end of the run of characters from i that `keep` accepts."""
    while i < len(text) and keep(text[i]):
        i += 1
    return i


def _newline(c: str) -> bool:
    return ord(c) in _NEWLINES


def token_split(text: str) -> list[str]:
    """The engine's pre-tokenizer over one plain segment (no added tokens in it); its rules in
    order, the first that applies wins."""
    out: list[str] = []
    n, i = len(text), 0
    while i < n:
        c = text[i]
        if c == "'" and i + 1 < n:                                    # contractions, lower-cased
            x = text[i + 1].lower() if text[i + 1].isascii() else text[i + 1]
            y = x + (text[i + 2].lower() if text[i + 2].isascii() else text[i + 2]) if i + 2 < n else ""
            if x in ("s", "t", "m") or y in ("re", "ve", "ll"):
                piece = x if x in ("s", "t", "m") else y
                out.append("'" + piece)
                i += 1 + len(piece)
                continue
        if _is_number(c):
            j = i + 1
        elif not _is_letter(c) and c not in "\r\n" and i + 1 < n and _is_letter(text[i + 1]):
            j = _span(text, i + 1, _is_letter)                        # one non-letter, then letters
        elif _is_letter(c):
            j = _span(text, i, _is_letter)
        elif (c == " " and i + 1 < n and _punct(text[i + 1])) or _punct(c):
            j = _span(text, _span(text, i + 1, _punct), _newline)     # [" "] punctuation run, newlines
        elif _is_space(c):
            j = _span(text, i, _is_space)
            last_newline = max((k for k in range(i, j) if _newline(text[k])), default=-1)
            if last_newline >= 0:
                j = last_newline + 1
            elif j < n and j - i > 1:
                j -= 1                                                 # the last space joins the next word
        else:
            i += 1                                                     # C-space, not engine space: dropped
            continue
        out.append(text[i:j])
        i = j
    return out


@functools.lru_cache(maxsize=1)
def _byte_alphabet() -> tuple[str, ...]:
    """GPT-2's bytes → printable characters."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in visible:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


class EngineBPE:
    """The engine's Qwen2 tokenizer over a student tokenizer folder's vocabulary and merges."""

    def __init__(self, tokenizer_json: dict, engine_extras: bool = True):
        from tokenizers.models import BPE

        model = tokenizer_json.get("model") or {}
        if model.get("type") != "BPE" or not model.get("vocab") or model.get("merges") is None:
            raise ValueError("not a byte-level BPE tokenizer.json")
        self.vocab: dict[str, int] = model["vocab"]
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self._bpe = BPE(self.vocab, merges, ignore_merges=False)
        added = {t["content"]: t["id"] for t in tokenizer_json.get("added_tokens") or []}
        for k, token in enumerate(ENGINE_EXTRA_TOKENS if engine_extras else ()):   # Qwen2Tokenizer's own extras
            added.setdefault(token, _FIRST_EXTRA_ID + k)
        self.specials: list[tuple[str, int]] = sorted(added.items(), key=lambda kv: kv[1])
        self._alphabet = _byte_alphabet()

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> "EngineBPE":
        path = Path(folder) / "tokenizer.json"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ModelFileError(f"The student tokenizer folder {folder} has no tokenizer.json; point it at a "
                                 "folder like callgg/pig-clip-tokenizer.") from None
        except (OSError, ValueError) as e:
            raise ModelFileError(f"{path} cannot be read as the student's BPE tokenizer ({e}); download the "
                                 "student tokenizer again.") from None
        return cls.from_text(text, path)

    @classmethod
    def from_text(cls, text: str, path: str | os.PathLike) -> "EngineBPE":
        """From the text of `path` (a tokenizer.json), already read."""
        try:
            return cls(json.loads(text))
        except (ValueError, TypeError) as e:
            raise ModelFileError(f"{path} cannot be read as the student's BPE tokenizer ({e}); download the "
                                 "student tokenizer again.") from None

    def _segments(self, chunk: str) -> Iterable[tuple[str, int | None]]:
        """Plain text and added tokens, earliest match first (the earlier id on a tie)."""
        rest = chunk
        while rest:
            best: tuple[int, str, int] | None = None
            for token, token_id in self.specials:
                at = rest.find(token)
                if at >= 0 and (best is None or at < best[0]):
                    best = (at, token, token_id)
            if best is None:
                yield rest, None
                return
            at, token, token_id = best
            if at:
                yield rest[:at], None
            yield token, token_id
            rest = rest[at + len(token):]

    @functools.lru_cache(maxsize=65536)
    def _piece(self, piece: str) -> tuple[int, ...]:
        symbols = "".join(self._alphabet[b] for b in piece.encode("utf-8", "surrogatepass"))
        return tuple(t.id for t in self._bpe.tokenize(symbols))

    def encode(self, chunk: str) -> list[int]:
        """One chunk's ids (possibly none)."""
        ids: list[int] = []
        for text, special in self._segments(chunk):
            if special is not None:
                ids.append(special)
                continue
            for piece in token_split(text):
                ids.extend(self._piece(piece))
        return ids

    def encode_chunks(self, chunks: Iterable[str]) -> list[int]:
        """The chunks' ids concatenated; never empty (an empty prompt is <|endoftext|>)."""
        ids = [i for chunk in chunks for i in self.encode(chunk)]
        return ids or [EMPTY_TOKEN_ID]
