"""What every stage process shares: its entry point, stop handling and exit codes.

A stage module defines `run(project, report, should_stop) -> "done" | "stopped"` (pure of
process concerns, so tests call it with a ListReport) and ends with

    if __name__ == "__main__":
        exit_process(stage_main("corpus", run))

`stage_main` opens the project, records the stage's pid, turns SIGTERM / SIGINT, the STOP
file and the death of the pipeline driver into one stop request the stage polls at its
safe points, and converts the outcome into an exit code the driver understands.

`--then STAGE ...` (the driver passes it, see StageSpec.chains) makes the process go on to the
next stages after a "done": before each it checks from disk that the stage is still to do (export
is not when training did not improve best.pt), then reports a status event with `handoff` naming
it, which the driver takes as "the previous stage is done, this one has begun in the same pid".
The chain ends at the first stage that is not to do, at a stop request, or at anything but
"done"; the driver then carries on as usual. The last stage's "done" is reported as a status event with
`work_done` before the process exits: the driver records the stage as finished at that moment, so
the kernel's teardown of the process (~0.1 s a GB of memory) falls between stages, as it does
between the stages of a chain, and the driver still takes the outcome from the exit code. A run()
that takes a `shared` dict gets one for the whole chain (precompute keeps its loaded models there
for the second split).
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import inspect
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable

from trainer_core.contract.dist import current as current_rank
from trainer_core.base import collector
from trainer_core.base.allocator import keep_heap_pad
from trainer_core.base.diskspace import disk_error
from trainer_core.base.errors import TrainerError, UsageError
from trainer_core.base.events import Report, Reporter
from trainer_core.base.locks import FileLock
from trainer_core.project import Project
from trainer_core.base.procs import LOCK_FD_ENV, write_pid_file

__all__ = ["EXIT_DONE", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_STOPPED", "HANDOFF", "WORK_DONE", "StopRequest",
           "stage_main", "exit_process", "never", "RUN_ID_ENV", "PARENT_PID_ENV"]

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_STOPPED = 0, 1, 2, 4     # bad input: a UsageError
# a status payload key: "this stage is done, the same process now runs the stage named here"
HANDOFF = "handoff"
# a status payload key: "the last stage's work is done, the process is exiting" (its exit code decides)
WORK_DONE = "work_done"
RUN_ID_ENV = "GGUF_TRAINER_RUN_ID"
PARENT_PID_ENV = "GGUF_TRAINER_PARENT_PID"

StageRun = Callable[..., str]  # run(project, report, should_stop[, split=..., shared=...]) -> "done" | "stopped"


def never() -> bool:
    return False


class StopRequest:
    """True once a signal arrived, the STOP file exists, or the driver that started us died."""

    def __init__(self, project: Project, report: Report):
        self.project, self.report = project, report
        self.reason: str | None = None

    def __call__(self) -> bool:
        if self.reason is None and self.project.stop_file.exists():
            self.reason = "STOP file"
        return self.reason is not None

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.report("log", level="warning",
                        message=f"{reason}: finishing the current unit of work and saving")

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.set(f"signal {signum}"))
        parent = os.environ.get(PARENT_PID_ENV)
        if parent and parent.isdigit():
            self._watch_parent(int(parent))

    def _watch_parent(self, parent: int) -> None:
        if sys.platform.startswith("linux"):
            try:  # the kernel sends SIGTERM when the driver dies, however it dies
                ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
            except (OSError, AttributeError):
                pass
        if not _has_ancestor(parent):  # died before the line above took effect
            self.set("the pipeline driver is gone")
            return
        event = threading.Event()

        def watch() -> None:
            while not event.wait(1.0):
                if not _has_ancestor(parent):
                    self.set("the pipeline driver is gone")
                    return
        threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _has_ancestor(pid: int) -> bool:
    """Whether `pid` is our parent, or — for the ranks of a launcher the driver started (torchrun's
    agent is their parent) — our grandparent."""
    parent = os.getppid()
    if parent == pid:
        return True
    if "LOCAL_RANK" not in os.environ:
        return False
    try:
        import psutil
        return psutil.Process(parent).ppid() == pid
    except Exception:  # noqa: BLE001 — psutil.NoSuchProcess etc.: the launcher is gone
        return False


def _report_vram(report: Report) -> None:
    """The stage's peak GPU memory per device (reserved by torch's allocator), for the plan's calibration;
    the peaks start again for the next stage of a chain."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    peaks = {str(i): int(torch.cuda.max_memory_reserved(i)) for i in range(torch.cuda.device_count())}
    if any(peaks.values()):
        report("metric", peak_vram_bytes=max(peaks.values()), peak_vram_by_device=peaks)
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)


def _call(run: StageRun, project: Project, report: Report, stop: Callable[[], bool], kwargs: dict[str, Any],
          shared: dict[str, Any]) -> str:
    if "shared" in inspect.signature(run).parameters:
        kwargs = {**kwargs, "shared": shared}
    return run(project, report, stop, **kwargs)


def run_chain(module: str, run: StageRun, project: Project, report: Report, stop: Callable[[], bool],
              kwargs: dict[str, Any], then: list[str], force: bool = False,
              shared: dict[str, Any] | None = None) -> str:
    """Run this process's stage, then each stage of `then` that is still to do, handing over
    between them (see the module docstring). Returns the last stage's outcome. `shared` (a new
    dict by default) is the chain's dict; a caller that passes its own keeps what the stages left
    there (loaded models) alive after the return."""
    from trainer_core.stages import spec_of, stage_wanted
    shared = {} if shared is None else shared
    outcome = _call(run, project, report, stop, kwargs, shared)
    for name in then:
        if outcome != "done" or stop() or not stage_wanted(project, name, force):
            break
        spec = spec_of(name)
        _report_vram(report)                    # the finished stage's own peak
        report("status", status="done", **{HANDOFF: name})
        if hasattr(report, "stage"):            # what the events say after a driver crash
            report.stage = name
        nxt = run if spec.module == module else importlib.import_module(spec.module).run
        outcome = _call(nxt, project, report, stop, spec.kwargs, shared)
    return outcome


def exit_process(code: int) -> None:
    """End a stage process without the interpreter's teardown (0.5–2 s of freeing models and
    modules on two cores, paid before the driver sees the exit). Everything a stage writes is
    fsynced and closed when its run() returns; only stdout and stderr still need a flush."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):     # a closed pipe: the driver is gone, nothing to tell it
            pass
    os._exit(code)


def _module_of(run: StageRun) -> str:
    """The importable name of run()'s module (`python -m` runs it as __main__)."""
    module = run.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else module
    return module


def stage_main(name: str, run: StageRun, argv: list[str] | None = None) -> int:
    from trainer_core.stages import STAGE_NAMES
    parser = argparse.ArgumentParser(prog=f"python -m trainer_core.stages.{name}")
    parser.add_argument("--project", required=True)
    parser.add_argument("--split", choices=("val", "train"))
    parser.add_argument("--then", nargs="+", choices=STAGE_NAMES, default=[],
                        help="the stages to run next in this process, each when it is still to do")
    parser.add_argument("--force", action="store_true", help="with --then: re-run export / eval even when done")
    args = parser.parse_args(argv)
    collector.settle()       # the imports are done: frozen, and collected as usual again (base/collector.py)
    keep_heap_pad()          # a step's freed temporaries stay mapped for the next (base/allocator.py)
    report: Report = Reporter()
    try:
        project = Project.open(args.project)
    except TrainerError as e:
        report("error", message=str(e))
        return e.exit_code
    report = Reporter(fallback=project.events_jsonl, run=os.environ.get(RUN_ID_ENV), stage=name)
    lock = FileLock(project.run_lock)
    fd = os.environ.get(LOCK_FD_ENV)
    if fd and fd.isdigit():
        lock.adopt(int(fd))  # held by us too until we exit: a crashed driver's orphan keeps the project
    stop = StopRequest(project, report)
    stop.install()
    try:
        main = current_rank().main    # under a launcher, rank 0 stands for the stage
    except TrainerError as e:
        report("error", message=str(e))
        return e.exit_code
    if main:
        try:
            write_pid_file(project.stage_pid, os.getpid())
        except OSError as e:          # a full or read-only disk at the stage's first write: its sentence
            sentence = disk_error(e, project.stage_pid)
            report("error", message=str(sentence or f"{project.stage_pid} cannot be written ({e.strerror})"))
            return EXIT_FAILED
    try:
        # the chain's models stay referenced until the process exits: freeing a loaded student and
        # teacher (1.2 GB at the peer geometry) took 0.07-0.09 s before the work_done stamp
        shared: dict[str, Any] = {}
        outcome = run_chain(_module_of(run), run, project, report, stop,
                            {"split": args.split} if args.split else {}, args.then, args.force, shared)
        _report_vram(report)
        if main and outcome == "done":
            report("status", status="done", **{WORK_DONE: True})
        return EXIT_STOPPED if outcome == "stopped" else EXIT_DONE
    except TrainerError as e:
        report("error", message=str(e))
        return EXIT_BAD_INPUT if isinstance(e, UsageError) else EXIT_FAILED
    except Exception as e:  # a bug: the traceback goes to pipeline.log through stderr
        sentence = disk_error(e) if isinstance(e, OSError) else None     # a full or read-only disk is no bug
        if sentence is not None:
            report("error", message=str(sentence))
            return EXIT_FAILED
        # the event first (it goes through the driver's pipe): stderr is pipeline.log, on a disk that
        # may be full, and the message must reach the driver however that write ends
        report("error", message=f"{type(e).__name__}: {e} (the traceback is in pipeline.log)",
               traceback=traceback.format_exc())
        try:
            traceback.print_exc()
        except OSError:
            pass
        return EXIT_FAILED
    finally:
        if main:
            project.stage_pid.unlink(missing_ok=True)
