"""`gguf-trainer status` for a person: the run, a table of the stages (status, progress, what is known of each), the
checkpoints, the evaluation with its judging guide, the outputs and how to use them. Times are local clock times
and durations, figures are rounded to what a person compares; `status --json` keeps the full report for machines.
Reads the report only (trainer_core/status.py)."""
from __future__ import annotations

import time
from typing import Any

from trainer_core.base.diskspace import human
from trainer_core.packs.eval_guide import EvalGuide, eval_lines

__all__ = ["status_lines", "duration", "figure"]

# the stage entry's keys the progress column and the detail column say in words; any other key is shown as "key value"
_PROGRESS = ("step", "planned_steps", "count", "total", "unit", "eta_s", "rate")
_IN_WORDS = ("started", "val_cos", "best_val_cos", "detail", "kept", "error")


def duration(seconds: float | None) -> str:
    """'45 s', '3 min 05 s', '2 h 04 min'; '–' when unknown."""
    if not isinstance(seconds, (int, float)) or seconds != seconds or seconds < 0:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def figure(value: Any, digits: int = 4) -> str:
    """A float to `digits` decimals (a cosine's 17 digits say nothing more); other values as they are."""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "–" if value is None else str(value)


def _clock(epoch: Any, now: float) -> str:
    if not isinstance(epoch, (int, float)) or isinstance(epoch, bool):
        return str(epoch)
    when = time.strftime("%H:%M:%S" if now - epoch < 86400 else "%Y-%m-%d %H:%M", time.localtime(epoch))
    return f"{when} ({duration(now - epoch)} ago)" if now >= epoch else when


def _progress(stage: dict[str, Any]) -> str:
    if isinstance(stage.get("step"), int):
        planned = stage.get("planned_steps")
        text = f"step {stage['step']}" + (f" / {planned}" if planned is not None else "")
    elif stage.get("total"):
        text = f"{stage.get('count', 0)} / {stage['total']} {stage.get('unit') or ''}".rstrip()
    else:
        return ""
    if isinstance(stage.get("rate"), (int, float)) and stage.get("status") == "running":
        text += f", {stage['rate']:.1f}/s"
    if stage.get("eta_s") is not None and stage.get("status") == "running":
        text += f", ETA {duration(stage['eta_s'])}"
    return text


def _details(stage: dict[str, Any], now: float) -> str:
    parts = []
    if "started" in stage:
        parts.append(f"started {_clock(stage['started'], now)}")
    for key in ("val_cos", "best_val_cos"):
        if key in stage:
            parts.append(f"{key.replace('_', ' ')} {figure(stage[key])}")
    parts += [str(stage[key]) for key in ("detail", "kept") if stage.get(key)]
    known = {"name", "title", "done", "status", *_PROGRESS, *_IN_WORDS}
    parts += [f"{key.replace('_', ' ')} {figure(value)}" for key, value in stage.items() if key not in known]
    if stage.get("error"):
        parts.append(f"error: {stage['error']}")
    return "; ".join(parts)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]


def status_lines(report: dict[str, Any], guide: EvalGuide | None, edit_args: str = "",
                 log_path: str = "", now: float | None = None) -> list[str]:
    """The readable status of `report` (status.status_report), one line per item; no JSON."""
    now = time.time() if now is None else now
    pid = f" (pid {report['pid']})" if report["pid"] else ""
    lines = [f"{report['project']}: {report['status']}{pid}  [{report['pack']}, {report['name']}]"]
    if report["status"] == "interrupted":
        note = f"; its stage process (pid {report['stage_pid']}) is still saving" if report["stage_pid"] else ""
        lines.append(f"  the last run stopped without finishing (a crash or a reboot){note}; "
                     f"`gguf-trainer start --project {report['project']}` resumes it")
    if report.get("start"):
        lines.append(f"  training starts from {report['start']} (when no checkpoint is left to resume)")
    rows = [["stage", "status", "progress", "details"]]
    rows += [[s["name"], s["status"], _progress(s), _details(s, now)] for s in report["stages"]]
    lines += [line.rstrip() for line in _table(rows)]
    for which in ("last", "best"):
        ck = report["checkpoints"][which]
        if isinstance(ck, dict):
            lines.append(f"  checkpoint {which}: step {ck.get('step')}, val cos {figure(ck.get('val_cos'))}")
    ev = report["eval"] or {}
    lines += [f"  eval: {line}" for line in
              (eval_lines(guide, ev, report["metric_names"], report["eval_mock"], report["eval_demo"]) if ev else [])]
    lines += [f"  output {o['name']}  {human(o['size'])}" for o in report["outputs"]]
    for entry in report["snapshots"]:
        ev = entry.get("eval") or {}
        key = next((k for k in (guide.headline if guide else "", "cos_centered", "cos_slice", "cos") if k in ev), None)
        shown = f", eval {key} {figure(ev[key])}" if key else ""
        lines.append(f"  snapshot step {entry['step']} / {entry['planned_steps']} ({entry['checkpoint']}), "
                     f"val cos {figure(entry['val_cos'])}{shown}: {entry['path']}")
    plan = [row for row in report["plan"] if row["actual_seconds"] is not None and row["planned_seconds"] is not None]
    if plan:
        lines.append("  planned vs actual: " + ", ".join(
            f"{row['stage']} {duration(row['planned_seconds'])} / {duration(row['actual_seconds'])}" for row in plan))
    job = report["snapshot_job"]
    if job.get("status") in ("running", "failed"):
        what = job.get("phase") if job["status"] == "running" else job.get("error")
        lines.append(f"  snapshot job: {job['status']} — {what}")
    if report["ggk_command"]:
        lines.append(f"  use it: {report['ggk_command']}")
        if edit_args:
            lines.append(f"  to edit images, add: {edit_args}")
    if report["error"] and report["status"] == "failed":
        lines.append(f"  last error: {report['error']} (see {log_path})")
    return lines
