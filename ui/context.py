"""What every tab's handlers share: the Supervisor, the path policy and the app's options.
Built once per app by `ui.app.build_app`; nothing here is a module global.

The app's own project: the project last opened, created or demo'd through this app (`Ctx.project`),
which every page load shows. It is kept in memory and, so that it survives a restart, in
`user_dir()/app_projects.json` under the app's projects root — never in the global last project
(`settings.json`), which every CLI command overwrites: a command run in a terminal never changes
what an open app shows. A brand-new app (nothing remembered under its root) starts, once, with the
global last project of the moment; after that only what its own user opens counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.base.errors import TrainerError
from trainer_core.base.locks import FileLock
from trainer_core.project import last_project, user_dir
from trainer_core.supervisor import Supervisor

from ui.paths import PathPolicy

__all__ = ["Ctx", "APP_PROJECTS_FILE", "remembered_app_project", "remember_app_project"]

APP_PROJECTS_FILE = "app_projects.json"       # in user_dir(): {projects root: the project its app last opened}
_NOTHING = object()


def _app_projects() -> Path:
    return user_dir() / APP_PROJECTS_FILE


def _key(projects_root: Path) -> str:
    return str(Path(projects_root).expanduser().resolve())


def remembered_app_project(projects_root: Path, default: Any = None) -> Any:
    """The project the app serving `projects_root` last had open (None: it had none), or `default` when
    no app with that root remembered anything."""
    data = read_json(_app_projects(), {})
    if not isinstance(data, dict) or _key(projects_root) not in data:
        return default
    value = data[_key(projects_root)]
    return Path(value) if isinstance(value, str) and value and Path(value).is_absolute() else None


def remember_app_project(projects_root: Path, project: Path | None) -> None:
    """Remember the project (None: that none is open) of the app serving `projects_root`; a lock keeps
    two apps writing at once from losing each other's entry."""
    with FileLock(user_dir() / (APP_PROJECTS_FILE + ".lock")):
        data = read_json(_app_projects(), {})
        data = data if isinstance(data, dict) else {}
        data[_key(projects_root)] = str(Path(project).resolve()) if project is not None else None
        atomic_write_json(_app_projects(), data)


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
    # the project this app last opened, created or demo'd (see the module's docstring); `seeded` once the
    # app has settled what it starts with
    project: Path | None = None
    seeded: bool = False
    first_tab: str = "setup"       # the tab a page load opens on: "train" for `app.py --demo`, whose run is to watch

    def remember_project(self, root: Path | None) -> None:
        """`root` is now this app's project (None: no project open), in memory and in its file. A file that
        cannot be written (a read-only home) loses only the next start's memory, never this one."""
        self.project, self.seeded = (Path(root) if root is not None else None), True
        try:
            remember_app_project(self.projects_root, self.project)
        except (OSError, TrainerError):
            pass

    def start_project(self) -> Path | None:
        """The project a page load shows. Settled once per app: what the app remembered under its
        projects root, else (an app never used before) the global last project of that moment."""
        if not self.seeded:
            found = remembered_app_project(self.projects_root, default=_NOTHING)
            self.project = last_project() if found is _NOTHING else found
            self.seeded = True
        return self.project
