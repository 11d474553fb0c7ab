"""The projects root chosen from the GUI, and remembered for the next start.

Only the machine's owner may choose it: an app served on loopback without a login (`Ctx.local`);
a shared or authenticated app keeps the folders it was started with. The new root must be an
existing folder, named by a full path; what becomes allowed is its real location (symlinks
followed), never the filesystem root nor the app's own settings folder. The allowed folders are
then re-derived from that root and the folders the command line and the environment named
(`Ctx.fixed_roots`) — the old root, remembered projects and opened projects add nothing. The
choice is kept in the app's settings file (`user_dir()/settings.json`, beside `last_project`)
and used at the next local start without `--projects-root`.
"""
from __future__ import annotations

from pathlib import Path

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.base.errors import TrainerError
from trainer_core.cli import DEMO_FOLDER
from trainer_core.project import user_dir

from ui.context import Ctx
from ui.paths import PathPolicy, PathRefused

__all__ = ["remembered_root", "remember_root", "checked_root", "change_projects_root", "SETTINGS_KEY"]

SETTINGS_KEY = "projects_root"


def _settings_file() -> Path:
    return user_dir() / "settings.json"


def remembered_root() -> Path | None:
    """The projects root chosen in the GUI, if it is still an existing folder."""
    data = read_json(_settings_file(), {})
    value = data.get(SETTINGS_KEY) if isinstance(data, dict) else None
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    return path if path.is_absolute() and path.is_dir() else None


def remember_root(root: Path) -> None:
    data = read_json(_settings_file(), {})
    data = data if isinstance(data, dict) else {}
    data[SETTINGS_KEY] = str(root)
    atomic_write_json(_settings_file(), data)


def checked_root(text: str) -> Path:
    """The folder `text` names, resolved; PathRefused when it cannot be a projects root."""
    raw = str(text or "").strip()
    if not raw:
        raise PathRefused("The projects root is empty; type the full path of an existing folder.")
    if "\0" in raw:
        raise PathRefused("The projects root holds a NUL character; type a plain path.")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise PathRefused(f"The projects root {raw!r} is not a full path; start it with / or ~.")
    resolved = path.resolve()                # a link counts as the folder it points to
    if not resolved.is_dir():
        raise PathRefused(f"The projects root {raw!r} is not an existing folder; create it first.")
    if resolved == Path(resolved.anchor):
        raise PathRefused("The filesystem root cannot be the projects root; pick a folder inside it.")
    own = user_dir().expanduser().resolve()
    if resolved == own or own in resolved.parents:
        raise PathRefused(f"{resolved} is the app's own settings folder; pick another folder.")
    return resolved


def change_projects_root(ctx: Ctx, text: str) -> Path:
    """Make `text` the projects root of this app and remember it; returns the resolved root."""
    if not ctx.local:
        raise PathRefused("The projects root can be changed only in an app served on this computer without a "
                          "login; restart the app with --projects-root DIR.")
    root = checked_root(text)
    demo = root / DEMO_FOLDER if ctx.demo_in_root else ctx.demo_root
    # re-derived from the new root and the fixed folders alone (never from the old root or any project)
    policy = PathPolicy([root, *([] if ctx.demo_in_root else [demo]), *ctx.fixed_roots])
    try:
        remember_root(root)
    except (OSError, TrainerError) as e:
        raise PathRefused(f"The projects root could not be remembered ({e}).") from None
    ctx.paths, ctx.projects_root, ctx.demo_root = policy, root, policy.check(demo, "demo folder")
    return root
