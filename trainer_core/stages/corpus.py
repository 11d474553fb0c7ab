"""Corpus stage: prompt files → data/train.txt and data/val.txt (text packs); image packs build
data/train.jsonl and data/val.jsonl in `trainer_core.contract.image_corpus`, with these prompt sources as
their text-only share.

Sources are read in order (Hub presets, then `corpus.extra_files`); every prompt is
whitespace-normalised, kept when `min_chars ≤ len ≤ max_chars`, de-duplicated
case-insensitively (first wins), shuffled with `corpus.seed`, split into val then train,
and ~`empty_frac` of each split is replaced by the empty prompt so the adapter learns the
engine's empty CFG prompt. Both files are written atomically, one prompt a line; an empty
line is the empty prompt. In "files" mode the user's own train/val files are used verbatim.

The stage is short and writes in one piece, so a stop request waits for it to finish.
"""
from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from trainer_core.base import token_store
from trainer_core.base.atomic import remove_temps_in
from trainer_core.base.errors import CorpusError
from trainer_core.base.events import Report
from trainer_core.contract.corpus_files import write_corpus
from trainer_core.contract.image_corpus import build_image_corpus
from trainer_core.project import Project
from trainer_core.contract.prompt_presets import PRESETS, read_preset
from trainer_core.stages.base import exit_process, never, stage_main

__all__ = ["run", "prompt_sources", "read_prompt_file", "build_pool", "split_corpus"]


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


def _files_mode(project: Project, report: Report) -> str:
    c = project.settings.corpus
    for setting, value in (("corpus.train_file", c.train_file), ("corpus.val_file", c.val_file)):
        if not value:
            raise CorpusError(f'corpus.mode is "files" but {setting} is empty; pick your file or '
                              f'switch corpus.mode to "presets".')
        path = project.resolve_user_path(value)
        lines = sum(1 for _ in read_prompt_file(path, setting))  # readable, UTF-8
        report("artifact", path=str(path), kind=setting.split(".")[1], lines=lines)
    return "done"


def prompt_sources(project: Project, report: Report) -> list[tuple[str, Iterator[str]]]:
    """The prompt sources: each `corpus.presets` dataset (one that fails is skipped with a
    warning), then each `corpus.extra_files` file; CorpusError when there is none."""
    c = project.settings.corpus
    sources: list[tuple[str, Iterator[str]]] = []
    token = token_store.resolve(project.settings.hf_token)      # the project's own, else the Hugging Face login's
    for preset_id in c.presets:
        preset = PRESETS[preset_id]
        report("progress", count=0, total=1, unit="presets", detail=f"reading {preset.title} ({preset.repo})")
        try:
            texts = list(read_preset(preset, token))     # a failure surfaces here, not inside the pool
        except Exception as e:   # noqa: BLE001 — a failing source is skipped with a warning, as the brief says
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            report("log", level="warning", message=f"prompt preset {preset_id} ({preset.repo}) skipped: {first}")
            continue
        sources.append((f"preset {preset_id}", iter(texts)))
    files = [project.resolve_user_path(f) for f in c.extra_files]
    if not files and not sources:
        raise CorpusError(
            "The corpus has no prompt source: the presets could not be read (see the warnings) and "
            "corpus.extra_files is empty; check the network or add your .txt / .jsonl prompt files.")
    for i, path in enumerate(files):
        report("progress", count=i, total=len(files), unit="files", detail=f"reading {path.name}")
        sources.append((str(path), read_prompt_file(path)))
    return sources


def remove_temps(project: Project) -> list[Path]:
    """Delete leftover temps in data/ and data/images/ (a kill between a file's write and its
    rename leaves `.<name>.<random>.tmp`): the folder is this stage's own, the run lock means no
    other writer, and files-mode corpora elsewhere are the user's and never touched."""
    folders = [project.data_dir, project.data_dir / "images"]
    return remove_temps_in(folders)


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never) -> str:
    pack, c = project.pack, project.settings.corpus
    gone = remove_temps(project)
    if gone:
        report("log", level="info", message=f"removed {len(gone)} unfinished temporary file(s) of an interrupted run")
    if pack.corpus_kind == "image":
        return build_image_corpus(project, report, should_stop, functools.partial(prompt_sources, project, report))
    if c.mode == "files":
        return _files_mode(project, report)

    sources = prompt_sources(project, report)
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


if __name__ == "__main__":
    exit_process(stage_main("corpus", run))
