"""Our processes on record: pid files and their liveness, the run lock's descriptor variable.

Pid files are JSON ({pid, create_time, argv}); a pid counts as ours only while a process
with that pid, that start time and one of our command-line markers exists, so a pid that
the OS recycled after a reboot is not mistaken for a live run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from trainer_core.base.atomic import atomic_write_json, read_json

__all__ = ["LOCK_FD_ENV", "MARKERS", "write_pid_file", "read_pid_file", "pid_alive"]

LOCK_FD_ENV = "GGUF_TRAINER_LOCK_FD"
MARKERS = ("trainer_core", "gguf-trainer", "gguf_trainer")


def write_pid_file(path: Path, pid: int) -> None:
    try:
        proc = psutil.Process(pid)
        record = {"pid": pid, "create_time": proc.create_time(), "argv": proc.cmdline()}
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        record = {"pid": pid, "create_time": None, "argv": []}
    atomic_write_json(path, record)


def read_pid_file(path: Path) -> dict[str, Any] | None:
    record = read_json(path)
    if isinstance(record, dict) and isinstance(record.get("pid"), int):
        return record
    return None


def pid_alive(record: dict[str, Any] | None) -> bool:
    """True while the recorded process runs: same pid, same start time, one of our markers."""
    if not record:
        return False
    try:
        proc = psutil.Process(record["pid"])
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = record.get("create_time")
        if created is not None and abs(proc.create_time() - float(created)) > 1.0:
            return False
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.AccessDenied:
            return True
        return any(m in cmdline for m in MARKERS)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
