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
    gguf-trainer demo   [--project DIR] [--pack ID]   # a project on tiny offline models
    gguf-trainer inspect FILE.gguf [--json]
    gguf-trainer infer  --adapter A.gguf (--hidden FILE | --student S.gguf --tokenizer DIR --pack ID
                        --prompt TEXT) [--t5-ids FILE] [--vis FILE] [--out OUT] [--compare REF] [--json]
    gguf-trainer [serve] [--auto-resume]          # the GUI (arrives in a later version)

Errors are one sentence on stderr; exit codes: 0 ok, 1 failed, 2 bad input (unknown
project, pack, setting or value), 3 the project is already running.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from trainer_core import __version__
from trainer_core.base.atomic import read_json
from trainer_core.base.errors import TrainerError, UsageError
from trainer_core.packs import PACKS
from trainer_core.pipeline import check_only, run_pipeline
from trainer_core.project import Project, last_project
from trainer_core.runner import request_stop, kill_pipeline, runtime_status, start_pipeline
from trainer_core.status import status_report

__all__ = ["main", "build_parser"]

SUBCOMMANDS = ("serve", "download", "new", "run", "start", "stop", "kill", "status", "set", "packs", "inspect", "infer",
               "demo", "snapshot", "reset")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gguf-trainer", description="Train pig_clip adapters for ggk.")
    parser.add_argument("--version", action="version", version=f"gguf-trainer {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="open the GUI (default)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8655)
    serve.add_argument("--no-browser", action="store_true")
    serve.add_argument("--auto-resume", action="store_true",
                       help="relaunch the last project if its run was interrupted")
    serve.add_argument("--demo", action="store_true",
                       help="build (once) and run the demo project on tiny offline models")
    serve.add_argument("--demo-pack", default="t5xxl_pixart", metavar="ID",
                       help="with --demo: the pack whose demo runs (t5xxl_pixart, llada_image, qwen3vl_mageflow, qwen3vl_qwenimage)")
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
    new.add_argument("--project", required=True, metavar="DIR")
    new.add_argument("--pack", required=True, metavar="ID", help="one of: " + ", ".join(PACKS))
    new.add_argument("--name", help="adapter name (default: pig_<folder name>)")

    for name, help in (("run", "run the pipeline in the foreground"), ("start", "launch the pipeline detached")):
        p = sub.add_parser(name, help=help)
        p.add_argument("--project", required=True, metavar="DIR")
        p.add_argument("--only", nargs="+", metavar="STAGE", help="run only these stages")
        p.add_argument("--force", action="store_true", help="re-run export and eval even when current")
        p.add_argument("--steps", help="set train.steps first (12000, 12k, 1.5k, ...)")
        p.add_argument("--gpus", type=int, metavar="N",
                       help="set precompute.gpus first: precompute over N processes, one per GPU")

    stop = sub.add_parser("stop", help="ask the run to save and exit")
    stop.add_argument("--project", required=True, metavar="DIR")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (0: do not wait)")

    kill = sub.add_parser("kill", help="kill the run at once, without saving")
    kill.add_argument("--project", required=True, metavar="DIR")

    status = sub.add_parser("status", help="show the run and its stages")
    status.add_argument("--project", required=True, metavar="DIR")
    status.add_argument("--json", action="store_true", help="machine-readable output")

    set_ = sub.add_parser("set", help="change settings (also while running)")
    set_.add_argument("--project", required=True, metavar="DIR")
    set_.add_argument("--steps", help="the planned step count (12000, 12k, 40k, ...)")
    set_.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                      help="any setting, e.g. train.lr=1e-4 or corpus.extra_files=a.txt,b.jsonl")

    sub.add_parser("packs", help="list the trainer packs")

    snap = sub.add_parser("snapshot", help="export a step-tagged GGUF now (also while training runs)")
    snap.add_argument("--project", required=True, metavar="DIR")
    snap.add_argument("--checkpoint", default="last", help="last (default), best or step<N> (a kept step)")
    snap.add_argument("--eval", action="store_true", help="also evaluate the GGUF on the val shards")
    snap.add_argument("--no-fresh", action="store_true", help="take the checkpoint on disk; do not ask the trainer")
    snap.add_argument("--device", help="evaluation device (default: the CPU while training runs)")
    snap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the trainer's save")
    snap.add_argument("--detach", action="store_true", help="run as a detached job (.snapshot.status)")

    dl = sub.add_parser("download", help="find or fetch the project's missing materials (foreground)")
    dl.add_argument("--project", required=True, metavar="DIR")
    dl.add_argument("--id", nargs="+", metavar="ID", help="only these materials (default: every wanted one)")
    dl.add_argument("--required-only", action="store_true", help="skip optional materials")

    rst = sub.add_parser("reset", help="delete a stage's results and everything after them")
    rst.add_argument("--project", required=True, metavar="DIR")
    rst.add_argument("what", choices=("state", "train", "shards", "corpus", "output"))

    demo = sub.add_parser("demo", help="create a project on tiny offline models (try the whole pipeline now)")
    demo.add_argument("--project", metavar="DIR", help="default: ./gguf-trainer-demo/<pack folder>")
    demo.add_argument("--pack", default="t5xxl_pixart", metavar="ID",
                      help="t5xxl_pixart (default), llada_image, qwen3vl_mageflow or qwen3vl_qwenimage")

    inspect = sub.add_parser("inspect", help="describe an adapter or student GGUF and its layout problems")
    inspect.add_argument("file", metavar="FILE.gguf")
    inspect.add_argument("--json", action="store_true")

    infer = sub.add_parser("infer", help="run an exported adapter as the engine does")
    infer.add_argument("--adapter", required=True, metavar="A.gguf")
    infer.add_argument("--hidden", metavar="FILE", help="student final-norm states: .npy or raw f32 (qwen_hidden.bin)")
    infer.add_argument("--student", metavar="S.gguf", help="pig_clip GGUF (with --tokenizer, --pack, --prompt)")
    infer.add_argument("--tokenizer", metavar="DIR", help="the student tokenizer/config snapshot folder")
    infer.add_argument("--pack", metavar="ID", help="the pack whose template formats --prompt")
    infer.add_argument("--prompt", help="the prompt text")
    infer.add_argument("--t5-ids", metavar="FILE", help="seeded adapters: .npy or t5_ids.txt (one id a line)")
    infer.add_argument("--vis", metavar="FILE", help="vision adapters: dense raw vision rows (.npy or raw f32)")
    infer.add_argument("--out", metavar="OUT", help="write the rows: .npy, or raw f32 for any other suffix")
    infer.add_argument("--compare", metavar="REF", help="reference rows (.npy or raw f32, e.g. adapter_out.bin)")
    infer.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["serve", *argv]
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except TrainerError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------- commands

def cmd_serve(args: argparse.Namespace) -> int:
    if args.auto_resume:
        auto_resume()
    if args.no_gui:
        if not args.auto_resume:
            print("--no-gui only makes sense with --auto-resume", file=sys.stderr)
            return 2
        return 0
    from ui.app import main as serve_main      # gradio only here: the CLI stays light
    return serve_main(args)


def auto_resume() -> int | None:
    """Relaunch the last project if its run was interrupted (a crash or a reboot)."""
    path = last_project()
    if path is None:
        return None
    try:
        project = Project.open(path)
        if not project.settings.auto_resume or runtime_status(project)["status"] != "interrupted":
            return None
        pid = start_pipeline(project)
    except TrainerError as e:
        print(f"auto-resume of {path} failed: {e}", file=sys.stderr)
        return None
    print(f"auto-resume: relaunched the interrupted run of {project.root} (pid {pid})")
    return pid


def cmd_new(args: argparse.Namespace) -> int:
    project = Project.create(args.project, args.pack, args.name)
    print(f"created {project.pack.id} project {project.root} (adapter {project.settings.name}, "
          f"export {project.gguf_path()})")
    return 0


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
    project = Project.open(args.project)
    only = check_only(args.only)
    _set_steps(project, args.steps)
    _set_gpus(project, args.gpus)
    return run_pipeline(project, only, args.force, echo=True)


def cmd_start(args: argparse.Namespace) -> int:
    project = Project.open(args.project)
    only = check_only(args.only)
    _set_steps(project, args.steps)
    _set_gpus(project, args.gpus)
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
    project = Project.open(args.project)
    report = status_report(project)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    pid = f" (pid {report['pid']})" if report["pid"] else ""
    print(f"{report['project']}: {report['status']}{pid}  [{report['pack']}, {report['name']}]")
    if report["status"] == "interrupted":
        note = (f"; its stage process (pid {report['stage_pid']}) is still saving"
                if report["stage_pid"] else "")
        print(f"  the last run stopped without finishing (a crash or a reboot){note}; "
              f"`gguf-trainer start --project {report['project']}` resumes it")
    for stage in report["stages"]:
        extra = {k: v for k, v in stage.items() if k not in ("name", "title", "done", "status")}
        print(f"  {stage['name']:<18} {stage['status']:<10} {json.dumps(extra) if extra else ''}".rstrip())
    for which in ("last", "best"):
        sidecar = report["checkpoints"][which]
        if isinstance(sidecar, dict):
            print(f"  checkpoint {which}: step {sidecar.get('step')} (val cos {sidecar.get('val_cos')})")
    ev = report["eval"] or {}
    shown = [f"{k} {ev[k]:.5f}" for k in report["metric_names"] if isinstance(ev.get(k), float)]
    if shown:
        print(f"  eval: {', '.join(shown)}")
    for entry in report["outputs"]:
        print(f"  output {entry['name']}  {entry['size']:,} bytes")
    for entry in report["snapshots"]:
        ev = entry.get("eval") or {}
        key = next((k for k in ("cos_centered", "cos_slice", "cos") if k in ev), None)
        shown = f"  eval {key} {ev[key]:.5f}" if key else ""
        print(f"  snapshot step {entry['step']}/{entry['planned_steps']}  {entry['checkpoint']}  "
              f"val cos {entry['val_cos']}{shown}  {entry['path']}")
    job = report["snapshot_job"]
    if job.get("status") in ("running", "failed"):
        print(f"  snapshot job: {job['status']} — {job.get('phase') if job['status'] == 'running' else job.get('error')}")
    if report["ggk_command"]:
        print(f"  use it: {report['ggk_command']}")
        if project.pack.ggk_edit_args:
            print(f"  to edit images, add: {project.pack.ggk_edit_args}")
    if report["error"] and report["status"] == "failed":
        print(f"  last error: {report['error']} (see {project.pipeline_log})")
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    project = Project.open(args.project)
    if args.steps is None and not args.assignments:
        print(f"train.steps: {project.settings.train.steps}")
        return 0
    assignments = list(args.assignments)
    if args.steps is not None:
        assignments.append(f"train.steps={args.steps}")
    before, after = project.update_settings(assignments)
    b, a = _flatten(before.to_dict()), _flatten(after.to_dict())
    changed = [key for key in a if a[key] != b.get(key)]
    for key in changed:
        if key == "hf_token":          # a secret: never echoed to a terminal or a log
            print("hf_token: " + ("set (hidden)" if a[key] else "cleared"))
            continue
        print(f"{key}: {json.dumps(b.get(key))} -> {json.dumps(a[key])}")
    if not changed:
        print("no setting changed")
    if "train.steps" in changed:
        _steps_hint(project, after.train.steps)
    return 0


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _steps_hint(project: Project, steps: int) -> None:
    if runtime_status(project)["status"] == "running":
        print(f"the trainer picks the new count up within {project.settings.train.log_every} steps")
        return
    last = read_json(project.checkpoints_dir / "last.json", None)
    step = last.get("step") if isinstance(last, dict) else None
    if isinstance(step, int) and step >= steps:
        print(f"the checkpoint at step {step} already covers it; training counts as done")
    elif isinstance(step, int):
        print(f"`gguf-trainer start --project {project.root}` continues from step {step} to {steps}")


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trainer_core.demo.build import build_demo
    from trainer_core.packs import get_pack
    root = Path(args.project) if args.project else Path("gguf-trainer-demo") / get_pack(args.pack).default_folder
    project = build_demo(root, args.pack)
    print(f"demo project ready: {project.root}\n"
          f"run it:  gguf-trainer run --project {project.root}")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    """Link copies found on disk, then download what is still missing, in the foreground."""
    from trainer_core.materials import (DownloadError, adopt_existing, download, list_files, material_lock, material_status,
                            token_for, wanted)
    project = Project.open(args.project)
    for material_id, path in adopt_existing(project):
        print(f"{material_id}: found and linked {path}")
    project = Project.open(args.project)
    ids = set(args.id or [])
    unknown = ids - {m.id for m in project.pack.project_materials(project)}
    if unknown:
        raise TrainerError(f"{', '.join(sorted(unknown))}: no such material in {project.pack.id}; "
                           f"choose from {', '.join(m.id for m in project.pack.project_materials(project))}.")
    failed = 0
    for m in project.pack.project_materials(project):
        if (ids and m.id not in ids) or (not ids and not wanted(project, m)) or (args.required_only and not m.required):
            continue
        if m.kind == "local_file":
            st = material_status(project, m)
            print(f"{m.id}: {st.status}" + ("" if st.status == "ready" else f" — {m.hint or 'pick the file'} "
                                             f"(gguf-trainer set --project DIR --set materials.{m.id}.path=FILE)"))
            continue
        try:
            listing = list_files(m, token_for(project))
        except Exception as e:      # noqa: BLE001 — offline, refused, unknown repo: say which
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"{m.id}: cannot list {m.repo} on the Hub ({first}); check the network, HF_ENDPOINT or "
                  f"the token and run the command again", file=sys.stderr)
            failed += 1
            continue
        if material_status(project, m, listing).status == "ready":
            print(f"{m.id}: ready")
            continue
        with material_lock(project, m.id) as held:
            if not held:
                print(f"{m.id}: a detached download is already fetching it")
                continue
            try:
                print(f"{m.id}: downloading {m.repo} ({m.size_hint or 'size from the Hub'})", flush=True)
                download(project, m, _progress_line(m.id))
                print(f"\r{m.id}: ready" + " " * 40)
            except DownloadError as e:
                print(f"\n{m.id}: {e}", file=sys.stderr)
                failed += 1
            except KeyboardInterrupt:
                print(f"\n{m.id}: interrupted; run the same command again to continue where it stopped",
                      file=sys.stderr)
                return 130
    return 1 if failed else 0


def _progress_line(material_id: str):
    def show(event: dict[str, Any]) -> None:
        if event.get("type") == "progress" and event.get("total"):
            pct = 100 * event["count"] / event["total"]
            rate = event.get("rate") or 0
            eta = f", ETA {event['eta_s']:.0f} s" if event.get("eta_s") is not None else ""
            print(f"\r{material_id}: {pct:5.1f}% of {event['total'] / 2**20:.1f} MiB, {rate / 2**20:.1f} MiB/s{eta}   ",
                  end="", file=sys.stderr, flush=True)
    return show


def cmd_snapshot(args: argparse.Namespace) -> int:
    from trainer_core.snapshot import LOG_FILE, start_job, take_snapshot
    project = Project.open(args.project)
    if args.detach:
        pid = start_job(project, args.checkpoint, args.eval, not args.no_fresh, args.device, args.timeout)
        print(f"snapshot job launched (pid {pid}), logging to {project.root / LOG_FILE}")
        return 0
    entry = take_snapshot(project, args.checkpoint, not args.no_fresh, args.eval, args.device, args.timeout,
                          say=lambda m: print(m, flush=True))
    val = f", val cos {entry['val_cos']:.5f}" if entry["val_cos"] is not None else ""
    print(f"{entry['path']}  (step {entry['step']}/{entry['planned_steps']}, {entry['checkpoint']}{val})")
    if entry["eval"]:
        print("  eval: " + ", ".join(f"{k} {v:.5f}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in entry["eval"].items()))
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    from trainer_core.resets import reset
    project = Project.open(args.project)
    removed = reset(project, args.what)
    for path in removed:
        print(f"removed {path}")
    print(f"reset {args.what}: {len(removed)} item(s) removed")
    return 0


def cmd_packs(args: argparse.Namespace) -> int:
    for pack in PACKS.values():
        print(f"{pack.id:<20} {pack.title}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from trainer_core.inspect_file import describe_gguf
    info = describe_gguf(args.file)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(f"{info['file']}: {info['kind']} GGUF, {info['tensors']} tensors "
              f"({', '.join(f'{n} {t}' for t, n in sorted(info['dtypes'].items()))}), {info['size']:,} bytes")
        if info.get("variant"):
            print(f"  variant: {info['variant']}")
        for key, value in (info.get("config") or {}).items():
            print(f"  {key}: {value}")
        for key, value in info["kvs"].items():
            print(f"  kv {key} = {value!r}")
        for p in info["problems"]:
            print(f"  PROBLEM{'' if p['fatal'] else ' (runs, but not what gguf-trainer writes)'}: {p['message']}")
        if not info["problems"]:
            print("  layout: OK")
    return 1 if info["problems"] else 0


def cmd_infer(args: argparse.Namespace) -> int:
    from trainer_core.base.errors import UsageError
    from trainer_core.contract.gguf_io import read_adapter_gguf
    from trainer_core.infer import compare_rows, read_ids, read_rows, run_adapter, save_rows
    from trainer_core.contract.losses import health_verdict

    adapter = read_adapter_gguf(args.adapter)
    c = adapter.config
    prompt_mode = [args.student, args.tokenizer, args.pack, args.prompt]
    given = sum(x is not None for x in prompt_mode)
    if not ((args.hidden is not None and given == 0) or (args.hidden is None and given == 4)):
        raise UsageError("Give the student states with --hidden FILE, or --student, --tokenizer, --pack and "
                         "--prompt to compute them (one of the two).")
    if args.hidden is not None:
        hidden = read_rows(args.hidden, c.in_dim, "--hidden")
    else:
        from trainer_core.packs import get_pack
        from trainer_core.contract.student import load_student
        pack = get_pack(args.pack)
        student = load_student(args.student, args.tokenizer)
        if student.hidden_size != c.in_dim:
            raise UsageError(f"the student's hidden size is {student.hidden_size} but the adapter reads "
                             f"{c.in_dim}-wide states; pass the student it was trained against.")
        states, _ = student.encode([pack.format_prompt(args.prompt)])
        hidden = states[0].numpy()
    if args.vis and not c.vis_dim:
        raise UsageError(f"--vis is only for adapters with a vision input; this one is a {c.kind}.")
    t5_ids = read_ids(args.t5_ids) if args.t5_ids else None
    vis = read_rows(args.vis, c.vis_dim, "--vis") if args.vis else None
    rows = run_adapter(adapter, hidden, t5_ids, vis)
    result: dict[str, Any] = {"adapter": str(adapter.path), "variant": c.kind, "input_rows": int(hidden.shape[0]),
                              "output_shape": list(rows.shape)}
    if args.out:
        save_rows(args.out, rows)
        result["out"] = args.out
    if args.compare:
        cmp = compare_rows(rows, read_rows(args.compare, c.out_dim, "--compare"))
        result.update(compare=args.compare, rows_compared=cmp.rows, first_row=cmp.first_row, cos=cmp.cos,
                      cos_centered=cmp.cos_centered, rel_mse=cmp.rel_mse, verdict=health_verdict(cmp.cos_centered))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['variant']} adapter: {result['input_rows']} student rows -> output "
          f"{result['output_shape'][0]} x {result['output_shape'][1]}")
    if args.out:
        print(f"wrote {args.out}")
    if args.compare:
        print(f"against {args.compare} ({cmp.rows} rows from row {cmp.first_row}): cos {cmp.cos:.6f}  "
              f"centred cos {cmp.cos_centered:.6f}  rel_mse {cmp.rel_mse:.6g}")
        print(result["verdict"])
    return 0


COMMANDS = {"serve": cmd_serve, "new": cmd_new, "run": cmd_run, "start": cmd_start, "stop": cmd_stop,
            "kill": cmd_kill, "status": cmd_status, "set": cmd_set, "packs": cmd_packs,
            "inspect": cmd_inspect, "infer": cmd_infer, "demo": cmd_demo, "snapshot": cmd_snapshot,
            "reset": cmd_reset, "download": cmd_download}


if __name__ == "__main__":
    sys.exit(main())
