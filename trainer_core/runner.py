"""Detached processes: launch in a new session, pid files, liveness, the run lock, stop, kill.

The run lock (`<project>/.run.lock`, an OS file lock) is the only thing that decides
whether a pipeline may start: `start` takes it *before* spawning and hands the locked
descriptor to the driver, which hands it on to each stage process, so no second `start`,
foreground `run` or GUI can slip in between a check and a spawn, and a stage orphaned by
a crashed driver still holds the project until it has saved and exited.

Pid files are JSON ({pid, create_time, argv}); a pid counts as ours only while a process
with that pid, that start time and one of our command-line markers exists, so a pid that
the OS recycled after a reboot is not mistaken for a live run.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import psutil

from trainer_core.base.atomic import atomic_write_text
from trainer_core.base.errors import AlreadyRunningError
from trainer_core.base.locks import FileLock
from trainer_core.base.procs import LOCK_FD_ENV, pid_alive, read_pid_file, write_pid_file
from trainer_core.project import Project

__all__ = [
    "LOCK_FD_ENV", "write_pid_file", "read_pid_file", "pid_alive", "launch_detached",
    "acquire_run_lock", "start_pipeline", "pipeline_command", "runtime_status",
    "request_stop", "kill_pipeline", "child_env", "wait_gone",
]

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


# ------------------------------------------------------------------ launching

def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of our child processes: unbuffered, our package importable."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    parts = [PACKAGE_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env.update(extra or {})
    return env


def launch_detached(argv: list[str], *, cwd: Path, log_path: Path, pid_path: Path,
                    env: dict[str, str] | None = None, pass_fds: Iterable[int] = ()) -> int:
    """Start `argv` in a new session (it survives this process and the terminal); return its pid.

    stdin is closed; stdout and stderr are appended to `log_path` after a launch banner.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"===== launch {stamp}: {shlex.join(argv)}\n".encode())
        log.flush()
        kwargs: dict[str, Any] = {}
        if os.name == "posix":
            kwargs["start_new_session"] = True
        else:  # pragma: no cover - Windows: own hidden console and process group
            kwargs["creationflags"] = (subprocess.CREATE_NO_WINDOW | subprocess.CREATE_NEW_PROCESS_GROUP)
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, pass_fds=tuple(pass_fds), close_fds=True, **kwargs)
    write_pid_file(pid_path, proc.pid)
    return proc.pid


def pipeline_command(project: Project, only: list[str] | None = None, force: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "trainer_core.pipeline", "--project", str(project.root)]
    if only:
        argv += ["--only", *only]
    if force:
        argv.append("--force")
    return argv


def _holder(project: Project) -> tuple[int | None, str]:
    """Who holds the run lock: (pid, role) from the pid files, if either is alive."""
    for path, role in ((project.pipeline_pid, "pipeline"), (project.stage_pid, "stage")):
        record = read_pid_file(path)
        if pid_alive(record):
            return record["pid"], role
    return None, ""


def acquire_run_lock(project: Project, patience: float = 5.0) -> FileLock:
    """Take the project's run lock or raise AlreadyRunningError naming the holder's pid."""
    lock = FileLock(project.run_lock)
    if lock.acquire():
        return lock
    # The lock is held. Its holder may not have written its pid file yet (a launch in
    # flight), so look for a live holder for a moment before answering without a pid.
    deadline = time.monotonic() + patience
    while True:
        pid, role = _holder(project)
        if pid is not None or time.monotonic() > deadline:
            break
        if lock.acquire():  # the holder finished meanwhile
            return lock
        time.sleep(0.05)
    if role == "stage":
        raise AlreadyRunningError(
            f"A stage process of this project's interrupted run (pid {pid}) is still saving its "
            f"work; start again once it has exited.", pid)
    shown = f"pid {pid}" if pid is not None else "pid not known yet"
    raise AlreadyRunningError(
        f"The pipeline of {project.root} is already running ({shown}); follow it with "
        f"`gguf-trainer status --project {project.root}` or stop it with `gguf-trainer stop`.", pid)


def start_pipeline(project: Project, only: list[str] | None = None, force: bool = False,
                   env_extra: dict[str, str] | None = None) -> int:
    """Launch the pipeline driver detached; the run lock passes to it before we let go."""
    project.check_layout()
    lock = acquire_run_lock(project)
    try:
        project.stop_file.unlink(missing_ok=True)
        if os.name != "posix":  # pragma: no cover - no descriptor passing: the driver re-takes it
            lock.release()
            return launch_detached(pipeline_command(project, only, force), cwd=project.root,
                                   log_path=project.pipeline_log, pid_path=project.pipeline_pid,
                                   env=child_env(env_extra))
        env = child_env({LOCK_FD_ENV: str(lock.fd), **(env_extra or {})})
        return launch_detached(pipeline_command(project, only, force), cwd=project.root,
                               log_path=project.pipeline_log, pid_path=project.pipeline_pid,
                               env=env, pass_fds=[lock.fd])
    finally:
        lock.release()


# ------------------------------------------------------------------ status, stop, kill

def runtime_status(project: Project) -> dict[str, Any]:
    """{status, pid, stage_pid}: running (a live driver), interrupted (state says running but
    no driver lives: a crash or a reboot), else what state.json says. The driver is looked for first and
    state.json read after: read before, a driver that wrote "done" and exited in between read as interrupted."""
    record = read_pid_file(project.pipeline_pid)
    stage_record = read_pid_file(project.stage_pid)
    stage_pid = stage_record["pid"] if pid_alive(stage_record) else None
    if pid_alive(record):
        return {"status": "running", "pid": record["pid"], "stage_pid": stage_pid}
    state = project.read_state()
    status = state.get("status") or "idle"
    if status == "running":
        status = "interrupted"
    return {"status": status, "pid": None, "stage_pid": stage_pid}


def request_stop(project: Project, timeout: float | None = None) -> bool:
    """Ask the run to finish its current unit of work, save and exit (STOP file + SIGTERM).

    Returns True when no process of the run is left (after waiting up to `timeout` s).
    """
    pids = [r["pid"] for r in (read_pid_file(project.pipeline_pid), read_pid_file(project.stage_pid))
            if pid_alive(r)]
    if not pids:
        _mark_not_running(project, "stopped")
        return True
    atomic_write_text(project.stop_file, "stop requested\n")
    if os.name == "posix":
        try:
            os.kill(pids[0], signal.SIGTERM)  # the driver forwards it to its stage
        except ProcessLookupError:
            pass
    if not timeout:
        return False
    return wait_gone(_processes(pids), timeout)


def kill_pipeline(project: Project, timeout: float = 10.0) -> bool:
    """Kill the driver and its stage at once (no save); the state becomes stopped."""
    procs = _processes(r["pid"] for r in (read_pid_file(project.pipeline_pid),
                                          read_pid_file(project.stage_pid)) if pid_alive(r))
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    gone = wait_gone(procs, timeout)
    if gone:
        _mark_not_running(project, "stopped", error="killed", wait=5.0)
    return gone


def wait_gone(procs: list[psutil.Process], timeout: float) -> bool:
    """Wait until every process has exited; True if they all did within `timeout` s.

    A zombie counts as gone: our detached processes are not our children, and not every
    init (containers, some sandboxes) reaps the orphans it adopts.
    """
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= deadline:
            return not alive
        psutil.wait_procs(alive, timeout=min(0.1, max(0.0, deadline - time.monotonic())))


def _processes(pids: Iterable[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return out


def _mark_not_running(project: Project, status: str, error: str | None = None, wait: float = 0.0) -> None:
    """Record that an interrupted run was stopped, unless a run holds the lock meanwhile (for up to
    `wait` seconds: a killed process may still be closing its files when its kill is reported)."""
    lock = FileLock(project.run_lock)
    deadline = time.monotonic() + wait
    while not lock.acquire():
        if time.monotonic() >= deadline:
            return
        time.sleep(0.02)           # a lock has no event to wait on
    try:
        _mark_state(project, status, error)
    finally:
        lock.release()


def _mark_state(project: Project, status: str, error: str | None) -> None:
    state = project.read_state()
    if state.get("status") != "running":
        return
    state.update(status=status, pid=None, finished=time.time())
    if error:
        state["error"] = error
    stage = state.get("stage")
    if stage and state["stages"].get(stage, {}).get("status") == "running":
        state["stages"][stage]["status"] = status
    project.write_state(state)
