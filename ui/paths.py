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

import os
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PathPolicy", "PathRefused", "Entry", "KIND_SUFFIXES"]

KIND_SUFFIXES = {"model": (".gguf", ".safetensors"), "text": (".txt", ".jsonl", ".csv"), "dir": (), "any": None}


class PathRefused(ValueError):
    """A path outside the allowed roots, or not a usable path at all; the message is for the user."""


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
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise PathRefused(f"The {what} {raw!r} is not a full path; start it with / or ~.")
        resolved = path.resolve()            # follows symlinks: a link out of a root is refused
        for root in self.roots:
            if resolved == root or root in resolved.parents:
                return resolved
        allowed = ", ".join(str(r) for r in self.roots)
        raise PathRefused(f"The {what} {raw!r} is outside the folders this app may use ({allowed}); "
                          f"start the app with --allow-dir to add a folder.")

    def browse(self, text: str | os.PathLike, kind: str = "any") -> tuple[Path, list[Entry]]:
        """The folder at `text` (checked) and its entries: folders first, then files of the
        kind, each sorted case-insensitively, dot-files hidden, project folders marked."""
        folder = self.check(text, "folder")
        if not folder.is_dir():
            raise PathRefused(f"{folder} is not a folder.")
        suffixes = KIND_SUFFIXES.get(kind)
        dirs, files = [], []
        try:
            children = list(folder.iterdir())
        except OSError as e:
            raise PathRefused(f"{folder} cannot be listed ({e.strerror or e}).") from None
        for child in children:
            if child.name.startswith("."):
                continue
            try:
                is_dir = child.is_dir()
                inside = self._inside(child)
            except OSError:
                continue
            if not inside:                   # a symlink pointing out of the roots is not shown
                continue
            if is_dir:
                dirs.append(Entry(child.name, str(child), True, (child / "project.json").is_file(), None))
            elif kind != "dir" and (suffixes is None or child.suffix.lower() in suffixes):
                files.append(Entry(child.name, str(child), False, False, child.stat().st_size))
        key = lambda e: e.name.lower()  # noqa: E731
        return folder, sorted(dirs, key=key) + sorted(files, key=key)

    def _inside(self, path: Path) -> bool:
        resolved = path.resolve()
        return any(resolved == r or r in resolved.parents for r in self.roots)
