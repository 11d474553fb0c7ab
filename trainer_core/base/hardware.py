"""Hardware and environment readings for the GUI: the machine (CPU, RAM, GPUs through
nvidia-smi, disk free at the project) and one process (CPU %, RSS, threads).

The machine's CPU load comes from one `CpuLoad` sampler (`cpu_load()`), whichever thread asks:
psutil's `cpu_percent(interval=None)` keeps its baseline per *thread*, so a GUI handler running
on a fresh pool thread read 0.0 while the Train tab (the Supervisor's thread) read 100%.

No torch import here: the GUI process stays light; torch's view of the devices comes from
`torch_devices()`, which the Hardware tab asks for in the background once.
"""
from __future__ import annotations

import csv
import importlib.metadata
import io
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

__all__ = ["machine_reading", "gpu_readings", "ProcessWatch", "environment", "torch_devices", "disk_free_gib",
           "CpuLoad", "cpu_load", "busy_pct"]

_GPU_FIELDS = ("index", "name", "memory.used", "memory.total", "utilization.gpu", "temperature.gpu", "power.draw")


def gpu_readings(timeout: float = 3.0) -> list[dict[str, Any]] | None:
    """One dict per NVIDIA GPU, or None when nvidia-smi is not there or does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(_GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for row in csv.reader(io.StringIO(out)):
        if len(row) != len(_GPU_FIELDS):
            continue
        values = dict(zip(_GPU_FIELDS, (v.strip() for v in row)))
        gpus.append({"index": _num(values["index"]), "name": values["name"],
                     "vram_used_mib": _num(values["memory.used"]), "vram_total_mib": _num(values["memory.total"]),
                     "util_pct": _num(values["utilization.gpu"]), "temp_c": _num(values["temperature.gpu"]),
                     "power_w": _num(values["power.draw"])})
    return gpus


def _num(text: str) -> float | int | None:
    try:
        value = float(text)
    except ValueError:
        return None          # "[N/A]" on cards that do not report it
    return int(value) if value.is_integer() else value


def disk_free_gib(path: str | os.PathLike) -> float | None:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return round(shutil.disk_usage(p).free / 2 ** 30, 1)
    except OSError:
        return None


def busy_pct(before: Any, after: Any) -> float:
    """Machine-wide CPU % between two `psutil.cpu_times()` readings (psutil's own arithmetic: idle
    and iowait are not busy; guest time is already counted in user time on Linux)."""
    fields = [f for f in after._fields if f not in ("guest", "guest_nice")]
    delta = {f: max(0.0, getattr(after, f) - getattr(before, f)) for f in fields}
    total = sum(delta.values())
    if total <= 0:
        return 0.0
    idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
    return round(min(100.0, max(0.0, 100.0 * (total - idle) / total)), 1)


class CpuLoad:
    """The machine's CPU % between consecutive readings, thread-independent. The first reading
    (and one after more than `stale_s` without any) measures over `window` seconds instead of
    returning psutil's meaningless first 0.0; readings closer than `min_gap_s` return the last value."""

    def __init__(self, window: float = 0.3, stale_s: float = 30.0, min_gap_s: float = 0.1,
                 times: Any = psutil.cpu_times, clock: Any = time.monotonic, wait: Any = time.sleep) -> None:
        self.window, self.stale_s, self.min_gap_s = window, stale_s, min_gap_s
        self._times, self._clock, self._wait = times, clock, wait
        self._last: tuple[float, Any] | None = None
        self._value: float | None = None
        self._lock = threading.Lock()

    def read(self) -> float:
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._last[0] > self.stale_s:
                self._last = (now, self._times())
                self._wait(self.window)                 # a real interval, not psutil's first 0.0
                now = self._clock()
            elif self._value is not None and now - self._last[0] < self.min_gap_s:
                return self._value
            after = self._times()
            self._value = busy_pct(self._last[1], after)
            self._last = (now, after)
            return self._value


_CPU_LOAD = CpuLoad()


def cpu_load() -> float:
    """The machine's CPU % since the previous `cpu_load()` call from any thread (see CpuLoad); the
    Train tab's live line and the Hardware tab both read it through `machine_reading`."""
    return _CPU_LOAD.read()


def machine_reading(project_root: str | os.PathLike | None = None, with_gpus: bool = True) -> dict[str, Any]:
    """CPU load (`cpu_load()`: since the previous reading, whatever thread), RAM, GPUs, disk free."""
    mem = psutil.virtual_memory()
    return {"time": time.time(), "cpu_threads": psutil.cpu_count(logical=True),
            "cpu_pct": cpu_load(),
            "ram_used_gib": round((mem.total - mem.available) / 2 ** 30, 1),
            "ram_total_gib": round(mem.total / 2 ** 30, 1),
            "gpus": gpu_readings() if with_gpus else None,
            "disk_free_gib": disk_free_gib(project_root) if project_root else None}


class ProcessWatch:
    """CPU % of one process measured between consecutive readings of the *same* handle (a
    fresh handle's first reading is always 0), RSS and threads; None once it is gone."""

    def __init__(self) -> None:
        self._proc: psutil.Process | None = None

    def read(self, pid: int | None) -> dict[str, Any] | None:
        if pid is None:
            self._proc = None
            return None
        try:
            if self._proc is None or self._proc.pid != pid:
                self._proc = psutil.Process(pid)
                self._proc.cpu_percent(interval=None)        # prime: the next reading is real
                cpu = None
            else:
                cpu = round(self._proc.cpu_percent(interval=None), 1)
            with self._proc.oneshot():
                return {"pid": pid, "cpu_pct": cpu, "rss_gib": round(self._proc.memory_info().rss / 2 ** 30, 2),
                        "threads": self._proc.num_threads()}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._proc = None
            return None


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, Any]:
    """OS, host, Python and the versions of the libraries the trainer runs on (from package
    metadata: nothing is imported)."""
    return {"os": f"{platform.system()} {platform.release()}", "host": platform.node(),
            "python": f"{platform.python_version()} ({sys.executable})",
            **{name: _version(name) for name in ("torch", "transformers", "accelerate", "gguf", "gradio",
                                                 "huggingface_hub", "safetensors", "datasets")}}


def torch_devices(timeout: float = 60.0) -> dict[str, Any]:
    """torch's CUDA build and devices, asked in a child process so the GUI never imports torch."""
    code = ("import json, torch\n"
            "devs = [{'index': i, 'name': torch.cuda.get_device_name(i),\n"
            "         'gib': round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}\n"
            "        for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []\n"
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
            "                  'cuda_available': torch.cuda.is_available(), 'devices': devs}))\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=True)
        import json
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"error": f"torch could not be asked for its devices ({type(e).__name__})"}
