"""The GUI's Supervisor: one background thread that keeps a live view of every opened project.

The pipeline and its jobs run detached (`runner.start_pipeline`, the snapshot job), so
closing the browser tab or the GUI never stops them; opening a project attaches to whatever
runs there. The thread tails `events.jsonl` (progress, status), `checkpoints/metrics.jsonl`
and `val.jsonl` (the chart), `pipeline.log` (the Logs tab) and reads the machine and the
pipeline process every few seconds. The GUI's timer ticks only copy the view
(`LiveView.snapshot`): a tick reads no file and starts no process.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from trainer_core.base.errors import TrainerError
from trainer_core.base.events import EventTailer, JsonLinesTailer
from trainer_core.base.hardware import ProcessWatch, disk_free_gib, machine_reading
from trainer_core.project import Project
from trainer_core.runner import kill_pipeline, request_stop, runtime_status, start_pipeline
from trainer_core.status import status_report

__all__ = ["Supervisor", "LiveView", "downsample", "merge_progress", "CHART_SERIES", "LOG_FIRST_READ", "LOG_KEEP"]

LOG_FIRST_READ = 256 << 10      # the first read of a log shows its last 256 KB
LOG_KEEP = 300_000              # characters of log kept for the Logs tab
CHART_POINTS = 400              # per series, plus the last point
TRAIN_SERIES, VAL_SERIES = ("loss", "cos"), "val_cos"     # the chart's series from metrics.jsonl and val.jsonl
CHART_SERIES = (*TRAIN_SERIES, VAL_SERIES)
RUNNING_PERIOD, IDLE_PERIOD, HARDWARE_PERIOD = 0.5, 3.0, 3.0


def downsample(points: list[dict[str, Any]], limit: int = CHART_POINTS) -> list[dict[str, Any]]:
    """At most `limit` evenly spaced points, always keeping the last."""
    if len(points) <= limit:
        return list(points)
    stride = len(points) / limit
    picked = [points[int(i * stride)] for i in range(limit)]
    if picked[-1] is not points[-1]:
        picked.append(points[-1])
    return picked


def merge_progress(progress: dict[str, dict[str, Any]], stage: str, payload: dict[str, Any], at: Any) -> None:
    """The stage's latest progress; a stage run over several ranks also keeps each rank's latest
    under "ranks" (rank → progress), so the strip can show them side by side."""
    entry = {**payload, "time": at}
    if "rank" in payload:
        ranks = dict(progress.get(stage, {}).get("ranks", {}))
        ranks[int(payload["rank"])] = entry
        entry["ranks"] = ranks
    progress[stage] = entry


class LiveView:
    """What the GUI shows of one project, kept current by the Supervisor thread."""

    def __init__(self, root: Path, machine: Callable[[], dict[str, Any]] | None = None):
        self.root = root
        # the machine-wide reading (CPU, RAM, nvidia-smi) is shared by the Supervisor's views
        self._machine = machine or (lambda: machine_reading(None))
        self.project = Project.open(root)
        self._lock = threading.Lock()
        # one reading at a time: the thread and the GUI's poke share the project object and the tailers' offsets
        self._reading = threading.Lock()
        self._events = EventTailer(self.project.events_jsonl)
        self._events.offset = self.project.events_jsonl.stat().st_size if self.project.events_jsonl.is_file() else 0
        # a resume rewrites these shorter (atomically): the tailer then restarts and so does the chart
        self._metrics = JsonLinesTailer(self.project.checkpoints_dir / "metrics.jsonl")
        self._val = JsonLinesTailer(self.project.checkpoints_dir / "val.jsonl")
        self._log_offset: int | None = None
        self._process = ProcessWatch()
        self.train_points: list[dict[str, Any]] = []
        self.val_points: list[dict[str, Any]] = []
        self.chart: list[dict[str, Any]] = []
        self.chart_version = 0
        self.log_text = ""
        self.log_total = 0           # characters read since the log was (re)opened
        self.log_version = 0
        self.progress: dict[str, dict[str, Any]] = {}
        self.report: dict[str, Any] = {}
        self.report_error: str | None = None
        self.machine: dict[str, Any] = {}
        self.process: dict[str, Any] | None = None
        self.updated = 0.0
        self._next_report = self._next_hardware = 0.0
        self.refresh(force=True)

    # ------------------------------------------------------------ reading (the thread)
    def refresh(self, force: bool = False) -> None:
        with self._reading:
            self._refresh(force)

    def _refresh(self, force: bool) -> None:
        now = time.monotonic()
        changed = self._read_events()
        self._read_metrics()
        self._read_log()
        running = self.report.get("status") == "running"
        if force or changed or now >= self._next_report:
            self._read_report()
            self._next_report = now + (RUNNING_PERIOD * 2 if running else IDLE_PERIOD)
        if force or now >= self._next_hardware:
            self._read_hardware()
            self._next_hardware = now + HARDWARE_PERIOD
        self.updated = time.time()

    def _read_events(self) -> bool:
        events = self._events.read()
        with self._lock:
            for e in events:
                stage, payload = e.get("stage"), e.get("payload", {})
                if e.get("type") == "progress" and stage:
                    merge_progress(self.progress, stage, payload, e.get("time"))
                elif e.get("type") == "status" and stage and payload.get("status") == "running":
                    self.progress.pop(stage, None)
        return bool(events)

    def _read_metrics(self) -> None:
        new_train, restart_train = self._metrics.poll(max_bytes=None)
        new_val, restart_val = self._val.poll(max_bytes=None)
        if not (new_train or new_val or restart_train or restart_val):
            return
        with self._lock:
            if restart_train:
                self.train_points = []
            if restart_val:
                self.val_points = []
            self.train_points.extend(p for p in new_train if isinstance(p.get("step"), int))
            self.val_points.extend(p for p in new_val if isinstance(p.get("step"), int))
            chart = [{"step": p["step"], "value": p[k], "series": k} for p in downsample(self.train_points)
                     for k in TRAIN_SERIES if isinstance(p.get(k), (int, float))]
            chart += [{"step": p["step"], "value": p[VAL_SERIES], "series": VAL_SERIES}
                      for p in downsample(self.val_points) if isinstance(p.get(VAL_SERIES), (int, float))]
            self.chart = chart
            self.chart_version += 1

    def _read_log(self) -> None:
        path = self.project.pipeline_log
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if self._log_offset is None or size < self._log_offset:      # first read, or the log was replaced
            start = max(0, size - LOG_FIRST_READ)
            self._log_offset, fresh = start, True
        else:
            fresh = False
        if size == self._log_offset and not fresh:
            return
        with open(path, "rb") as f:
            f.seek(self._log_offset)
            chunk = f.read(max(0, min(size - self._log_offset, 8 << 20)))
        if fresh and self._log_offset > 0:                            # start at a line boundary
            cut = chunk.find(b"\n")
            chunk, self._log_offset = chunk[cut + 1:], self._log_offset + cut + 1
        self._log_offset += len(chunk)
        text = chunk.decode("utf-8", errors="replace")
        with self._lock:
            self.log_text = (text if fresh else self.log_text + text)[-LOG_KEEP:]
            self.log_total = len(text) if fresh else self.log_total + len(text)
            self.log_version += 1

    def _read_report(self) -> None:
        # the report says when its reading began ("read_at"): a banner that waits for a run is judged only
        # by a report read after the banner (ui/action_banner.py); readings are serialised (refresh), and
        # one that began earlier never replaces a later one all the same
        started = time.time()
        try:
            self.project.reload()
            report = {**status_report(self.project), "read_at": started}
            error = None
        except (TrainerError, OSError, ValueError) as e:
            report, error = self.report, str(e)
        with self._lock:
            if started >= float(self.report.get("read_at", 0.0)):
                self.report, self.report_error = report, error

    def _read_hardware(self) -> None:
        machine = {**self._machine(), "disk_free_gib": disk_free_gib(self.root)}
        pid = self.report.get("stage_pid") or self.report.get("pid")
        process = self._process.read(pid) if self.report.get("status") == "running" else self._process.read(None)
        with self._lock:
            self.machine, self.process = machine, process

    # ------------------------------------------------------------ the GUI's side
    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of the view for one tick: no file is read here."""
        with self._lock:
            return {"root": str(self.root), "report": self.report, "report_error": self.report_error,
                    "progress": dict(self.progress), "chart": self.chart, "chart_version": self.chart_version,
                    "last_train": self.train_points[-1] if self.train_points else None,
                    "last_val": self.val_points[-1] if self.val_points else None,
                    "log_text": self.log_text, "log_total": self.log_total, "log_version": self.log_version,
                    "machine": self.machine, "process": self.process, "updated": self.updated}


class Supervisor:
    """The background thread and the views it keeps; the GUI's actions on runs go through it
    so that the view reacts at once."""

    def __init__(self, period: float = RUNNING_PERIOD):
        self.period = period
        self._views: dict[str, LiveView] = {}
        self._lock = threading.Lock()
        self._machine_reading: tuple[float, dict[str, Any]] | None = None
        self._machine_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gguf-trainer-supervisor", daemon=True)

    def start(self) -> "Supervisor":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                views = list(self._views.values())
            for view in views:
                try:
                    view.refresh()
                except Exception:   # noqa: BLE001 — one unreadable project never stops the others
                    pass
            self._wake.wait(self.period)
            self._wake.clear()

    def machine(self) -> dict[str, Any]:
        """One machine reading per HARDWARE_PERIOD, however many projects are watched."""
        with self._machine_lock:            # not self._lock: ticks look views up under that one
            if self._machine_reading is None or time.monotonic() - self._machine_reading[0] >= HARDWARE_PERIOD:
                self._machine_reading = (time.monotonic(), machine_reading(None))
            return self._machine_reading[1]

    def attach(self, root: str | os.PathLike) -> LiveView:
        """The live view of the project at `root` (opened and read at once the first time)."""
        key = str(Path(root).resolve())
        with self._lock:
            view = self._views.get(key)
        if view is None:
            view = LiveView(Path(key), self.machine)
            with self._lock:
                view = self._views.setdefault(key, view)
        return view

    def detach(self, root: str | os.PathLike) -> None:
        """Forget the view of `root` (its folder is about to be rebuilt: the next attach reads it afresh)."""
        with self._lock:
            self._views.pop(str(Path(root).resolve()), None)

    def view(self, root: str | os.PathLike | None) -> LiveView | None:
        if not root:
            return None
        with self._lock:
            return self._views.get(str(Path(root).resolve()))

    def poke(self, root: str | os.PathLike) -> None:
        """Re-read the project now (after an action), then wake the thread."""
        view = self.view(root)
        if view is not None:
            view.refresh(force=True)
        self._wake.set()

    # ------------------------------------------------------------ actions
    def start_run(self, root: str | os.PathLike, only: list[str] | None = None, force: bool = False,
                  mock_teacher: bool = False) -> int:
        project = Project.open(root)
        env = {"GGUF_TRAINER_MOCK_TEACHER": "1"} if mock_teacher else None
        pid = start_pipeline(project, only, force, env_extra=env)
        self.poke(root)
        return pid

    def stop_run(self, root: str | os.PathLike) -> bool:
        project = Project.open(root)
        done = request_stop(project, timeout=0)
        self.poke(root)
        return done

    def kill_run(self, root: str | os.PathLike) -> bool:
        done = kill_pipeline(Project.open(root))
        self.poke(root)
        return done

    def is_running(self, root: str | os.PathLike) -> bool:
        return runtime_status(Project.open(root))["status"] == "running"
