"""Settings that cannot run on this machine, refused at `set` and the Setup tab's Save before they are saved (issue
55): a CUDA device this machine does not have, an adapter whose training the plan says would not fit the RAM (with
the deepest train.depth that would: advice.memory_warnings). A prompt file in corpus.extra_files that is not there
(yet) is a warning there; the corpus stage refuses it with the same sentence (exit 2) if it is still missing."""
from __future__ import annotations

from typing import Any

from trainer_core.base.config import Settings, flat_settings
from trainer_core.base.errors import ConfigError
from trainer_core.plan.advice import memory_warnings
from trainer_core.plan.make import hardware, make_plan
from trainer_core.project import Project

__all__ = ["unrunnable_settings", "setting_warnings", "refuse_unrunnable"]

DEVICE_KEYS = ("train.device", "precompute.device")


def unrunnable_settings(project: Project, after: Settings, changed: list[str],
                        hw: dict[str, Any] | None = None) -> list[str]:
    """One sentence per changed setting (`changed`: flat keys) of `after` that cannot run on this machine."""
    out: list[str] = []
    devices = [key for key in DEVICE_KEYS if key in changed]
    sizes = [key for key in ("train.depth", "train.width") if key in changed]
    if devices or sizes:
        hw = hw or hardware()
    for key in devices:
        value = getattr(getattr(after, key.split(".")[0]), "device")
        if not value.startswith("cuda"):
            continue
        index, cards = int(value.split(":")[1]) if ":" in value else 0, len(hw["gpus"])
        if index >= cards:
            have = f"its cards are cuda:0 to cuda:{cards - 1}" if cards else "it has no CUDA card nvidia-smi can see"
            out.append(f"{key}={value} names a card this machine does not have ({have}); use auto or cpu"
                       + (" or one of its cards" if cards else ""))
    if sizes:
        trial = Project(project.root, after)
        for warning in memory_warnings(trial, make_plan(trial, hw), hw):
            if warning.startswith("The train stage"):
                out.append(f"train.depth={after.train.depth} with train.width={after.train.width} cannot train on "
                           f"this machine: {warning[0].lower()}{warning[1:].rstrip('.')}")
    return out


def setting_warnings(project: Project, after: Settings, changed: list[str]) -> list[str]:
    """What a changed setting names that is not there yet: a prompt file of corpus.extra_files."""
    out = []
    if any(key.startswith("corpus.extra_files") for key in changed):
        for text in after.corpus.extra_files:
            path = project.resolve_user_path(text)
            if not path.is_file():
                what = "is a folder, not a prompt file" if path.is_dir() else "does not exist (yet)"
                out.append(f"corpus.extra_files names {path}, which {what}; the corpus stage needs it there")
    return out


def refuse_unrunnable(project: Project, assignments: list[str]) -> list[str]:
    """ConfigError (one sentence per setting, exit 2 on the CLI, on its field in the GUI) when `assignments` change
    a setting to a value this machine cannot run; before anything is saved (`set` and the Setup tab's Save).
    Returns the warnings to show beside the save (setting_warnings)."""
    _, after = project.apply_assignments(project.settings.to_dict(), assignments)
    b, a = flat_settings(project.settings.to_dict()), flat_settings(after.to_dict())
    changed = [key for key in a if a[key] != b.get(key)]
    problems = unrunnable_settings(project, after, changed)
    if problems:
        raise ConfigError(problems)
    return setting_warnings(project, after, changed)
