"""Detached jobs: the runtime shared by the download jobs (materials.py) and the snapshot job
(snapshot.py), which the GUI starts and forgets.

A job is a `python -m trainer_core.<module>` process launched in its own session by
`runner.launch_detached`, so it outlives the GUI and the terminal. Three files describe it
(`JobFiles`; each kind of job names its own):

    pid     {pid, create_time, argv} (base/procs): whether the process still runs
    status  JSON, rewritten atomically: {"status": running|done|failed, "pid", "started",
            "finished"?, "error"?, "progress"?, + what the job's status events carry}
    log     the process's stdout and stderr: a launch banner, then one event per line in the
            stages' schema (base/events), and a traceback if the job has a bug

Inside the job, `JobReport` is the `report(type, **payload)` the stages use: it prints the event
to the log and keeps the status file current (a status event merges its payload in, a progress
event is kept under "progress", an error event marks the job failed). `run_job` runs the job's
body and records its outcome. Outside, `read_status` reads the status file back; a job recorded
as running whose process is gone (kill -9, a reboot) reads as failed.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import Reporter
from trainer_core.base.procs import pid_alive, read_pid_file
from trainer_core.runner import child_env, launch_detached

__all__ = ["JobFiles", "launch", "read_status", "alive", "JobReport", "run_job"]

ENDED = ("done", "failed", "stopped")


@dataclass(frozen=True)
class JobFiles:
    """Where one job keeps its status, pid and log; `what` names it in messages ("the snapshot
    process")."""

    status: Path
    pid: Path
    log: Path
    what: str = "the job's process"


def launch(files: JobFiles, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> int:
    """Start `argv` detached with its output appended to the job's log; returns its pid (also in
    the pid file)."""
    return launch_detached(argv, cwd=cwd, log_path=files.log, pid_path=files.pid, env=child_env(env))


def alive(files: JobFiles) -> bool:
    """Whether the process in the job's pid file still runs (and is ours)."""
    return pid_alive(read_pid_file(files.pid))


def read_status(files: JobFiles, *, liveness: bool = True) -> dict[str, Any]:
    """The job's status file ({} when there is none). With `liveness`, a "running" status whose
    process died reads as failed, naming the log to look at."""
    status = read_json(files.status, {}) or {}
    if not isinstance(status, dict):
        return {}
    if liveness and status.get("status") == "running" and not alive(files):
        status = {**status, "status": "failed", "error": f"{files.what} died (see {files.log.name})"}
    return status


class JobReport:
    """The job's `report(type, **payload)`: each event goes to stdout (the job's log) as a JSON
    line and updates the status file, which is written at once as running."""

    def __init__(self, files: JobFiles, stream: IO[str] | None = None, **fields: Any):
        self.files = files
        self._print = Reporter(stream)
        self.status: dict[str, Any] = {"status": "running", "started": time.time(), "pid": os.getpid(), **fields}
        self._write()

    def __call__(self, type: str, **payload: Any) -> None:
        self._print(type, **payload)
        if type == "status":
            self.status.update(payload)
        elif type == "progress":
            self.status["progress"] = dict(payload)
        elif type == "error":
            self.status.update(status="failed", error=payload.get("message", ""))
        else:
            return      # logs, metrics and artifacts are the log's; the status file stays as it is
        if self.status.get("status") in ENDED:
            self.status.setdefault("finished", time.time())
        self._write()

    def _write(self) -> None:
        atomic_write_json(self.files.status, self.status)


def run_job(report: JobReport, body: Callable[[], dict[str, Any] | None],
            expected: tuple[type[BaseException], ...] = (TrainerError,)) -> int:
    """Run the job's body and record its outcome: done with the fields it returns (exit 0), or
    failed (exit 1). An `expected` failure's message is the user's; anything else is a bug,
    whose traceback goes to the log and whose type leads the message."""
    try:
        fields = body() or {}
    except expected as e:
        report("error", message=str(e) or type(e).__name__)
        return 1
    except Exception as e:          # noqa: BLE001 — a bug: recorded for the GUI, traceback in the log
        traceback.print_exc()
        sys.stderr.flush()
        report("error", message=f"{type(e).__name__}: {e}")
        return 1
    report("status", status="done", **fields)
    return 0
