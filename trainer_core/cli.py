"""`gguf-trainer`: the command line.

    gguf-trainer new    --project DIR --pack ID [--name NAME]
    gguf-trainer run    --project DIR [--only STAGE ...] [--force] [--steps N] [--gpus N]   # foreground
    gguf-trainer start  --project DIR [--only STAGE ...] [--force] [--steps N] [--gpus N]   # detached
    gguf-trainer stop   --project DIR [--timeout S]
    gguf-trainer kill   --project DIR
    gguf-trainer status --project DIR [--json]
    gguf-trainer set    --project DIR [--steps N] [--set KEY=VALUE ...]
    gguf-trainer snapshot --project DIR [--checkpoint last|best|step<N>] [--eval] [--no-fresh]
                        [--device D] [--timeout S] [--detach]
    gguf-trainer reset  --project DIR state|train|shards|corpus|output
    gguf-trainer packs
    gguf-trainer publish --project DIR --repo OWNER/NAME [--private] [--include-snapshots] [--allow-demo]
    gguf-trainer demo   [--project DIR] [--pack ID]   # a project on tiny offline models (default DIR:
                                                      # ~/gguf-trainer/projects/demo/<pack folder>)
    gguf-trainer inspect FILE.gguf [--json]
    gguf-trainer infer  (--project DIR | --adapter A.gguf) (--hidden FILE | --prompt TEXT [--student S.gguf
                        --tokenizer DIR --pack ID]) [--t5-ids FILE] [--vis FILE] [--seed-ids FILE [--vis-pos S:N,…]
                        [--bank]] [--out OUT] [--compare REF] [--json]
    gguf-trainer [serve] [--auto-resume [--no-gui]]   # the GUI; --no-gui: only relaunch an interrupted run

Errors are one sentence on stderr; exit codes: 0 ok, 1 failed, 2 bad input (unknown
project, pack, setting or value), 3 the project is already running.
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Callable

from trainer_core import __version__
from trainer_core.base.config import flat_settings
from trainer_core.base.errors import TrainerError, UsageError
from trainer_core.cli_student import add_download_arguments
from trainer_core.cli_tools import (check_path_arguments, cmd_download, cmd_infer, cmd_inspect, cmd_plan,
                                    cmd_reset, cmd_snapshot)
from trainer_core.contract import checkpoints
from trainer_core.packs import DEMO_PACKS, PACKS
from trainer_core.pipeline import check_only, run_pipeline
from trainer_core.project import Project, default_projects_root, last_project
from trainer_core import publish, resets
from trainer_core.runner import request_stop, kill_pipeline, runtime_status, start_pipeline
from trainer_core.stages import STAGE_NAMES
from trainer_core.status import status_report
from trainer_core.from_adapter import cmd_new

__all__ = ["main", "build_parser", "parse_args", "run_command", "auto_resume", "DEFAULT_PORT", "DEMO_FOLDER"]

DEFAULT_PORT = 8655          # the GUI's, on 127.0.0.1
DEMO_FOLDER = "demo"         # the demo projects' folder in the projects root (the CLI's and the GUI's)

SUBCOMMANDS = ("serve", "download", "new", "run", "start", "stop", "kill", "status", "set", "packs", "inspect", "infer",
               "demo", "snapshot", "reset", "plan", "publish")
PROJECT_HELP = "the project folder (made by `new` or `demo`)"
TOP_EPILOG = """\
Without a command, gguf-trainer opens the GUI (`serve`):
  gguf-trainer --auto-resume            the GUI, after relaunching the last project's
                                        interrupted run (a crash or a reboot)
  gguf-trainer --auto-resume --no-gui   only the relaunch, no GUI (for a boot script)
`gguf-trainer COMMAND --help` describes each command."""


def _project(p: argparse.ArgumentParser, help: str = PROJECT_HELP) -> None:
    p.add_argument("--project", required=True, metavar="DIR", help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gguf-trainer", description="Train pig_clip adapters for ggk.",
                                     epilog=TOP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gguf-trainer {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="open the GUI (default)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--no-browser", action="store_true")
    serve.add_argument("--auto-resume", action="store_true",
                       help="relaunch the last project if its run was interrupted")
    serve.add_argument("--demo", action="store_true",
                       help="build (once) and run the demo project on tiny offline models")
    serve.add_argument("--demo-pack", default=DEMO_PACKS[0], metavar="ID",
                       help=f"with --demo: the pack whose demo runs ({', '.join(DEMO_PACKS)})")
    serve.add_argument("--no-gui", action="store_true",
                       help="with --auto-resume: relaunch the interrupted run and exit (for a boot script)")
    serve.add_argument("--share", action="store_true", help="a public gradio.live link (needs --auth)")
    serve.add_argument("--auth", metavar="USER:PASSWORD",
                       help="require a login; 'generate' prints a random password once (needed for --share "
                            "and any --host but loopback)")
    serve.add_argument("--projects-root", metavar="DIR", help="where new projects go (default ~/gguf-trainer/projects)")
    serve.add_argument("--allow-dir", action="append", default=[], metavar="DIR",
                       help="another folder the GUI may read and write (repeatable)")

    new = sub.add_parser("new", help="create a project")
    _project(new, "the folder to create (it must not be a project yet)")
    new.add_argument("--pack", required=True, metavar="ID", help="one of: " + ", ".join(PACKS))
    new.add_argument("--name", help="adapter name (default: pig_<folder name>)")
    new.add_argument("--from-adapter", metavar="FILE_OR_HUB_REPO", help="start training from this adapter GGUF (a "
                     "file, or OWNER/NAME[:file.gguf] on the Hub) of the pack's kind and shapes; its width and depth "
                     "are taken")

    for name, help in (("run", "run the pipeline in the foreground"), ("start", "launch the pipeline detached")):
        p = sub.add_parser(name, help=help)
        _project(p)
        p.add_argument("--only", nargs="+", metavar="STAGE",
                       help="run only these stages; the stages, in order: " + ", ".join(STAGE_NAMES))
        p.add_argument("--force", action="store_true", help="re-run export and eval even when current")
        p.add_argument("--steps", help="set train.steps first (12000, 12k, 1.5k, ...)")
        p.add_argument("--gpus", type=int, metavar="N",
                       help="set precompute.gpus first: precompute over N processes, one per GPU")

    stop = sub.add_parser("stop", help="ask the run to save and exit")
    _project(stop)
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (0: do not wait)")

    kill = sub.add_parser("kill", help="kill the run at once, without saving")
    _project(kill)

    status = sub.add_parser("status", help="show the run and its stages")
    _project(status)
    status.add_argument("--json", action="store_true", help="the full report as JSON, for scripts (epoch times, "
                        "unrounded figures)")

    plan = sub.add_parser("plan", help="time, disk and memory of a run before it starts")
    _project(plan)
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument("--calibrate", action="store_true", help="measure this machine first (runs every stage on "
                                                              "a small scratch copy of the project)")

    set_ = sub.add_parser("set", help="change settings (also while running)")
    _project(set_)
    set_.add_argument("--steps", help="the planned step count (12000, 12k, 40k, ...)")
    set_.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                      help="any setting, e.g. train.lr=1e-4 or corpus.extra_files=a.txt,b.jsonl")
    set_.add_argument("--force", action="store_true",
                      help="change the pack, the teacher, the student or precompute.mock_teacher although the "
                           "project has shards or checkpoints (they are moved to shards.stale-* / checkpoints.stale-*)")

    sub.add_parser("packs", help="list the trainer packs")

    snap = sub.add_parser("snapshot", help="export a step-tagged GGUF now (also while training runs)")
    _project(snap)
    snap.add_argument("--checkpoint", default="last", help="last (default), best or step<N> (a kept step)")
    snap.add_argument("--eval", action="store_true", help="also evaluate the GGUF on the val shards")
    snap.add_argument("--no-fresh", action="store_true", help="take the checkpoint on disk; do not ask the trainer")
    snap.add_argument("--device", help="evaluation device (default: the CPU while training runs)")
    snap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the trainer's save")
    snap.add_argument("--detach", action="store_true", help="run as a detached job (.snapshot.status)")

    dl = sub.add_parser("download", help="fetch the missing materials; find the student GGUF (--find-student)")
    _project(dl)
    add_download_arguments(dl)          # cli_student.py: the materials' and the student's options

    rst = sub.add_parser("reset", help="delete a stage's results and everything after them",
                         description=resets.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _project(rst)
    rst.add_argument("what", choices=resets.RESETS, help="what to delete (each target is described above)")

    demo = sub.add_parser("demo", help="create a project on tiny offline models (try the whole pipeline now)")
    demo.add_argument("--project", metavar="DIR",
                      help=f"default: {default_projects_root() / DEMO_FOLDER}/<pack folder>")
    demo.add_argument("--pack", default=DEMO_PACKS[0], metavar="ID",
                      help=f"{DEMO_PACKS[0]} (default), " + ", ".join(DEMO_PACKS[1:]))

    inspect = sub.add_parser("inspect", help="describe an adapter or student GGUF and its layout problems")
    inspect.add_argument("file", metavar="FILE.gguf")
    inspect.add_argument("--json", action="store_true")

    infer = sub.add_parser("infer", help="run an exported adapter as the engine does")
    infer.add_argument("--project", metavar="DIR", help="the project: its export, student, tokenizer, pack")
    infer.add_argument("--adapter", metavar="A.gguf")
    infer.add_argument("--hidden", metavar="FILE", help="student final-norm states: .npy or raw f32 (qwen_hidden.bin)")
    infer.add_argument("--student", metavar="S.gguf", help="pig_clip GGUF (with --tokenizer, --pack, --prompt)")
    infer.add_argument("--tokenizer", metavar="DIR", help="the student tokenizer/config snapshot folder")
    infer.add_argument("--pack", metavar="ID", help="the pack whose template formats --prompt")
    infer.add_argument("--prompt", help="the prompt text")
    infer.add_argument("--t5-ids", metavar="FILE", help="seeded adapters: .npy or t5_ids.txt (one id a line)")
    infer.add_argument("--vis", metavar="FILE",
                       help="vision adapters: raw vision rows (.npy or raw f32); token-aligned: dense, one per "
                            "student row; Qwen3.5 bridge: every reference's rows in image order (with --vis-pos); "
                            "Ming: the input image's Ling vision rows (with --vis-pos)")
    infer.add_argument("--seed-ids", metavar="FILE",
                       help="Qwen3.5 bridge: the MOSS template's Qwen3.5 ids; Ming: the Ming template's Ling ids; one "
                            "slot each (.npy or seed_ids.txt)")
    infer.add_argument("--vis-pos", metavar="S:N[,S:N...]",
                       help="Qwen3.5 bridge and Ming: first slot and slot count of each reference's run, in image "
                            "order (Ming: one run)")
    infer.add_argument("--bank", action="store_true", help="Qwen3.5 bridge: the FLUX.3 Klein bank rows, not the "
                       "MOSS slot rows; Ming: the caption rows alone, cap_dim wide")
    infer.add_argument("--out", metavar="OUT", help="write the rows: .npy, or raw f32 for any other suffix")
    infer.add_argument("--compare", metavar="REF", help="reference rows (.npy or raw f32, e.g. adapter_out.bin)")
    infer.add_argument("--json", action="store_true")
    publish.add_parser(sub)                # trainer_core/publish.py: the export, its card and plot to the Hub
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; no subcommand (or only options) means `serve`, the GUI."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:   # serve takes no positional
        close = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "the commands are " + ", ".join(SUBCOMMANDS) + "."
        print(f"gguf-trainer: '{argv[0]}' is not a command; {hint}", file=sys.stderr)
        raise SystemExit(2)
    if not argv or argv[0] not in (*SUBCOMMANDS, "-h", "--help", "--version"):
        argv = ["serve", *argv]
    return build_parser().parse_args(argv)


def run_command(args: argparse.Namespace, command: Callable[[argparse.Namespace], int] | None = None) -> int:
    """Run a parsed command (or `command` on it): a TrainerError is one sentence on stderr and its
    exit code, Ctrl-C exits 130, a reader that closed stdout early (`status | head -1`) ends it quietly
    with 141 (128 + SIGPIPE, as a shell reports a pipe writer it cut off)."""
    try:
        check_path_arguments(args)
        code = (command or COMMANDS[args.command])(args)
        sys.stdout.flush()              # a closed pipe surfaces here, not in the interpreter's exit
        return code
    except TrainerError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except OSError as e:              # a full or read-only disk, a file where a folder should be: one sentence
        from trainer_core.base.diskspace import disk_error
        sentence = disk_error(e)
        if sentence is None:
            raise
        print(str(sentence), file=sys.stderr)
        return sentence.exit_code


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit does not print a second BrokenPipeError."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer_core`: every command; `serve` without the GUI (`--auto-resume --no-gui`),
    as the GUI lives in the ui package (the `gguf-trainer` console script and app.py start it)."""
    return run_command(parse_args(argv))


# ---------------------------------------------------------------- commands

def cmd_serve(args: argparse.Namespace) -> int:
    """`serve` here is the boot-script half: relaunch an interrupted run. The GUI itself starts from
    the console script (ui/launcher.py), which calls this first."""
    if args.no_gui and not args.auto_resume:
        raise UsageError("--no-gui only makes sense with --auto-resume.")
    if args.auto_resume:
        auto_resume()
    if args.no_gui:
        return 0
    raise UsageError("The GUI starts with `gguf-trainer` (the console script) or `python app.py`; "
                     "`python -m trainer_core` runs the other commands.")


def auto_resume() -> int | None:
    """Relaunch the last project if its run was interrupted (a crash or a reboot); otherwise say
    why there is nothing to resume."""
    path = last_project()
    if path is None:
        print("nothing to resume: no project has been opened or run yet")
        return None
    try:
        project = Project.open(path)
        status = runtime_status(project)["status"]
        if not project.settings.auto_resume or status != "interrupted":
            why = (f"auto_resume is off for {project.root}" if not project.settings.auto_resume else
                   f"the last project, {project.root}, is {status}, not interrupted")
            print(f"nothing to resume: {why}")
            return None
        pid = start_pipeline(project)
    except TrainerError as e:
        print(f"auto-resume of {path} failed: {e}", file=sys.stderr)
        return None
    print(f"auto-resume: relaunched the interrupted run of {project.root} (pid {pid})")
    return pid


def _set_steps(project: Project, steps: str | None) -> None:
    if steps is None:
        return
    before, after = project.update_settings([f"train.steps={steps}"])
    if before.train.steps == after.train.steps:
        print(f"train.steps: {after.train.steps} (unchanged)")
    else:
        print(f"train.steps: {before.train.steps} -> {after.train.steps}")


def _set_gpus(project: Project, gpus: int | None) -> None:
    if gpus is None:
        return
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: give the number of processes, 1 or more.")
    project.update_settings([f"precompute.gpus={gpus}"])
    print(f"precompute.gpus: {gpus}")


def cmd_run(args: argparse.Namespace) -> int:
    from trainer_core.readiness import refuse_unready
    project = Project.open(args.project)
    only = check_only(args.only)
    _set_steps(project, args.steps)
    _set_gpus(project, args.gpus)
    refuse_unready(project, only)
    return run_pipeline(project, only, args.force, echo=True)


def cmd_start(args: argparse.Namespace) -> int:
    from trainer_core.readiness import refuse_unready
    project = Project.open(args.project)
    only = check_only(args.only)
    _set_steps(project, args.steps)
    _set_gpus(project, args.gpus)
    refuse_unready(project, only)
    pid = start_pipeline(project, only, args.force)
    print(f"pipeline launched (pid {pid}), logging to {project.pipeline_log}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    project = Project.open(args.project)
    info = runtime_status(project)
    if info["pid"] is None and info["stage_pid"] is None:
        request_stop(project)
        print(f"not running ({info['status']})")
        return 0
    if request_stop(project, timeout=args.timeout):
        print("stopped")
    else:
        print(f"stop requested (pid {info['pid'] or info['stage_pid']} still finishing its current step)")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    project = Project.open(args.project)
    info = runtime_status(project)
    if info["pid"] is None and info["stage_pid"] is None:
        print(f"not running ({info['status']})")
        return 0
    if kill_pipeline(project):
        print("killed")
        return 0
    print("the run's processes did not exit after SIGKILL", file=sys.stderr)
    return 1


def cmd_status(args: argparse.Namespace) -> int:
    from trainer_core.status_text import status_lines
    project = Project.open(args.project)
    report = status_report(project)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print("\n".join(status_lines(report, project.pack.judge, project.pack.ggk_edit_args, str(project.pipeline_log))))
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    project = Project.open(args.project)
    if args.steps is None and not args.assignments:
        print(f"train.steps: {project.settings.train.steps}")
        return 0
    assignments = list(args.assignments)
    if args.steps is not None:
        assignments.append(f"train.steps={args.steps}")
    from trainer_core.plan.refusals import refuse_unrunnable
    warnings = refuse_unrunnable(project, assignments)
    stale, work = project.work_at_risk(assignments)
    if stale and work:
        if not args.force:
            raise UsageError(f"Changing {', '.join(stale)} would make this project's work stale ({'; '.join(work)}); "
                             f"create a new project for it, or repeat with --force to move that work aside.")
        if runtime_status(project)["status"] == "running":
            raise UsageError("The pipeline is running; stop it before changing the pack, the teacher or the student.")
        for moved in project.archive_work():
            print(f"moved {moved.name.split('.stale-')[0]}/ to {moved}")
    before, after = project.update_settings(assignments)
    b, a = flat_settings(before.to_dict()), flat_settings(after.to_dict())
    changed = [key for key in a if a[key] != b.get(key)]
    for key in changed:
        if key == "hf_token":          # a secret: never echoed to a terminal or a log
            print("hf_token: " + ("set (hidden)" if a[key] else "cleared"))
            continue
        print(f"{key}: {json.dumps(b.get(key))} -> {json.dumps(a[key])}")
    if not changed:
        print("no setting changed")
    for warning in warnings:
        print(f"warning: {warning}")
    if "train.steps" in changed:
        _steps_hint(project, after.train.steps)
    return 0


def _steps_hint(project: Project, steps: int) -> None:
    if runtime_status(project)["status"] == "running":
        print(f"the trainer picks the new count up within {project.settings.train.log_every} steps")
        return
    last = checkpoints.read_sidecar(project, checkpoints.LAST)
    step = last.trained_steps if last else None
    if isinstance(step, int) and step >= steps:
        print(f"the checkpoint at step {step} already covers it; training counts as done")
    elif isinstance(step, int):
        print(f"`gguf-trainer start --project {project.root}` continues from step {step} to {steps}")


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trainer_core.demo import build_demo
    from trainer_core.packs import get_pack
    from trainer_core.term_progress import TerminalBars
    # under the projects root, not the current folder (a clone, say): the GUI's demo goes there too
    default = default_projects_root() / DEMO_FOLDER / get_pack(args.pack).default_folder
    root = Path(args.project) if args.project else default
    if (root / "project.json").is_file():         # said at once, before the models' libraries load
        raise UsageError(f"A project already exists at {root}; run it with `gguf-trainer run --project {root}`, "
                         "or delete that folder (or pass another --project) to build the demo afresh.")
    bars = TerminalBars(sys.stdout)
    project = build_demo(root, args.pack, lambda done, total, what: bars.update("demo", done, total, "steps",
                                                                               desc=f"demo: {what}"))
    bars.close_all()
    from trainer_core.demo_times import run_time_sentence
    took = f"  ({run_time_sentence(project.pack.id)})" if run_time_sentence(project.pack.id) else ""
    print(f"demo project ready: {project.root}\n"
          f"run it:  gguf-trainer run --project {project.root}{took}\n"
          f"its GGUF will be written to {project.gguf_path()} (export.output_dir)")
    home = default_projects_root().resolve()
    if home not in project.root.resolve().parents:
        # the GUI opens folders under its projects root and those it is started with --allow-dir
        outside = project.gguf_path().parent.resolve()
        print(f"open it in the GUI: gguf-trainer --allow-dir {outside} (the GUI opens folders under {home} and "
              f"those named with --allow-dir), then Open project {project.root}")
    return 0


def cmd_packs(args: argparse.Namespace) -> int:
    for pack in PACKS.values():
        print(f"{pack.id:<20} {pack.title}")
    return 0


COMMANDS = {"serve": cmd_serve, "new": cmd_new, "run": cmd_run, "start": cmd_start, "stop": cmd_stop,
            "kill": cmd_kill, "status": cmd_status, "set": cmd_set, "packs": cmd_packs,
            "inspect": cmd_inspect, "infer": cmd_infer, "demo": cmd_demo, "snapshot": cmd_snapshot,
            "reset": cmd_reset, "download": cmd_download, "plan": cmd_plan, "publish": publish.cmd_publish}


if __name__ == "__main__":
    sys.exit(main())
