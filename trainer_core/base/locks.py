"""Exclusive OS file locks (flock on POSIX, msvcrt on Windows).

The lock belongs to the open file, so a child process that inherits the descriptor keeps
holding it after the parent closes its copy; the kernel releases it when the last holder
exits, whatever way it exits (kill -9 and reboots included). That is what makes the run
lock race-free: there is never a moment between "checked" and "spawned".
"""
from __future__ import annotations

import os
from pathlib import Path

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
    import msvcrt

__all__ = ["FileLock"]


class FileLock:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self, blocking: bool = False) -> bool:
        """Take the lock; False (non-blocking) when another process holds it."""
        if self.fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:         # a read-only or foreign folder: one sentence (base/diskspace.py)
            from trainer_core.base.diskspace import disk_error
            raise (disk_error(e, self.path) or e) from None
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            else:  # pragma: no cover
                msvcrt.locking(fd, msvcrt.LK_LOCK if blocking else msvcrt.LK_NBLCK, 1)
        except OSError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def adopt(self, fd: int) -> bool:
        """Use a descriptor inherited from the launcher; True if it is this lock file, held."""
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.path))
        except OSError:
            return False
        if not same:
            return False
        if fcntl is not None:
            try:  # re-locking our own open file description succeeds at once
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        os.close(fd)  # closing our descriptor; inheritors keep the lock

    def __enter__(self) -> "FileLock":
        self.acquire(blocking=True)
        return self

    def __exit__(self, *exc) -> None:
        self.release()
