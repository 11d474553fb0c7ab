"""Our processes on record: pid files and their liveness, the run lock's descriptor variable.

Pid files are JSON ({pid, create_time, argv}); a pid counts as ours only while a process
with that pid, that start time and one of our command-line markers exists, so a pid that
the OS recycled after a reboot is not mistaken for a live run.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from trainer_core.base.atomic import atomic_write_json, read_json

__all__ = ["LOCK_FD_ENV", "MARKERS", "write_pid_file", "read_pid_file", "pid_alive", "wait_peak_rss", "Usage",
           "wait_usage", "run_delays"]

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


@dataclasses.dataclass(frozen=True)
class Usage:
    """What a finished process took, in figures that a loaded machine does not inflate the way it inflates the
    wall time. `cpu_seconds`: user + system time of it and of the descendants it waited for (wait4's rusage;
    None where wait4 is missing, Windows, or another waiter reaped it first). `queued_seconds`: how long its main
    thread was ready to run but waiting for a core other processes held (the scheduler's run delay,
    /proc/<pid>/task/<tid>/schedstat); `queued_all_seconds`: the same summed over every thread it had. Both are
    the process's own, not its descendants', and 0 where the kernel keeps no schedstat (not Linux)."""
    peak_rss_bytes: int
    cpu_seconds: float | None
    queued_seconds: float = 0.0
    queued_all_seconds: float = 0.0


_FAMILY_SCAN_S = 0.25


def wait_peak_rss(proc: subprocess.Popen, every_s: float = 0.02) -> int:
    """Wait for `proc` to exit; the peak RSS in bytes of the largest of it and its descendants (wait_usage)."""
    return wait_usage(proc, every_s).peak_rss_bytes


def wait_usage(proc: subprocess.Popen, every_s: float = 0.02) -> Usage:
    """Wait for `proc` to exit (its returncode set, as Popen.wait sets it); its Usage, read every `every_s` until
    it exits. The peak RSS is the largest of it and its descendants, each its own (VmHWM: the high-water mark
    only grows, so all but a process's last `every_s` are in it). Not ru_maxrss: Linux carries the parent's RSS
    at the fork into a child's, so a stage started by the GUI would report the GUI's size. 0 where /proc has no
    VmHWM (not Linux). The run delays are each thread's last reading (a thread's last `every_s` is missed). Its
    descendants are looked for every _FAMILY_SCAN_S (a scan reads the stat of every process on the machine: at
    every reading it cost more CPU than a demo's export), each one's peak read every `every_s` from then on."""
    peaks: dict[int, int] = {}
    queued: dict[int, float] = {}           # thread id → its run delay so far
    family, next_scan = [proc.pid], 0.0
    while True:
        if time.monotonic() >= next_scan:   # a scan reads every process's stat: not at every reading
            try:
                family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                family = [proc.pid]
            next_scan = time.monotonic() + _FAMILY_SCAN_S
        for pid in family:
            peaks[pid] = max(peaks.get(pid, 0), _high_water(pid))
        for tid, seconds in run_delays(proc.pid).items():      # a delay only grows: a zombie's reading is no less
            queued[tid] = max(queued.get(tid, 0.0), seconds)
        cpu, done = _reaped(proc)
        if done:
            return Usage(max(peaks.values()), cpu, queued.get(proc.pid, 0.0), sum(queued.values()))
        time.sleep(every_s)


def run_delays(pid: int) -> dict[int, float]:
    """Seconds each live thread of `pid` has spent ready to run but waiting for a core (schedstat's second
    field, nanoseconds); {} once the process is gone or where there is no schedstat."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                out[int(tid)] = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


def _reaped(proc: subprocess.Popen) -> tuple[float | None, bool]:
    """(CPU seconds, whether it has exited): reaps `proc` with wait4 once it has, setting its returncode."""
    if not hasattr(os, "wait4") or proc.returncode is not None:
        try:
            proc.wait(timeout=0)
            return None, True
        except subprocess.TimeoutExpired:
            return None, False
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:                 # reaped by another waiter: the exit is known, its usage is not
        proc.wait()
        return None, True
    if pid == 0:
        return None, False
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, True
