"""The six pipeline stages, in order, and how each is proven done from the files on disk.

"Done" never comes from state.json: after a crash or a reboot the state may be stale, the
files are not. A stage whose `module` is None is not implemented in this version; the
pipeline reports that as a failure instead of pretending.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer_core.contract import checkpoints
from trainer_core.project import Project
from trainer_core.contract.shards import expected_shards, valid_shards

__all__ = ["StageSpec", "STAGES", "STAGE_NAMES", "stage_done"]


@dataclass(frozen=True)
class StageSpec:
    name: str              # as the CLI and events spell it
    title: str             # as the GUI shows it
    module: str | None     # `python -m <module> --project DIR <args>`; None: not in this version
    args: tuple[str, ...] = ()
    forceable: bool = False  # --force re-runs it even when done


STAGES: tuple[StageSpec, ...] = (
    StageSpec("corpus", "Corpus", "trainer_core.stages.corpus"),
    StageSpec("precompute_val", "Precompute (val)", "trainer_core.stages.precompute", ("--split", "val")),
    StageSpec("precompute_train", "Precompute (train)", "trainer_core.stages.precompute", ("--split", "train")),
    StageSpec("train", "Train adapter", "trainer_core.stages.train"),
    StageSpec("export", "Export GGUF", "trainer_core.stages.export", forceable=True),
    StageSpec("eval", "Evaluate", "trainer_core.stages.evaluate", forceable=True),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None


def stage_done(project: Project, name: str) -> bool:
    if name == "corpus":
        return all(p.is_file() for p in project.corpus_files())
    if name in ("precompute_val", "precompute_train"):
        split = name.split("_", 1)[1]
        return len(valid_shards(project, split)) >= expected_shards(project, split)
    if name == "train":
        last = checkpoints.read_sidecar(project, checkpoints.LAST)
        return last is not None and last.trained_steps >= project.settings.train.steps
    if name == "export":
        gguf, best = _mtime(project.gguf_path()), checkpoints.mtime(project, checkpoints.BEST)
        return gguf is not None and best is not None and gguf >= best
    if name == "eval":
        ev, gguf = _mtime(project.eval_json), _mtime(project.gguf_path())
        return stage_done(project, "export") and ev is not None and ev >= gguf
    raise KeyError(name)
