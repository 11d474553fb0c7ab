"""The `gguf-trainer` commands on materials and files: download, snapshot, inspect, infer, reset, and the check
of every path argument (the parser and the project commands are in cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainer_core.base.errors import first_line, TrainerError, UsageError
from trainer_core.project import Project
from trainer_core.term_progress import TerminalBars, progress_line

__all__ = ["cmd_download", "cmd_snapshot", "cmd_inspect", "cmd_infer", "cmd_reset",
           "check_path_arguments"]

HUB_PROBE_S = 3.0          # how long `download` waits for the Hub's first answer before saying it cannot be reached


def cmd_download(args: argparse.Namespace) -> int:
    """Link copies found on disk, then download what is still missing, in the foreground (refused,
    before any Hub request, for the offline demo)."""
    from trainer_core.materials import (DEMO_OFFLINE, DownloadError, adopt_existing, download, is_demo, list_files,
                                        material_lock, material_status, token_for, wanted)
    from trainer_core.base.diskspace import ensure_writable
    from trainer_core.hub import OFFLINE_MODE, endpoint, hub_unreachable
    from trainer_core.cli_student import cmd_student, wants_student
    from trainer_core.student_hub import STUDENT_ID
    if wants_student(args):
        return cmd_student(args)
    project = Project.open(args.project)
    if is_demo(project):
        raise UsageError(DEMO_OFFLINE)
    ensure_writable(project.materials_dir)          # before any Hub request: a read-only project says so
    for material_id, path in adopt_existing(project):
        print(f"{material_id}: found and linked {path}")
    project = Project.open(args.project)
    ids = set(args.id or [])
    unknown = ids - {m.id for m in project.pack.project_materials(project)}
    if unknown:
        raise TrainerError(f"{', '.join(sorted(unknown))}: no such material in {project.pack.id}; "
                           f"choose from {', '.join(m.id for m in project.pack.project_materials(project))}.")
    failed, offline = 0, []
    chosen = [m for m in project.pack.project_materials(project)
              if not ((ids and m.id not in ids) or (not ids and not wanted(project, m))
                      or (args.required_only and not m.required))]
    # one probe without retries before any listing: offline, each listing would retry for ~23 s before failing
    unreachable = hub_unreachable(HUB_PROBE_S) if any(m.kind == "hf_snapshot" for m in chosen) else None
    for m in chosen:
        if unreachable and m.kind == "hf_snapshot":
            offline.append(m.id)
            continue
        if m.kind == "local_file":
            st = material_status(project, m)
            link = f"gguf-trainer set --project {project.root} --set materials.{m.id}.path=FILE"
            how = f" ({link})"
            if m.id == STUDENT_ID:          # the student has no fixed repo: the search finds it
                how = (f". Find it on the Hub: gguf-trainer download --project {project.root} --find-student; "
                       f"or link yours: {link}")
            print(f"{m.id}: {st.status}" + ("" if st.status == "ready" else f" — {m.hint or 'pick the file'}{how}"))
            continue
        try:
            listing = list_files(m, token_for(project))
        except Exception as e:      # noqa: BLE001 — offline, refused, unknown repo: say which
            first = first_line(e)
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
            bars = TerminalBars(sys.stderr)
            try:
                print(f"{m.id}: downloading {m.repo} ({m.size_hint or 'size from the Hub'})", flush=True)
                download(project, m, progress_line(m.id, bars))
                bars.close(m.id)
                print(f"{m.id}: ready")
            except DownloadError as e:
                bars.close(m.id)
                print(f"{m.id}: {e}", file=sys.stderr)
                failed += 1
            except KeyboardInterrupt:
                bars.close(m.id)
                print(f"{m.id}: interrupted; run the same command again to continue where it stopped",
                      file=sys.stderr)
                return 130
    if offline:
        why = ("HF_HUB_OFFLINE is set" if unreachable == OFFLINE_MODE
               else f"the Hugging Face Hub ({endpoint()}) cannot be reached: {unreachable}")
        print(f"Nothing was downloaded for {', '.join(offline)}: {why}; connect to the network (or point HF_ENDPOINT "
              f"at a mirror{', unset HF_HUB_OFFLINE' if unreachable == OFFLINE_MODE else ''}) and run the command "
              f"again.", file=sys.stderr)
    return 1 if failed or offline else 0


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


def _infer_project(args: argparse.Namespace) -> Any:
    """With --project: the project opened, and the adapter (its export), student, tokenizer and pack it names filled
    into `args` where they are not given; None without."""
    from trainer_core.base.errors import UsageError
    from trainer_core.packs.lookup import require_material
    from trainer_core.project import Project
    if args.project is None:
        return None
    project = Project.open(args.project)
    if args.adapter is None:
        gguf = project.gguf_path()
        if not gguf.is_file():
            raise UsageError(f"The project {project.root} has no export yet ({gguf} does not exist): run it (or "
                             f"`gguf-trainer start --project {project.root} --only export eval --force`), or pass "
                             "--adapter.")
        args.adapter = str(gguf)
    if args.prompt is not None and args.hidden is None:
        args.student = args.student or str(require_material(project, "student"))
        args.tokenizer = args.tokenizer or str(require_material(project, "student_tokenizer"))
        args.pack = args.pack or project.pack.id
    return project


def cmd_infer(args: argparse.Namespace) -> int:
    from trainer_core.base.errors import UsageError
    from trainer_core.contract.gguf_io import read_adapter_gguf
    from trainer_core.infer import compare_rows, parse_vis_pos, read_ids, read_rows, run_adapter, save_rows
    from trainer_core.contract.losses import health_verdict
    from trainer_core.packs import get_pack

    project = _infer_project(args)
    if args.adapter is None:
        raise UsageError("Name the adapter with --adapter A.gguf, or the project whose export to run with --project "
                         "DIR.")
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
        from trainer_core.contract.student import load_student
        pack = get_pack(args.pack)
        student = load_student(args.student, args.tokenizer)
        if student.hidden_size != c.in_dim:
            raise UsageError(f"the student's hidden size is {student.hidden_size} but the adapter reads "
                             f"{c.in_dim}-wide states; pass the student it was trained against.")
        hidden = pack.student_states(student, args.prompt)          # as the engine assembles and runs it
    vis_width = c.spec.vision_width(c)
    if args.vis and not vis_width:
        raise UsageError(f"--vis is only for adapters with a vision input; this one is a {c.kind}.")
    t5_ids = read_ids(args.t5_ids) if args.t5_ids else None
    seed_ids = read_ids(args.seed_ids, "--seed-ids") if args.seed_ids else None
    vis_pos = parse_vis_pos(args.vis_pos) if args.vis_pos else None
    vis = read_rows(args.vis, vis_width, "--vis") if args.vis else None
    if args.prompt is not None:      # what the engine derives from the prompt besides the student's rows
        derived = get_pack(args.pack).prompt_inputs(project, Path(args.adapter), args.prompt, vis)
        seed_ids = seed_ids if seed_ids is not None else derived.get("--seed-ids")
        t5_ids = t5_ids if t5_ids is not None else derived.get("--t5-ids")
        if vis is not None and vis_pos is None:
            vis_pos = derived.get("--vis-pos")
    rows = run_adapter(adapter, hidden, t5_ids, vis, seed_ids=seed_ids, vis_pos=vis_pos, bank=args.bank,
                       empty_prompt=args.prompt == "")
    result: dict[str, Any] = {"adapter": str(adapter.path), "variant": c.kind, "input_rows": int(hidden.shape[0]),
                              "output_shape": list(rows.shape)}
    if c.spec.head_label(args.bank) is not None:
        result["head"] = c.spec.head_label(args.bank)
    if args.out:
        save_rows(args.out, rows)
        result["out"] = args.out
    if args.compare:
        cmp = compare_rows(rows, read_rows(args.compare, rows.shape[1], "--compare"))
        result.update(compare=args.compare, rows_compared=cmp.rows, first_row=cmp.first_row, cos=cmp.cos,
                      cos_centered=cmp.cos_centered, rel_mse=cmp.rel_mse, verdict=health_verdict(cmp.cos_centered))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    head = f" ({result['head']})" if "head" in result else ""
    print(f"{result['variant']} adapter: {result['input_rows']} student rows -> output{head} "
          f"{result['output_shape'][0]} x {result['output_shape'][1]}")
    if args.out:
        print(f"wrote {args.out}")
    if args.compare:
        print(f"against {args.compare} ({cmp.rows} rows from row {cmp.first_row}): cos {cmp.cos:.6f}  "
              f"centred cos {cmp.cos_centered:.6f}  rel_mse {cmp.rel_mse:.6g}")
        print(result["verdict"])
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """The pre-flight plan (trainer_core/plan/): per stage seconds, disk, peak RAM, and warnings."""
    from trainer_core.base.diskspace import human
    from trainer_core.plan import calibrate, make_plan
    project = Project.open(args.project)
    if args.calibrate:
        calibrate(project, say=lambda m: print(m, file=sys.stderr, flush=True))
    plan = make_plan(project)
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0

    def fmt_s(v: float | None) -> str:
        return "?" if v is None else f"{v / 3600:.1f} h" if v >= 3600 else f"{v / 60:.1f} min" if v >= 120 \
            else f"{v:.0f} s"
    how = "calibrated" if plan["calibrated"] else "not calibrated: gguf-trainer plan --calibrate measures this machine"
    print(f"plan for {project.root} ({how})")
    for name, st in plan["stages"].items():
        ram = human(st["peak_ram_bytes"]) if st["peak_ram_bytes"] else "?"
        print(f"  {name:<17} {fmt_s(st['seconds']):>9}  disk {human(st['disk_bytes']):>9}  peak RAM {ram:>9}")
    print(f"  {'total':<17} {fmt_s(plan['total_seconds']):>9}  disk {human(plan['total_disk_bytes']):>9}  "
          f"peak RAM {human(plan['peak_ram_bytes']) if plan['peak_ram_bytes'] else '?':>9}")
    print(f"  placement: {plan['placement']}")
    print(f"  source: {next(iter(plan['stages'].values()))['source']}")
    for w in plan["warnings"]:
        print(f"  WARNING: {w}")
    return 0


# the arguments that name a file or a folder, and how the command line spells them
PATH_ARGUMENTS = {"project": "--project", "projects_root": "--projects-root", "allow_dir": "--allow-dir",
                  "file": "FILE", "adapter": "--adapter", "hidden": "--hidden", "student": "--student",
                  "tokenizer": "--tokenizer", "vis": "--vis", "seed_ids": "--seed-ids", "t5_ids": "--t5-ids",
                  "out": "--out", "compare": "--compare"}


def check_path_arguments(args: argparse.Namespace) -> None:
    """A path the filesystem cannot hold (a name or the whole path too long) is one sentence, exit 2, before the
    command touches anything."""
    import os

    from trainer_core.base.diskspace import path_too_long
    for attr, flag in PATH_ARGUMENTS.items():
        values = getattr(args, attr, None)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str) and value:
                problem = path_too_long(flag, Path(os.path.abspath(os.path.expanduser(value))))
                if problem:
                    raise UsageError(problem[0].upper() + problem[1:] + ".")


def cmd_reset(args: argparse.Namespace) -> int:
    from trainer_core.resets import reset
    project = Project.open(args.project)
    removed = reset(project, args.what)
    for path in removed:
        print(f"removed {path}")
    print(f"reset {args.what}: {len(removed)} item(s) removed")
    return 0
