"""The folders the GUI may touch, and the file browser over them.

Every path the UI accepts (project folders, materials, output folders, browse requests) goes
through `PathPolicy.check`: it must be absolute (or start with ~), and once resolved —
symlinks followed, `..` collapsed — lie inside one of the allowed roots. The roots are the
projects root, the materials folder (GGUF_TRAINER_MATERIALS), the demo folder, and folders the
local user names with `--allow-dir` (or GGUF_TRAINER_ALLOWED_DIRS, separated by the OS path
separator). A remote user of a shared app cannot add roots; the user of a local app (loopback,
no login) may replace the projects root, which re-derives the policy (ui/projects_root.py).
"""
from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from trainer_core.base.diskspace import existing_folder as _existing_folder, fs_limits

__all__ = ["PathPolicy", "PathRefused", "Entry", "KIND_SUFFIXES", "fs_limits", "check_name", "check_length",
           "os_error_sentence", "shown"]

KIND_SUFFIXES = {"model": (".gguf", ".safetensors"), "text": (".txt", ".jsonl", ".csv"), "dir": (), "any": None}


class PathRefused(ValueError):
    """A path outside the allowed roots, or not a usable path at all; the message is for the user."""


def shown(text: str | os.PathLike, limit: int = 120) -> str:
    """`text` as a message quotes it: a very long path is shortened in the middle."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit * 2 // 3]}…{text[-(limit // 3):]}"


def _size(text: str) -> tuple[int, str]:
    """The length of `text` as the filesystem counts it (bytes), and the unit a message says it in."""
    size = len(os.fsencode(text))
    return size, "characters" if size == len(text) else "bytes"


def _encodable(text: str, what: str) -> None:
    try:
        os.fsencode(text)
    except UnicodeError:
        raise PathRefused(f"The {what} holds characters this system cannot use in a file name; "
                          f"type it with ordinary characters.") from None


def check_name(parent: str | os.PathLike, name: str, what: str = "name") -> str:
    """`name` as one new folder under `parent`, or PathRefused (one sentence naming `what`) when the
    filesystem could not hold it. Nothing is touched on disk but pathconf of `parent`'s nearest existing folder."""
    if "\0" in name:
        raise PathRefused(f"The {what} holds a NUL character; type a plain name.")
    _encodable(name, what)
    name_max, _ = fs_limits(parent)
    size, unit = _size(name)
    if size > name_max:
        raise PathRefused(f"The {what} has {size} {unit}; this filesystem allows at most {name_max} — "
                          f"choose a shorter name.")
    return name


def check_length(path: Path, what: str) -> None:
    """PathRefused when `path` (absolute, normalised) has a component or a total length the filesystem it
    would be on cannot hold. Only the components that do not exist yet are measured against NAME_MAX (the
    existing ones are on disk already, perhaps on another filesystem)."""
    base = _existing_folder(path)
    name_max, path_max = fs_limits(base)
    for part in path.relative_to(base).parts:
        size, unit = _size(part)
        if size > name_max:
            raise PathRefused(f"The {what} path has a component of {size} {unit}; this filesystem allows at most "
                              f"{name_max} — choose a shorter name.")
    size, unit = _size(str(path))
    if size >= path_max:                      # PATH_MAX counts the terminating NUL
        raise PathRefused(f"The {what} path is {size} {unit} long; this filesystem allows at most {path_max - 1} "
                          f"— choose a shorter path.")


def os_error_sentence(e: BaseException, what: str, path: str | os.PathLike | None = None) -> str:
    """One sentence for an OSError (or pathlib's "Symlink loop" RuntimeError, before Python 3.13) met while
    using the `what`."""
    at = f" ({shown(path)})" if path is not None else ""
    code = getattr(e, "errno", None)
    if code == errno.ELOOP or (isinstance(e, RuntimeError) and str(e).startswith("Symlink loop")):
        return f"The {what} path{at} goes round a loop of symbolic links; remove the loop or choose another folder."
    if code == errno.ENAMETOOLONG:
        return f"The {what} path{at} is too long for this filesystem; choose a shorter path."
    if code == errno.ENOTDIR:
        return f"The {what} path{at} goes through a file as if it were a folder; check the path."
    if code in (errno.EACCES, errno.EPERM):
        return f"The {what}{at} cannot be used: permission denied; choose a folder you may read and write."
    detail = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return f"The {what}{at} cannot be used ({detail}); check the path."


@dataclass(frozen=True)
class Entry:
    name: str
    path: str
    is_dir: bool
    is_project: bool
    size: int | None


class PathPolicy:
    def __init__(self, roots: list[str | os.PathLike]):
        self._lock = threading.Lock()
        self._roots: list[Path] = []
        for root in roots:
            self.allow(root)

    @property
    def roots(self) -> list[Path]:
        with self._lock:
            return list(self._roots)

    def allow(self, root: str | os.PathLike) -> Path:
        """Add a root (created if missing, so that it can be browsed); returns it resolved."""
        path = Path(root).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        resolved = path.resolve()
        with self._lock:
            if resolved not in self._roots:
                self._roots.append(resolved)
        return resolved

    def check(self, text: str | os.PathLike, what: str = "path") -> Path:
        """The resolved path, or PathRefused naming `what` and the allowed folders."""
        raw = str(text).strip()
        if not raw:
            raise PathRefused(f"The {what} is empty; pick a folder with Browse or type a full path.")
        if "\0" in raw:
            raise PathRefused(f"The {what} holds a NUL character; type a plain path.")
        _encodable(raw, what)
        try:
            path = Path(raw).expanduser()
        except RuntimeError:                 # ~user of no such user
            raise PathRefused(f"The {what} {shown(raw)!r} names an unknown user's home; type a full path.") from None
        if not path.is_absolute():
            raise PathRefused(f"The {what} {shown(raw)!r} is not a full path; start it with / or ~.")
        try:
            resolved = path.resolve()        # follows symlinks: a link out of a root is refused
        except (OSError, RuntimeError) as e:  # too long, a loop (RuntimeError before Python 3.13), unreadable
            if getattr(e, "errno", None) == errno.ENAMETOOLONG:
                check_length(Path(os.path.normpath(path)), what)     # the precise sentence, with the limit
            raise PathRefused(os_error_sentence(e, what)) from None
        if not any(resolved == root or root in resolved.parents for root in self.roots):
            allowed = ", ".join(str(r) for r in self.roots)
            raise PathRefused(f"The {what} {shown(raw)!r} is outside the folders this app may use ({allowed}); "
                              f"start the app with --allow-dir to add a folder.")
        check_length(resolved, what)        # before anything is opened or created there
        return resolved

    def browse(self, text: str | os.PathLike, kind: str = "any") -> tuple[Path, list[Entry]]:
        """The folder at `text` (checked) and its entries: folders first, then files of the
        kind, each sorted case-insensitively, dot-files hidden, project folders marked."""
        folder = self.check(text, "folder")
        suffixes = KIND_SUFFIXES.get(kind)
        dirs, files = [], []
        try:
            if not folder.is_dir():
                raise PathRefused(f"{shown(folder)} is not a folder.")
            children = list(folder.iterdir())
        except OSError as e:
            raise PathRefused(f"{shown(folder)} cannot be listed ({e.strerror or e}).") from None
        for child in children:
            if child.name.startswith("."):
                continue
            try:
                is_dir = child.is_dir()
                if not self._inside(child):  # a symlink pointing out of the roots is not shown
                    continue
                if is_dir:
                    dirs.append(Entry(child.name, str(child), True, (child / "project.json").is_file(), None))
                elif kind != "dir" and (suffixes is None or child.suffix.lower() in suffixes):
                    files.append(Entry(child.name, str(child), False, False, child.stat().st_size))
            except (OSError, RuntimeError):  # gone meanwhile, unreadable, a loop: not listed
                continue
        key = lambda e: e.name.lower()  # noqa: E731
        return folder, sorted(dirs, key=key) + sorted(files, key=key)

    def _inside(self, path: Path) -> bool:
        resolved = path.resolve()
        return any(resolved == r or r in resolved.parents for r in self.roots)
