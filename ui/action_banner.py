"""The banner of an action that goes on after its answer — "Pipeline started", "Demo started", "Stop requested",
"Export and evaluation started", "Snapshot export started" — gives way to the action's outcome once the action
has ended, instead of standing beside a run or an export that is long over.

Such a banner says what it waits for (`ui.common.banner`'s `wait` and `pid`: data attributes on its HTML). The
Train tab's tick, which sees the Supervisor's report of the open project on every tick wherever the user is,
passes the banner shown now (a State its change event keeps, `watch`) to `follow_up`: while the run or the job
goes on the banner stays; once it has ended the tick shows the outcome in its place. Any other banner (an error,
"Saved", a refusal) is never touched."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import gradio as gr

from trainer_core.base.procs import pid_alive

from ui.common import banner

__all__ = ["follow_up", "run_outcome", "snapshot_outcome", "watch", "RUN", "SNAPSHOT"]

RUN, SNAPSHOT = "run", "snapshot"          # what a banner waits for: the project's run, the snapshot job
# a job whose status the report has not shown after this long, and that is gone, died before it said anything
# (the Supervisor reads the report every 3 s when idle)
SILENT_JOB_S = 15.0
_OPENING = re.compile(r'^<div class="gt-banner[^>]*>')
_MARK = re.compile(r'data-(wait|pid|at)="([\w.]+)"')


def run_outcome(report: dict[str, Any]) -> str:
    """How the run ended, as a banner ("" when there is nothing to say)."""
    status = report.get("status")
    last = ((report.get("checkpoints") or {}).get("last") or {}).get("step")
    at = f" at step {last}" if last is not None else ""
    if status == "done":
        return banner("The run finished: every stage is done; the GGUF and its evaluation are on the Output tab.",
                      "ok")
    if status == "stopped":
        return banner(f"The run stopped{at}; press Start / Resume to continue from its checkpoint.", "notice")
    if status == "failed":
        return banner(f"The run failed: {report.get('error') or 'see Logs'} (the Logs tab has the details).")
    if status == "interrupted":
        return banner(f"The run's process ended without finishing{at} (see Logs); press Start / Resume to continue.")
    return ""


def snapshot_outcome(job: dict[str, Any]) -> str:
    if job.get("status") == "done":
        name = Path(job["path"]).name if job.get("path") else "the snapshot"
        step = f" (step {job['step']})" if job.get("step") is not None else ""
        return banner(f"Snapshot exported: {name}{step}; it is listed on the Output tab.", "ok")
    if job.get("status") == "failed":
        return banner(f"The snapshot export failed: {job.get('error') or 'see its log'}.")
    return ""


def follow_up(shown: str | None, report: dict[str, Any] | None) -> str | None:
    """The banner to show instead of `shown` now that what it waits for has ended ("" clears it); None leaves
    it as it is (not a waiting banner, or its action goes on)."""
    opening = _OPENING.match(shown or "")
    marks = dict(_MARK.findall(opening.group(0))) if opening else {}
    if "wait" not in marks or not report:
        return None
    if float(report.get("read_at", float("inf"))) < float(marks.get("at", 0)):
        return None                  # read before the action: what it shows may be the run before this one
    if marks["wait"] == RUN:
        return None if report.get("status") == "running" else run_outcome(report)
    if marks["wait"] == SNAPSHOT:
        job, pid = report.get("snapshot_job") or {}, int(marks.get("pid", 0)) or None
        if pid is not None and job.get("pid") != pid:       # the report still shows an earlier job's status
            silent = time.time() - float(marks.get("at", 0)) > SILENT_JOB_S and not pid_alive({"pid": pid})
            return "" if silent else None
        return None if job.get("status") == "running" else snapshot_outcome(job)
    return None


def watch(top_banner: gr.HTML) -> gr.State:
    """A State that holds the banner shown now, for the tick (a State is no parameter of the tick's API)."""
    shown = gr.State("")
    top_banner.change(_same, [top_banner], [shown], queue=False, show_progress="hidden", api_name=False)
    return shown


def _same(value: str | None) -> str:
    return value or ""
