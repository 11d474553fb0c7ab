"""Snapshots: a usable, step-tagged GGUF at any step, recorded in <project>/snapshots.json.

    python -m trainer_core.snapshot --project DIR [--checkpoint last|best|step<N>] [--eval]
                                    [--no-fresh] [--device D] [--timeout S]

While the train stage runs, a fresh snapshot drops a SNAPSHOT file and waits (bounded) for
the trainer to validate and save last.pt at its current step — training is not interrupted.
Otherwise the checkpoint on disk is exported as it is. The file is
<output_dir>/<name>-step<N>-f16.gguf beside the final export, never copied to export.copy_to.
As a detached job (GUI, `gguf-trainer snapshot --detach`; the runtime is jobs.py) it keeps
.snapshot.status, .snapshot.pid and snapshot.log in the project; its status events carry the
phase ("phase") and, when done, the snapshot's step, path and val_cos.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.base.errors import AlreadyRunningError, TrainerError
from trainer_core.base.events import Reporter
from trainer_core.contract import checkpoints
from trainer_core.contract.adapter_export import export_checkpoint
from trainer_core.base.locks import FileLock
from trainer_core.project import Project
from trainer_core.jobs import JobFiles, JobReport, launch, read_status, run_job
from trainer_core.runner import runtime_status
from trainer_core.stages.model_card import write_card

__all__ = ["take_snapshot", "read_manifest", "job_files", "job_status", "start_job", "main", "STATUS_FILE", "PID_FILE",
           "LOG_FILE"]

STATUS_FILE, PID_FILE, LOG_FILE = ".snapshot.status", ".snapshot.pid", "snapshot.log"


def read_manifest(project: Project) -> list[dict[str, Any]]:
    data = read_json(project.snapshots_json, {})
    return list(data.get("snapshots", [])) if isinstance(data, dict) else []


def _record(project: Project, entry: dict[str, Any]) -> None:
    with FileLock(project.root / ".snapshots.lock"):
        entries = [e for e in read_manifest(project) if e.get("path") != entry["path"]] + [entry]
        entries.sort(key=lambda e: (e.get("step", 0), e.get("time", 0)))
        atomic_write_json(project.snapshots_json, {"snapshots": entries})


def _training_now(project: Project) -> bool:
    return runtime_status(project)["status"] == "running" and project.read_state().get("stage") == "train"


def _wait_for_trainer(project: Project, timeout: float, say: Callable[[str], None]) -> None:
    project.snapshot_file.write_text("snapshot\n")
    say("waiting for the trainer to validate and save the current step")
    deadline = time.monotonic() + timeout
    while project.snapshot_file.exists():
        if runtime_status(project)["status"] != "running":
            project.snapshot_file.unlink(missing_ok=True)
            say("the pipeline stopped meanwhile; exporting the checkpoint on disk")
            return
        if time.monotonic() > deadline:
            project.snapshot_file.unlink(missing_ok=True)
            raise TrainerError(f"The trainer did not save within {timeout:.0f} s; try again, or take the "
                               f"checkpoint on disk with --no-fresh.")
        time.sleep(0.5)


def take_snapshot(project: Project, checkpoint: str = "last", fresh: bool = True, evaluate: bool = False,
                  device: str | None = None, timeout: float = 1800.0,
                  say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Export the checkpoint as a step-tagged GGUF, record it, optionally evaluate it."""
    project.check_layout()           # a file where the checkpoints or the export go: that sentence, not "none yet"
    while_training = _training_now(project)
    if fresh and while_training and checkpoint in ("last", "best"):
        _wait_for_trainer(project, timeout, say)
    path = checkpoints.weights_path(project, checkpoint)
    if not path.is_file():
        kept = sorted(row["id"] for row in checkpoints.kept_steps(project))
        if checkpoint.startswith("step"):
            raise checkpoints.NoCheckpointError(f"There is no kept step {checkpoint}; kept steps: "
                                                f"{', '.join(kept) or 'none'}.")
        if checkpoint == checkpoints.LAST and checkpoints.exists(project, checkpoints.BEST):
            raise checkpoints.NoCheckpointError("checkpoints/last.pt is missing but best.pt exists; use "
                                                "--checkpoint best.")
        raise checkpoints.NoCheckpointError("There is no checkpoint yet: the train stage has not saved anything to "
                                            "snapshot.")
    ck = checkpoints.load(path)
    step = int(ck["step"])
    out = project.gguf_path(step=step)
    say(f"exporting {path.name} (step {step}) to {out}")
    export_checkpoint(project, ck, out, checkpoint, snapshot=True)
    sidecar = checkpoints.read_sidecar(project, checkpoint)
    planned = ck.get("planned_steps") or (ck.get("train_config") or {}).get("steps", step)
    entry = {"id": f"step{step}-{checkpoint}", "step": step, "planned_steps": int(planned), "checkpoint": checkpoint,
             "val_cos": sidecar and sidecar.val_cos, "best_val_cos": ck.get("best_val_cos"), "path": str(out),
             "name": out.name, "size": out.stat().st_size, "time": time.time(), "while_training": while_training,
             "eval": None}
    _record(project, entry)
    if evaluate:
        import torch

        from trainer_core.contract.devices import pick_device
        from trainer_core.stages.evaluate import evaluate_gguf
        where = torch.device(device) if device else (torch.device("cpu") if while_training
                                                     else pick_device(project.settings.train.device))
        say(f"evaluating {out.name} on {where}")
        result = evaluate_gguf(project, out, ck, where)["metrics"]
        entry["eval"] = {k: v for k, v in result.items() if isinstance(v, (int, float))}
        _record(project, entry)
    write_card(project)             # the card lists the snapshot (and describes it while there is no final export)
    return entry


def job_files(project: Project) -> JobFiles:
    return JobFiles(status=project.root / STATUS_FILE, pid=project.root / PID_FILE, log=project.root / LOG_FILE,
                    what="the snapshot process")


def job_status(project: Project) -> dict[str, Any]:
    """The snapshot job's status; a "running" status whose process died reads as failed."""
    return read_status(job_files(project))


def start_job(project: Project, checkpoint: str = "last", evaluate: bool = False, fresh: bool = True,
              device: str | None = None, timeout: float = 1800.0) -> int:
    """Launch the snapshot job detached (`.snapshot.status` tells its phase); refused while one runs."""
    checkpoints.parse_name(checkpoint)        # a bad name is bad input here, not a failed job later
    if job_status(project).get("status") == "running":
        raise AlreadyRunningError("A snapshot export is already running; wait for it to finish.")
    argv = [sys.executable, "-m", "trainer_core.snapshot", "--project", str(project.root),
            "--checkpoint", checkpoint, "--timeout", str(timeout)]
    argv += (["--eval"] if evaluate else []) + ([] if fresh else ["--no-fresh"])
    argv += ["--device", device] if device else []
    return launch(job_files(project), argv, cwd=project.root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_core.snapshot")
    parser.add_argument("--project", required=True)
    parser.add_argument("--checkpoint", default="last")
    parser.add_argument("--eval", action="store_true")
    parser.add_argument("--no-fresh", action="store_true")
    parser.add_argument("--device")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    try:
        project = Project.open(args.project)
    except TrainerError as e:
        Reporter()("error", message=str(e))
        return e.exit_code
    report = JobReport(job_files(project), phase="starting", checkpoint=args.checkpoint, eval=args.eval)

    def say(phase: str) -> None:
        report("status", status="running", phase=phase)

    def body() -> dict[str, Any]:
        say("starting")
        entry = take_snapshot(project, args.checkpoint, not args.no_fresh, args.eval, args.device, args.timeout, say)
        return {"phase": "done", "step": entry["step"], "path": entry["path"], "val_cos": entry["val_cos"]}
    return run_job(report, body)


if __name__ == "__main__":
    sys.exit(main())
