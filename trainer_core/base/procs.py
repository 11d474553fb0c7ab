"""Our processes on record: pid files and their liveness, the run lock's descriptor variable.

Pid files are JSON ({pid, create_time, argv}); a pid counts as ours only while a process
with that pid, that start time and one of our command-line markers exists, so a pid that
the OS recycled after a reboot is not mistaken for a live run.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psutil

from trainer_core.base.atomic import atomic_write_json, read_json

__all__ = ["LOCK_FD_ENV", "MARKERS", "write_pid_file", "read_pid_file", "pid_alive", "wait_peak_rss"]

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


def _high_water(pid: int) -> int:
    """VmHWM of a live process in bytes (its memory map's peak RSS); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return max([0, *(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))])
    except (OSError, ValueError):
        return 0


def wait_peak_rss(proc: subprocess.Popen, every_s: float = 0.02) -> int:
    """Wait for `proc` to exit; the peak RSS in bytes of the largest of it and its descendants, each its own
    (VmHWM, read every `every_s` until it exits: the high-water mark only grows, so all but a process's last
    `every_s` are in it). Not ru_maxrss: Linux carries the parent's RSS at the fork into a child's, so a stage
    started by the GUI would report the GUI's size. 0 where /proc has no VmHWM (not Linux)."""
    peaks: dict[int, int] = {}
    while True:
        try:
            family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            family = [proc.pid]
        for pid in family:
            peaks[pid] = max(peaks.get(pid, 0), _high_water(pid))
        try:
            proc.wait(timeout=every_s)
            return max(peaks.values())
        except subprocess.TimeoutExpired:
            continue
