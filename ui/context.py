"""What every tab's handlers share: the Supervisor, the path policy and the app's options.
Built once per app by `ui.app.build_app`; nothing here is a module global."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer_core.supervisor import Supervisor

from ui.paths import PathPolicy

__all__ = ["Ctx"]


@dataclass
class Ctx:
    supervisor: Supervisor
    paths: PathPolicy
    projects_root: Path
    demo_root: Path
    tick_s: float = 1.5
