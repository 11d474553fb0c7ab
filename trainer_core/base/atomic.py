"""Atomic file writes: a temp file in the same folder, fsync, rename, fsync the folder.

A reader (or a crash) sees either the old file or the new one, never half of one. A write the
disk refuses (full, read-only, no permission) leaves the old file as it was, removes the temp and
raises one sentence naming the file and the disk (base/diskspace.py); a writer that knows its size
passes `needs` and is refused before it starts when it cannot fit.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "read_json", "atomic_path",
           "remove_stale_temps", "remove_temps_in"]

# read once at import: os.umask can only be read by setting it, which is not thread-safe
_UMASK = os.umask(0)
os.umask(_UMASK)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk(e: OSError, path: Path, needs: int | None = None) -> BaseException | None:
    """The one-sentence error for an OSError met writing `path`, None when it is not about the disk
    or the folder (or about another file's)."""
    from trainer_core.base.diskspace import disk_error
    mine = e.filename is None or Path(e.filename).parent in (path.parent, path.parent.parent)
    return disk_error(e, path, needs) if mine or e.errno in _FULL else None


def _os_error_in(e: BaseException) -> OSError | None:
    """The OSError behind an exception: itself, one it was raised from or during (torch.save's
    cleanup raises a RuntimeError over the write's OSError), or the one a writer quoted in its text
    (safetensors: "No space left on device (os error 28)")."""
    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    if "No space left on device" in str(e) or "os error 28" in str(e):
        return OSError(errno.ENOSPC, "No space left on device")
    return None


def remove_stale_temps(*targets: str | os.PathLike) -> list[Path]:
    """Delete the temps an interrupted atomic write of each target left beside it (`.<name>.<random>.tmp`,
    see _mkstemp: a kill between the write and the rename). Only for files whose every writer holds the
    lock the caller holds, so no temp is in use."""
    found = [t for target in map(Path, targets) if target.parent.is_dir()
             for t in target.parent.glob(f".{glob.escape(target.name)}.*.tmp") if t.is_file()]
    return _unlink_all(found)


def remove_temps_in(folders: "list[Path]") -> list[Path]:
    """Delete every atomic-write temp (`.*.tmp`) in `folders`: for folders only the caller's stage writes,
    under the run lock it holds."""
    return _unlink_all([t for folder in folders if folder.is_dir() for t in folder.glob(".*.tmp") if t.is_file()])


def _unlink_all(paths: list[Path]) -> list[Path]:
    """Delete what can be deleted (a read-only folder keeps its leftovers: they are harmless, and the
    caller's own writes there will say what is wrong); the paths that are gone."""
    gone = []
    for path in paths:
        try:
            path.unlink(missing_ok=True)
            gone.append(path)
        except OSError:
            continue
    return gone


def _mkstemp(path: Path) -> tuple[int, str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise (_disk(e, path) or e) from e


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    fd, tmp = _mkstemp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            # keep the permissions of the file we replace
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        mapped = _disk(e, path, len(data)) if isinstance(e, OSError) else None
        if mapped is not None:
            raise mapped from e
        raise
    _fsync_dir(path.parent)


@contextmanager
def atomic_path(path: str | os.PathLike, needs: int = 0) -> Iterator[Path]:
    """For writers that need a file name (GGUF, torch.save): yields a temp path beside `path`;
    when the block ends normally the temp file is fsynced and renamed over `path`, otherwise it
    is removed and `path` is left as it was. Checks inside the block (reading the temp file back)
    run before the rename. `needs` (bytes, when known) is checked against the free space first."""
    path = Path(path)
    if needs:
        from trainer_core.base.diskspace import ensure_space
        ensure_space(path, needs)
    fd, tmp = _mkstemp(path)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        os_error = _os_error_in(e)
        mapped = _disk(os_error, path, needs or None) if os_error is not None else None
        if mapped is not None:
            raise mapped from e
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    """The parsed file, or `default` when it does not exist or is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return default


def _fsync_dir(folder: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
