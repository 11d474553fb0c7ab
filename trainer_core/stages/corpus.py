"""Corpus stage: the prompt sources (Hub presets, then `corpus.extra_files`) → the pack's corpus files, built by
its corpus kind (contract/corpus_kinds.py): data/train.txt and data/val.txt for text packs
(contract/text_corpus.py), data/train.jsonl and data/val.jsonl for image packs (contract/image_corpus.py, with
these prompts as their text-only share).

The stage is short and writes in one piece, so a stop request waits for it to finish.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Iterator

from trainer_core.base import token_store
from trainer_core.base.atomic import remove_temps_in
from trainer_core.base.errors import CorpusError, first_line
from trainer_core.base.events import Report
from trainer_core.contract.text_corpus import build_pool, read_prompt_file, split_corpus
from trainer_core.packs.lookup import require_material
from trainer_core.project import Project
from trainer_core.contract.prompt_presets import PRESETS, read_preset
from trainer_core.stages.base import exit_process, never, stage_main

__all__ = ["run", "prompt_sources", "read_prompt_file", "build_pool", "split_corpus"]


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
            first = first_line(e)
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
    gone = remove_temps(project)
    if gone:
        report("log", level="info", message=f"removed {len(gone)} unfinished temporary file(s) of an interrupted run")
    return project.pack.corpus_kind.build(project, report, should_stop,
                                          functools.partial(prompt_sources, project, report),
                                          functools.partial(require_material, project))

if __name__ == "__main__":
    exit_process(stage_main("corpus", run))
