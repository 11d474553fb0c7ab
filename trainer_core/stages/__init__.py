"""The six pipeline stages, in order, and how each is proven done from the files on disk.

"Done" never comes from state.json: after a crash or a reboot the state may be stale, the
files are not. A stage whose `module` is None is not implemented in this version; the
pipeline reports that as a failure instead of pretending.

Stages marked `chains` may hand over to the next stage inside their own process (see
stages/base.py): corpus → precompute_val → precompute_train share one process (the student and
the teacher load once), train → export → eval another (one interpreter start and one torch
import instead of three). The teacher's process still ends before training starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer_core.base import collector

collector.pause_for_imports()     # in a stage process, before its imports (base/collector.py)

from trainer_core.contract import checkpoints  # noqa: E402
from trainer_core.project import Project  # noqa: E402
from trainer_core.contract.shards import split_complete  # noqa: E402

__all__ = ["StageSpec", "STAGES", "STAGE_NAMES", "stage_done", "stage_wanted", "spec_of", "export_current"]


@dataclass(frozen=True)
class StageSpec:
    name: str              # as the CLI and events spell it
    title: str             # as the GUI shows it
    module: str | None     # `python -m <module> --project DIR <args>`; None: not in this version
    split: str | None = None  # precompute: the corpus split (`--split`, or run(split=...) in a chain)
    forceable: bool = False  # --force re-runs it even when done
    chains: bool = False     # its process may go on to the next stage (stages/base.py)

    @property
    def args(self) -> tuple[str, ...]:
        return ("--split", self.split) if self.split else ()

    @property
    def kwargs(self) -> dict[str, str]:
        """The keyword arguments of the module's run() beside (project, report, should_stop)."""
        return {"split": self.split} if self.split else {}


STAGES: tuple[StageSpec, ...] = (
    StageSpec("corpus", "Corpus", "trainer_core.stages.corpus", chains=True),
    StageSpec("precompute_val", "Precompute (val)", "trainer_core.stages.precompute", "val", chains=True),
    StageSpec("precompute_train", "Precompute (train)", "trainer_core.stages.precompute", "train"),
    StageSpec("train", "Train adapter", "trainer_core.stages.train", chains=True),
    StageSpec("export", "Export GGUF", "trainer_core.stages.export", forceable=True, chains=True),
    StageSpec("eval", "Evaluate", "trainer_core.stages.evaluate", forceable=True),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def spec_of(name: str) -> StageSpec:
    return STAGES[STAGE_NAMES.index(name)]


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:           # missing, a file in its path, a name the filesystem cannot hold: not there
        return None


def export_current(project: Project) -> bool:
    """The GGUF is at least as new as checkpoints/best.pt (it is that checkpoint's export), and the pack's
    files beside it are current: whether export has anything to redo for the checkpoint there is now."""
    gguf, best = _mtime(project.gguf_path()), checkpoints.mtime(project, checkpoints.BEST)
    return gguf is not None and best is not None and gguf >= best and not project.pack.extras.stale(project)


def stage_done(project: Project, name: str, verify: bool = False) -> bool:
    """Whether `name`'s result is on disk and current. A precompute split is done when every shard the corpus
    needs is there, whole and under its own name (by the headers, cheap enough for status); with `verify` (a run
    deciding what to do) each shard's data is also read against its digest, once per process. Export is done when
    the GGUF is best.pt's export and training is done (`train.steps` reached); eval when eval.json is at least as
    new as a done export."""
    if name == "corpus":
        return all(p.is_file() for p in project.corpus_files())
    if name in ("precompute_val", "precompute_train"):
        return split_complete(project, name.split("_", 1)[1], verify)
    if name == "train":
        last = checkpoints.read_sidecar(project, checkpoints.LAST)
        return last is not None and last.trained_steps >= project.settings.train.steps
    if name == "export":
        # an export of a training that has steps to go is of a shorter training than the one planned: not done
        # (status calls it stale; a run exports again once training is done)
        return export_current(project) and stage_done(project, "train")
    if name == "eval":
        ev, gguf = _mtime(project.eval_json), _mtime(project.gguf_path())
        return stage_done(project, "export") and ev is not None and ev >= gguf
    raise KeyError(name)


def stage_wanted(project: Project, name: str, forced: bool = False) -> bool:
    """Whether a run has `name` to do now: forced (export, eval), or not done on disk; never eval
    while export.run_eval is off. The settings are read again, as a new stage process would read them."""
    settings = project.reload()
    if name == "eval" and not settings.export.run_eval:
        return False
    return (forced and spec_of(name).forceable) or not stage_done(project, name, verify=True)
