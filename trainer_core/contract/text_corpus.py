"""The text corpus: prompt sources → data/train.txt and data/val.txt (the corpus stage's work for text packs;
image packs build theirs in image_corpus.py with these prompts as their text-only share).

Sources are read in order (Hub presets, then `corpus.extra_files`); every prompt is
whitespace-normalised, kept when `min_chars ≤ len ≤ max_chars`, de-duplicated
case-insensitively (first wins), shuffled with `corpus.seed`, split into val then train,
and ~`empty_frac` of each split is replaced by the empty prompt so the adapter learns the
engine's empty CFG prompt. Both files are written atomically, one prompt a line; an empty
line is the empty prompt. In "files" mode the user's own train/val files are used verbatim.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from trainer_core.base.errors import CorpusError
from trainer_core.contract.corpus_files import write_corpus

if TYPE_CHECKING:
    from trainer_core.base.events import Report
    from trainer_core.base.folder import ProjectFolder

__all__ = ["read_prompt_file", "build_pool", "split_corpus", "build_text_corpus", "PoolStats"]


def read_prompt_file(path: Path, setting: str = "corpus.extra_files") -> Iterator[str]:
    """The prompts in a local file: .jsonl (a "text" field per line) or one prompt a line.

    Raises CorpusError naming the file (and line) when it cannot be read as UTF-8 text.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorpusError(f"The prompt file {path} ({setting}) does not exist; fix the path "
                          f"in the corpus settings.") from None
    except IsADirectoryError:
        raise CorpusError(f"{path} ({setting}) is a folder, not a prompt file; list the "
                          f".txt or .jsonl files inside it instead.") from None
    except OSError as e:
        raise CorpusError(f"The prompt file {path} ({setting}) cannot be read ({e.strerror}); "
                          f"check its permissions.") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    is_jsonl = path.suffix.lower() == ".jsonl"
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()  # the newline ends the last line; it does not start an empty one
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise CorpusError(f"{path} line {number} is not UTF-8 text (byte {e.start + 1} of the "
                              f"line); save the file as UTF-8 and run again.") from None
        if not is_jsonl:
            yield line
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path} line {number} is not valid JSON ({e.msg}); each line of a "
                              f".jsonl prompt file must be an object with a \"text\" field.") from None
        if not isinstance(obj, dict):
            raise CorpusError(f"{path} line {number} is not a JSON object; each line of a .jsonl "
                              f"prompt file must be an object with a \"text\" field.")
        text = obj.get("text")
        if isinstance(text, str) and text:
            yield text


@dataclass
class PoolStats:
    read: int = 0
    too_short: int = 0
    too_long: int = 0
    duplicates: int = 0
    per_source: dict[str, int] = field(default_factory=dict)


def build_pool(sources: list[tuple[str, Iterator[str]]], min_chars: int, max_chars: int
               ) -> tuple[list[str], PoolStats]:
    """Normalised, length-filtered, case-insensitively de-duplicated prompts, in source order."""
    pool: list[str] = []
    seen: set[str] = set()
    stats = PoolStats()
    for name, texts in sources:
        kept = 0
        for text in texts:
            stats.read += 1
            text = " ".join(text.split())
            if len(text) < min_chars:
                stats.too_short += 1
            elif len(text) > max_chars:
                stats.too_long += 1
            elif text.lower() in seen:
                stats.duplicates += 1
            else:
                seen.add(text.lower())
                pool.append(text)
                kept += 1
        stats.per_source[name] = kept
    return pool, stats


def split_corpus(pool: list[str], n_train: int, n_val: int, empty_frac: float, seed: int
                 ) -> tuple[list[str], list[str]]:
    """(train, val): a seeded shuffle, val first, then the empty prompts injected."""
    rng = random.Random(seed)
    pool = list(pool)
    rng.shuffle(pool)
    val = pool[:n_val]
    train = pool[n_val:n_val + n_train]
    n_empty = int(len(train) * empty_frac)
    if n_empty:
        train[-n_empty:] = [""] * n_empty
        rng.shuffle(train)
    n_empty_val = max(1, int(len(val) * empty_frac)) if empty_frac > 0 else 0
    if n_empty_val:
        val[-n_empty_val:] = [""] * n_empty_val
    return train, val


def _files_mode(project: "ProjectFolder", report: "Report") -> str:
    c = project.settings.corpus
    for setting, value in (("corpus.train_file", c.train_file), ("corpus.val_file", c.val_file)):
        if not value:
            raise CorpusError(f'corpus.mode is "files" but {setting} is empty; pick your file or '
                              f'switch corpus.mode to "presets".')
        path = project.resolve_user_path(value)
        lines = sum(1 for _ in read_prompt_file(path, setting))  # readable, UTF-8
        report("artifact", path=str(path), kind=setting.split(".")[1], lines=lines)
    return "done"


def build_text_corpus(project: "ProjectFolder", report: "Report",
                      sources: Callable[[], list[tuple[str, Iterator[str]]]]) -> str:
    """data/train.txt and data/val.txt from the prompt sources (`sources()` reads them); in "files" mode the
    user's own files, checked."""
    c = project.settings.corpus
    if c.mode == "files":
        return _files_mode(project, report)

    sources = sources()
    n_files = len(c.extra_files)
    pool, stats = build_pool(sources, c.min_chars, c.max_chars)
    report("progress", count=n_files, total=max(n_files, 1), unit="files", detail="splitting")
    for name, kept in stats.per_source.items():
        report("log", level="info", message=f"{name}: {kept} prompts kept")
    report("log", level="info",
           message=f"{stats.read} prompts read, {len(pool)} kept ({stats.too_short} shorter than "
                   f"{c.min_chars} chars, {stats.too_long} longer than {c.max_chars}, "
                   f"{stats.duplicates} duplicates)")
    needed = c.n_val + 100
    if len(pool) < needed:
        raise CorpusError(
            f"The corpus has {len(pool)} usable prompts but needs at least {needed} "
            f"(corpus.n_val = {c.n_val} plus 100 for training); add prompt files or lower corpus.n_val.")
    train, val = split_corpus(pool, c.n_train, c.n_val, c.empty_frac, c.seed)
    if len(train) < c.n_train:
        report("log", level="warning",
               message=f"only {len(train)} train prompts available (corpus.n_train asks for {c.n_train})")
    train_path, val_path = project.corpus_files()
    write_corpus(val_path, val)
    write_corpus(train_path, train)
    for path, prompts, kind in ((train_path, train, "corpus_train"), (val_path, val, "corpus_val")):
        empty = sum(1 for p in prompts if not p)
        report("artifact", path=str(path), kind=kind, lines=len(prompts), empty=empty)
    return "done"

