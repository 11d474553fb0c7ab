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
    # the allowed folders that do not come from the projects root (materials, --allow-dir): kept when the
    # projects root changes, which re-derives the policy from them and the new root alone
    fixed_roots: tuple[Path, ...] = ()
    demo_in_root: bool = True      # the demo folder is the projects root's (it moves with the root)
    # served on loopback without a login (its user is the machine's owner): only then may the
    # projects root be changed from the GUI; `serve` sets it, shared or authenticated apps never have it
    local: bool = False
