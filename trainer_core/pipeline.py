"""The pipeline driver: runs each unfinished stage as its own child process, in order.

    python -m trainer_core.pipeline --project DIR [--only STAGE ...] [--force]

It holds the project's run lock for its whole life (inherited from `start`, or taken
itself), stamps every JSON line a stage prints and appends it to `events.jsonl`, keeps
`state.json` current, writes human-readable lines to `pipeline.log`, forwards stop
requests to the running stage, and exits 0 (done or stopped), 1 (failed), 2 (no project, bad
arguments, or a stage refused what the user must fix: a setting, a file) or 3 (already running).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

from trainer_core.base.atomic import remove_stale_temps
from trainer_core.base.errors import AlreadyRunningError, TrainerError, UsageError
from trainer_core.base.events import EventWriter, make_event, parse_event
from trainer_core.base.locks import FileLock
from trainer_core.project import Project, remember_last_project
from trainer_core.runner import LOCK_FD_ENV, acquire_run_lock, child_env, read_pid_file, write_pid_file
from trainer_core.stages import STAGE_NAMES, STAGES, StageSpec, stage_done, stage_wanted
from trainer_core.contract.dist import launcher_argv
from trainer_core.stages.base import (EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED, EXIT_STOPPED, HANDOFF, PARENT_PID_ENV,
                                      RUN_ID_ENV, WORK_DONE)
from trainer_core.term_progress import TerminalBars

__all__ = ["Driver", "run_pipeline", "main", "check_only"]

STATE_WRITE_INTERVAL = 1.0  # seconds between state.json writes for progress alone


def check_only(only: list[str] | None) -> list[str] | None:
    if not only:
        return None
    unknown = [s for s in only if s not in STAGE_NAMES]
    if unknown:
        raise UsageError(f'--only got unknown stage "{unknown[0]}"; the stages are '
                         + ", ".join(STAGE_NAMES) + ".")
    return list(only)


class Driver:
    def __init__(self, project: Project, lock: FileLock, only: list[str] | None = None,
                 force: bool = False, echo: bool = False):
        self.project, self.lock, self.only, self.force, self.echo = project, lock, only, force, echo
        self.run_id = datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        self.stop_reason: str | None = None
        self.child: subprocess.Popen | None = None
        self.events = EventWriter(project.events_jsonl)
        self.log_fd = os.open(project.pipeline_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.state: dict[str, Any] = {}
        self.handled: set[str] = set()      # stages that ran in an earlier stage's process (a chain)
        self._state_written = 0.0
        self.bad_input = False              # a stage refused a setting or a file (UsageError): exit 2
        self.bars = TerminalBars(sys.stdout) if echo else None     # `gguf-trainer run`: bars on a terminal

    # ------------------------------------------------------------ output
    def log(self, message: str, stage: str | None = None) -> None:
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        prefix = f"[{stage}] " if stage else ""
        line = f"[{stamp}] {prefix}{message}\n"
        try:
            os.write(self.log_fd, line.encode("utf-8"))
        except OSError:               # a full disk: the line still reaches stderr (and the GUI, through state)
            self._to_stderr(line)
        if self.bars is not None:
            self.bars.write(line)

    def emit(self, type: str, stage: str | None = None, at: float | None = None, **payload: Any) -> None:
        event = make_event(type, payload, stage=stage, run=self.run_id, at=at)
        try:
            self.events.write(event)
        except OSError as e:          # a full or read-only disk must not end the driver: state.json says it
            self._to_stderr(f"events.jsonl not written ({e.strerror})\n")
        self._apply(event)

    def save_state(self, force: bool = True) -> None:
        """Write state.json (atomically; on a full disk, over the old file's own blocks: the final
        state of a run is always recorded if the file can be written at all)."""
        now = time.monotonic()
        if force or now - self._state_written >= STATE_WRITE_INTERVAL:
            try:
                self.project.write_state(self.state)
            except (TrainerError, OSError) as e:
                try:
                    write_in_place(self.project.state_json, self.state)
                except OSError:
                    self._to_stderr(f"state.json not written: {e}\n")
                    return
            self._state_written = now

    @staticmethod
    def _to_stderr(text: str) -> None:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _apply(self, event: dict[str, Any]) -> None:
        """Fold an event into state.json and pipeline.log."""
        stage, kind, p = event["stage"], event["type"], event["payload"]
        entry = self.state["stages"].setdefault(stage, {}) if stage else None
        important = False
        if kind == "status" and entry is not None:
            if self.bars is not None and p.get("status") != "running":
                self.bars.close(stage)
            entry.update({k: v for k, v in p.items() if k != "pid"})
            entry["updated"] = event["time"]
            important = True
        elif kind in ("progress", "metric") and entry is not None:
            entry.update(p)
            entry["updated"] = event["time"]
            if kind == "progress" and self.bars is not None and p.get("total"):
                self.bars.update(stage, p.get("count") or 0, p["total"], p.get("unit", ""), desc=stage)
        elif kind == "error":
            if entry is not None:
                entry["error"] = p.get("message")
            self.log("!!! " + str(p.get("message")), stage)
            important = True
        elif kind == "log":
            level = p.get("level", "info")
            self.log(("WARNING: " if level == "warning" else "ERROR: " if level == "error" else "")
                     + str(p.get("message")), stage)
        elif kind == "artifact":
            details = ", ".join(f"{k} {v}" for k, v in p.items() if k not in ("path", "kind"))
            self.log(f"wrote {p.get('path')}" + (f" ({details})" if details else ""), stage)
        if kind == "progress" and p.get("detail"):
            total = f" ({p.get('count')}/{p.get('total')} {p.get('unit', '')})".rstrip() if p.get("total") else ""
            self.log(f"{p['detail']}{total}", stage)
        if entry is not None or important:
            self.save_state(force=important)

    # ------------------------------------------------------------ stop handling
    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.child is not None and self.child.poll() is None:
            try:
                self.child.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop_requested(self) -> bool:
        if self.stop_reason is None and self.project.stop_file.exists():
            self.stop_reason = "STOP file"
        return self.stop_reason is not None

    def _install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _f: self.request_stop(f"signal {signum}"))

    # ------------------------------------------------------------ the run
    def run(self) -> int:
        self._install_signals()
        # what a killed run's driver left half-written (every writer of these holds the run lock, as we do)
        from trainer_core.plan import PLAN_FILE
        remove_stale_temps(self.project.state_json, self.project.pipeline_pid, self.project.stage_pid,
                           self.project.root / PLAN_FILE)
        write_pid_file(self.project.pipeline_pid, os.getpid())
        self.project.stop_file.unlink(missing_ok=True)
        self.state = self.project.read_state()
        self.state.update(status="running", pid=os.getpid(), started=time.time(), finished=None,
                          error=None, stage=None, run=self.run_id)
        what = f" (only {' '.join(self.only)})" if self.only else ""
        self.log(f"pipeline {self.run_id} started{what}{' --force' if self.force else ''}, pid {os.getpid()}")
        self.emit("status", status="running", pid=os.getpid(), only=self.only, force=self.force)
        self.save_state()
        self._keep_plan()
        outcome, error = "done", None
        try:
            for spec in STAGES:
                if (self.only and spec.name not in self.only) or spec.name in self.handled:
                    continue
                forced = self.force and spec.forceable
                if not forced and self._skip_if_done(spec):
                    continue
                if self.stop_requested():
                    outcome = "stopped"
                    break
                outcome, error = self._run_stage(spec, forced)
                if outcome != "done":
                    break
            if outcome == "done" and self.stop_requested():      # a stop that came while the last stage ran
                outcome = "stopped"
        except Exception as e:  # a bug in the driver itself
            self.log("!!! " + traceback.format_exc().rstrip().replace("\n", "\n!!! "))
            outcome, error = "failed", f"{type(e).__name__}: {e}"
            entry = self.state["stages"].get(self.state.get("stage") or "")
            if entry is not None and entry.get("status") in (None, "running"):
                entry.update(status="failed", error=error, finished=time.time())
        return self._finish(outcome, error)

    def _keep_plan(self) -> None:
        """The calibrated plan this run starts under, for planned vs actual (trainer_core/plan/); none when the
        settings changed since the calibration (its figures would not be this run's)."""
        try:
            from trainer_core.plan import CALIBRATION_FILE, make_plan, save_planned, settings_key
            from trainer_core.base.atomic import read_json
            cal = read_json(self.project.root / CALIBRATION_FILE, None)
            if isinstance(cal, dict) and cal.get("key") == settings_key(self.project):
                save_planned(self.project, make_plan(self.project))
        except (TrainerError, OSError, ValueError, KeyError) as e:
            self.log(f"the plan was not kept ({e})")

    def _skip_if_done(self, spec: StageSpec) -> bool:
        if stage_wanted(self.project, spec.name):
            return False
        if spec.name == "eval" and not self.project.settings.export.run_eval:
            if not stage_done(self.project, "eval"):
                self.log("evaluation is off (export.run_eval); skipping", spec.name)
                self.emit("status", stage=spec.name, status="skipped", skipped=True, detail="export.run_eval is off")
            return True
        self.log("already done, skipping", spec.name)
        self.emit("status", stage=spec.name, status="done", skipped=True)
        return True

    def _processes(self, stage: str) -> int:
        """Processes for a stage: precompute.gpus for the precompute splits, train.gpus for training."""
        s = Project.open(self.project.root).settings      # as saved now, not when the run started
        return s.precompute.gpus if stage.startswith("precompute") else s.train.gpus if stage == "train" else 1

    def _chain(self, spec: StageSpec) -> list[StageSpec]:
        """The stages the process of `spec` may go on to (StageSpec.chains): the ones after it that
        this run includes, as long as each runs in one process. The child checks at each handoff
        that the stage is still to do (stages.stage_wanted) and ends the chain where it is not."""
        chain: list[StageSpec] = []
        current = spec
        while current.chains and self._processes(current.name) == 1:
            nxt = STAGES[STAGE_NAMES.index(current.name) + 1]
            if (self.only and nxt.name not in self.only) or self._processes(nxt.name) > 1:
                break
            chain.append(nxt)
            current = nxt
        return chain

    def _handoff(self, spec: StageSpec, nxt: StageSpec, at: float) -> None:
        """The child finished `spec` and went on to `nxt` (its status event said so)."""
        self.log("done", spec.name)
        self.emit("status", stage=spec.name, status="done", finished=at)
        self.handled.add(nxt.name)
        self.state["stage"] = nxt.name
        self.state["stages"][nxt.name] = {"started": time.time()}
        kept = "the student and the teacher stay loaded" if nxt.split == "train" else "no new interpreter"
        self.log(f"starting (in the same process: {kept})", nxt.name)
        self.emit("status", stage=nxt.name, status="running", pid=self.child.pid if self.child else None,
                  forced=self.force and nxt.forceable)

    def _run_stage(self, spec: StageSpec, forced: bool) -> tuple[str, str | None]:
        self.state["stage"] = spec.name
        self.state["stages"][spec.name] = {"started": time.time()}
        if spec.module is None:
            message = (f"The {spec.title} stage is not available in this version of gguf-trainer yet; "
                       f"run the stages it has with --only (e.g. --only corpus).")
            self.emit("error", stage=spec.name, message=message)
            self.emit("status", stage=spec.name, status="failed", finished=time.time())
            return "failed", message
        argv = [sys.executable, "-m", spec.module, "--project", str(self.project.root), *spec.args]
        chain = self._chain(spec)
        if chain:
            argv += ["--then", *(c.name for c in chain), *(["--force"] if self.force else [])]
        processes = self._processes(spec.name)
        if processes > 1:             # torchrun starts the ranks (see trainer_core.contract.dist)
            argv = launcher_argv(spec.module, processes, argv[3:])
        env = child_env({RUN_ID_ENV: self.run_id, PARENT_PID_ENV: str(os.getpid()),
                         LOCK_FD_ENV: str(self.lock.fd)})
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        self.log(f"starting{' (forced re-run)' if forced else ''}", spec.name)
        self.child = subprocess.Popen(argv, cwd=self.project.root, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=self.log_fd, env=env,
                                      pass_fds=[self.lock.fd] if os.name == "posix" else [])
        self.emit("status", stage=spec.name, status="running", pid=self.child.pid, forced=forced)
        if self.stop_reason:  # a signal that arrived while we were spawning
            self.request_stop(self.stop_reason)
        last_error, work_done_at = None, None
        assert self.child.stdout is not None
        for raw in self.child.stdout:
            event = parse_event(raw)
            if event is None:
                text = raw.decode("utf-8", "replace").rstrip()
                if text:
                    self.emit("log", stage=spec.name, level="info", message=text)
                continue
            if event["type"] == "error":
                last_error = event["payload"].get("message")
            if event["type"] == "status" and event["payload"].get(WORK_DONE):
                work_done_at = event["time"]      # the stage's end; the exit code still decides its outcome
                continue
            if chain and event["type"] == "status" and event["payload"].get(HANDOFF) == chain[0].name:
                self._handoff(spec, chain[0], event["time"])
                spec = chain.pop(0)
                continue
            self.emit(event["type"], stage=spec.name, at=event["time"], **event["payload"])
        code = self.child.wait()
        self.child = None
        if code == EXIT_DONE:
            outcome, error = "done", None
        elif code == EXIT_STOPPED or (self.stop_reason and last_error is None
                                      and (processes > 1 or code in (-signal.SIGTERM, -signal.SIGINT))):
            # torchrun turns its ranks' "stopped" into a failure code; a stage that took our SIGTERM
            # before it could install its handler (while importing torch) dies of it: both are a stop
            outcome, error = "stopped", None
        else:
            outcome = "failed"
            self.bad_input = code == EXIT_BAD_INPUT
            error = last_error or (f"the {spec.name} stage process was killed by signal {-code}"
                                   if code < 0 else f"the {spec.name} stage process exited with code {code}")
            if last_error is None:
                self.emit("error", stage=spec.name, message=error + " (see pipeline.log)")
        self.log(f"{outcome}", spec.name)
        finished = work_done_at if outcome == "done" and work_done_at is not None else time.time()
        self.emit("status", stage=spec.name, status=outcome, finished=finished,
                  **({"error": error} if error else {}))
        return outcome, error

    def _finish(self, outcome: str, error: str | None) -> int:
        self.state.update(status=outcome, finished=time.time(), pid=None, error=error)
        self.log(f"pipeline {self.run_id} {outcome}" + (f": {error}" if error else ""))
        self.emit("status", status=outcome, **({"error": error} if error else {}))
        self.save_state()
        self.project.stop_file.unlink(missing_ok=True)
        record = read_pid_file(self.project.pipeline_pid)
        if record and record.get("pid") == os.getpid():
            self.project.pipeline_pid.unlink(missing_ok=True)
        self.events.close()
        os.close(self.log_fd)
        if self.bars is not None:
            self.bars.close_all()
        return (EXIT_BAD_INPUT if self.bad_input else EXIT_FAILED) if outcome == "failed" else 0


def write_in_place(path: Path, state: dict[str, Any]) -> None:
    """Overwrite an existing file's bytes without a temp file (the fallback when the disk is full:
    the blocks the old file holds are reused). Not atomic, so only for the driver's last word."""
    data = (json.dumps(state, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())


def run_pipeline(project: Project, only: list[str] | None = None, force: bool = False,
                 echo: bool = False, lock: FileLock | None = None) -> int:
    """Run the pipeline in this process (the foreground `gguf-trainer run`, and the driver)."""
    only = check_only(only)
    project.check_layout()
    lock = lock or acquire_run_lock(project)
    try:
        remember_last_project(project.root)
        return Driver(project, lock, only, force, echo).run()
    finally:
        lock.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_core.pipeline")
    parser.add_argument("--project", required=True)
    parser.add_argument("--only", nargs="+", metavar="STAGE")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        project = Project.open(args.project)
        lock = None
        fd = os.environ.pop(LOCK_FD_ENV, "")
        if fd.isdigit():
            inherited = FileLock(project.run_lock)
            if inherited.adopt(int(fd)):
                lock = inherited
        return run_pipeline(project, args.only, args.force, echo=False, lock=lock)
    except AlreadyRunningError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    except TrainerError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
