"""Disk space and folder errors, as one sentence each.

`ensure_space(path, needs)` refuses a write of known size that cannot fit (a shard, a
checkpoint, a GGUF) before a byte is written; `disk_error(e, path)` turns the OSError a writer
got (no space, quota, read-only file system, permission denied, a file where a folder should be)
into a TrainerError that names the file, the disk and what to do, or returns None for any other
error (a bug, which keeps its traceback).
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from trainer_core.base.errors import DiskFullError, FolderError, TrainerError

__all__ = ["MARGIN", "free_bytes", "mount_of", "ensure_space", "ensure_writable", "disk_error", "human"]

MARGIN = 1 << 20           # kept free beyond a write's own size (the sidecars, logs and state after it)
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)


def human(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the disk that holds `path` (or would hold it), None if unknown."""
    try:
        return shutil.disk_usage(existing_folder(Path(os.path.abspath(path)))).free
    except OSError:
        return None


def mount_of(path: str | os.PathLike) -> str:
    """`<device> (mounted at <dir>)` for the mount that holds `path`: the deepest mount point above it in the
    mount table (a bind mount of the project's own folder included, which has the same device as its source
    and so is not found by comparing devices), else the nearest folder `os.path.ismount` finds."""
    where = Path(os.path.realpath(existing_folder(Path(os.path.abspath(path)))))
    device, point = "", None
    try:
        import psutil
        for p in psutil.disk_partitions(all=True):
            mp = Path(p.mountpoint)
            if (mp == where or mp in where.parents) and (point is None or len(mp.parts) >= len(point.parts)):
                device, point = p.device, mp
    except Exception:  # noqa: BLE001 — psutil is optional here
        pass
    if point is None:
        point = where
        while not os.path.ismount(point) and point != point.parent:
            point = point.parent
    return f"{device} (mounted at {point})" if device else f"the disk mounted at {point}"


def ensure_space(path: str | os.PathLike, needs: int, what: str = "") -> None:
    """Raise DiskFullError when `needs` bytes (+ MARGIN) do not fit beside `path`."""
    free = free_bytes(path)
    if free is not None and needs + MARGIN > free:
        raise DiskFullError(_full_sentence(Path(path), needs, free, what))


def ensure_writable(folder: str | os.PathLike) -> None:
    """Create `folder` if needed and make sure a file can be written in it (FolderError / DiskFullError)."""
    import tempfile
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise (disk_error(e, folder) or e) from None


def _full_sentence(path: Path, needs: int | None, free: int | None, what: str = "") -> str:
    sizes = ", ".join(x for x in (f"needs ~{human(needs)}" if needs else "",
                                  f"free {human(free)}" if free is not None else "") if x)
    path = Path(os.path.abspath(path))
    what = what or (f"into {path}" if path.is_dir() or not path.name else f"{path.name} ({path})")
    return (f"No space left on {mount_of(path)} while writing {what}"
            + (f" ({sizes})" if sizes else "")
            + "; free some space there (or point the project's output elsewhere) and start again: "
              "the run continues where it stopped.")


def disk_error(e: OSError, path: str | os.PathLike | None = None, needs: int | None = None,
               what: str = "") -> TrainerError | None:
    """The one-sentence error for an OSError of the disk or the folder, or None for other errors."""
    target = Path(path or e.filename or ".")
    if e.errno in _FULL:
        return DiskFullError(_full_sentence(target, needs, free_bytes(target), what))
    if e.errno == errno.EROFS:
        return FolderError(f"{mount_of(target)} is read-only, so {target} cannot be written; make it writable "
                           "or copy the project to a writable folder.")
    if e.errno in _DENIED:
        return FolderError(f"{target} cannot be written ({e.strerror}); check the permissions of "
                           f"{target.parent}, or copy the project to a folder you can write.")
    if e.errno == errno.ENOTDIR:
        blocker = next((p for p in (target, *target.parents) if p.exists() and not p.is_dir()), None)
        return FolderError(f"{blocker or target} is a file, not a folder, so {target} cannot be created there; "
                           "pick another place.")
    return None


# ---------------------------------------------------------------- the filesystem's name and path limits

NAME_MAX_FALLBACK = 255        # bytes in one path component, where pathconf cannot say
PATH_MAX_FALLBACK = 4096       # bytes in a whole path, the terminating NUL included


def existing_folder(path: Path) -> Path:
    """The nearest folder of `path` (itself or an ancestor) that exists: where the filesystem is asked."""
    for candidate in (path, *path.parents):
        if os.path.isdir(candidate):          # never raises: too long, a loop, a file in the way are False
            return candidate
    return Path(path.anchor or os.sep)


def _pathconf(folder: Path, name: str, fallback: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (AttributeError, ValueError, OSError):   # no pathconf (Windows), an unknown name, an unreadable folder
        return fallback
    return value if isinstance(value, int) and value > 0 else fallback


def fs_limits(path: str | os.PathLike) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) in bytes of the filesystem `path` lies on, or would be created on: asked of its
    nearest existing folder, 255 and 4096 where pathconf cannot say."""
    folder = existing_folder(Path(path))
    return _pathconf(folder, "PC_NAME_MAX", NAME_MAX_FALLBACK), _pathconf(folder, "PC_PATH_MAX", PATH_MAX_FALLBACK)


def path_too_long(key: str, path: Path) -> str | None:
    """One sentence when the filesystem cannot hold `path` (a name or the whole path too long), naming `key` (the
    setting or the argument that gave it), else None."""
    name_max, path_max = fs_limits(path)
    longest = max((len(part.encode("utf-8")) for part in path.parts), default=0)
    if longest > name_max:
        return f"{key} has a name of {longest} bytes; this filesystem allows at most {name_max}: choose a shorter name"
    size = len(str(path).encode("utf-8"))
    if size >= path_max:
        return f"{key} is a path of {size} bytes; this filesystem allows at most {path_max - 1}: choose a shorter path"
    return None
