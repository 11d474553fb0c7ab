"""The project bound to the pack registry: `Project` is a `ProjectFolder` (base/folder.py: paths,
settings and state I/O, the locks) whose catalog is the registry (trainer_core.packs), and the
settings helpers with the pack overlays. The layers above the packs (stages, services, the GUI)
open projects through here; the contract and the packs take a ProjectFolder and never import this.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from trainer_core.base import config
from trainer_core.base.config import Settings
from trainer_core.base.folder import (PROJECT_FILE, ProjectFolder, default_projects_root, folder_is_project,
                                      last_project, new_state, remember_last_project, repair_state, user_dir)
from trainer_core.packs import DEFAULT_PACK, PACKS, TrainerPack, get_pack

__all__ = [
    "Project", "user_dir", "default_projects_root", "remember_last_project", "last_project",
    "new_state", "repair_state", "folder_is_project", "default_settings_dict", "settings_from_dict",
    "apply_assignments", "PROJECT_FILE", "REGISTRY",
]


class _Registry:
    """The pack registry as a folder's PackCatalog."""

    packs: Mapping[str, Any] = PACKS
    default: str = DEFAULT_PACK

    def get(self, pack_id: str) -> TrainerPack:
        return get_pack(pack_id)


REGISTRY = _Registry()


class Project(ProjectFolder):
    """An opened project whose packs are the registry's."""

    catalog = REGISTRY

    @property
    def pack(self) -> TrainerPack:
        return get_pack(self.settings.pack)

    def archive_work(self) -> list[Path]:
        """Move shards/ and checkpoints/ aside (`<name>.stale-<time>`); returns where they went."""
        from trainer_core.contract.checkpoints import move_aside
        return [t for t in (move_aside(f) for f in (self.root / "shards", self.checkpoints_dir)) if t is not None]


def default_settings_dict(pack_id: str = DEFAULT_PACK) -> dict:
    """Built-in defaults with the pack's overlay: what a new project of that pack starts from."""
    return config.default_settings_dict(get_pack(pack_id))


def settings_from_dict(raw: Any) -> Settings:
    """Validate a project.json object (merged over the defaults of its pack) into Settings."""
    return Project.settings_from_dict(raw)


def apply_assignments(raw: dict, assignments: list[str]) -> tuple[dict, Settings]:
    """`key=value` assignments over `raw`, validated with the pack's overlay (see config)."""
    return Project.apply_assignments(raw, assignments)
