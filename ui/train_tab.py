"""Train: run control, the stage strip, the live chart and metrics, planned steps, snapshots,
resets, and live readings of the machine and the pipeline process.

The tick (`train_tick`) copies the Supervisor's view of the project; it reads no file and
starts no process, and it sends the chart only when the series changed."""
from __future__ import annotations

import html
import math
from typing import Any

import gradio as gr
import pandas as pd

from trainer_core.base.errors import TrainerError
from trainer_core.contract import checkpoints
from trainer_core.base.parsers import parse_count
from trainer_core.project import Project
from trainer_core.resets import RESETS, planned_deletions, reset
from trainer_core.runner import runtime_status
from trainer_core.snapshot import start_job
from trainer_core.supervisor import CHART_SERIES

from ui.action_banner import RUN, SNAPSHOT, follow_up, watch
from ui.common import banner, fmt_duration, fmt_num, stage_strip_html
from ui.context import Ctx

__all__ = ["build", "train_tick", "apply_steps", "stop_run", "request_snapshot", "preview_reset", "confirm_reset",
           "cancel_reset", "chart_frame", "chart_x_lim", "metrics_html", "hardware_html", "trainer_planned",
           "trainer_step", "steps_note", "SNAPSHOT_EVAL_DEFAULT"]

# "Also evaluate" of a snapshot export, on the Train and the Output tab alike: off, as the CLI's
# `snapshot` (without --eval); evaluating while training runs takes the CPU from the trainer's data feed
SNAPSHOT_EVAL_DEFAULT = False

CHART_END_MARGIN = 0.03         # of the axis: the room past its round end step (chart_x_lim; no tick lands there)
# Every frame the chart gets begins with one row per series that has no value (Vega draws nothing for it), at a
# step left of the axis (where Gradio's thinning of a long frame never lets it stand in for a point). Gradio
# 6.31's plot takes its colour scale's domain from the series in the value it builds its Vega view with, and a
# new value only swaps the view's data: a series it was not built with is drawn with no stroke, invisible,
# until the next rebuild (a changed x_lim). The first points after an empty chart, a page opened on a finished
# run, the first val_cos: all were blank lines. With every series in every value the domain is always whole,
# and each series keeps its colour. Typed columns: a numeric "series" would give the chart a numeric colour scale.
SERIES_ROWS = pd.DataFrame({"step": pd.Series([-1] * len(CHART_SERIES), dtype="int64"),
                            "value": pd.Series([math.nan] * len(CHART_SERIES), dtype="float64"),
                            "series": pd.Series(CHART_SERIES, dtype="str")})
EMPTY_CHART = SERIES_ROWS


# ------------------------------------------------------------ rendering a view snapshot

def chart_frame(snap: dict[str, Any]) -> pd.DataFrame:
    """The chart's value: SERIES_ROWS, then the points."""
    if not snap["chart"]:
        return EMPTY_CHART
    return pd.concat([SERIES_ROWS, pd.DataFrame(snap["chart"])], ignore_index=True)


def chart_x_lim(frame: pd.DataFrame) -> list[float] | None:
    """The chart's step axis: from 0 to a little past a round step at or after the last one. Vega draws a label
    that sits on the axis's end flush inside it, against its neighbour ("195200" on a 200-step run); with the end
    CHART_END_MARGIN past a round step no tick sits on it (an explicit domain is not "niced" to one). Round: a
    multiple of half the last step's power of ten, so the axis changes a few times per decade of steps, not on
    every point. None without points (SERIES_ROWS are none)."""
    steps = frame.loc[frame["value"].notna(), "step"]
    if steps.empty:
        return None
    last = float(steps.max())
    unit = max(1.0, 10 ** math.floor(math.log10(max(last, 1.0))) / 2)
    return [0.0, math.ceil(last / unit) * unit * (1 + CHART_END_MARGIN)]


def chart_update(snap: dict[str, Any], seen: int, axis: list[float] | None) -> tuple[Any, int, Any]:
    """(the chart's update, the series version the page has then, the step axis it has then). A changed step
    axis goes out alone, before the points that need it: Gradio 6.31's plot rebuilds its Vega view when its
    x_lim changes (emptying and redrawing its element within one task, which no frame shows), and the points
    follow as a data swap on the rebuilt view."""
    if snap["chart_version"] == seen:
        return gr.skip(), seen, axis
    frame = chart_frame(snap)
    wanted = chart_x_lim(frame)
    if wanted != axis:
        return gr.update(x_lim=wanted), seen, wanted
    return frame, snap["chart_version"], axis


def metrics_html(snap: dict[str, Any]) -> str:
    p, v = snap.get("last_train") or {}, snap.get("last_val") or {}
    report = snap.get("report") or {}
    running = report.get("status") == "running"
    # the trainer's own figures once it has reported them in this train stage (trainer_step); before that (a run
    # just started, or none running) the step that counts is the checkpoint's, of the saved count
    step, planned = trainer_step(snap), trainer_planned(snap)
    if step is None or planned is None:
        last = (report.get("checkpoints") or {}).get("last") or {}
        step, planned = last.get("step", p.get("step", "–")), report.get("planned_steps", "–")
    cells = [("step", f"{step} / {planned}"),
             ("loss", fmt_num(p.get("loss"))), ("rel_mse", fmt_num(p.get("rel_mse"))), ("cos", fmt_num(p.get("cos"))),
             ("val cos", fmt_num(v.get("val_cos"))), ("best val cos", fmt_num(v.get("best_val_cos"))),
             ("lr", f"{p['lr']:.2e}" if isinstance(p.get("lr"), float) else "–"),
             ("prompts/s", fmt_num(p.get("samples_per_s"), 1))]
    if running:
        cells.append(("ETA", fmt_duration(p.get("eta_s")) if _live_point(snap) else "–"))
    ck = report.get("checkpoints") or {}
    note = "checkpoints: last + best" if ck.get("last") else "no checkpoints yet"
    return ('<div class="gt-metrics" style="display:flex;gap:14px;flex-wrap:wrap">'
            + "".join(f'<div><div style="font-size:0.8em;color:#6b7280">{k}</div>'
                      f'<div data-metric="{k}">{html.escape(str(val))}</div></div>'
                      for k, val in cells) + f'</div><div style="font-size:0.85em;color:#6b7280">{note}</div>')


def hardware_html(snap: dict[str, Any]) -> str:
    # the pipeline's process only while the run goes on (the Supervisor reads it every few seconds: a reading
    # taken just before a stop would stand beside "stopped")
    running = (snap.get("report") or {}).get("status") == "running"
    m, proc = snap.get("machine") or {}, snap.get("process") if running else None
    if not m:
        return ""
    parts = [f"CPU {m.get('cpu_threads')} threads, {fmt_num(m.get('cpu_pct'), 0)}%",
             f"RAM {m.get('ram_used_gib')}/{m.get('ram_total_gib')} GiB"]
    for g in m.get("gpus") or []:
        parts.append(f"GPU{g['index']} {html.escape(str(g['name']))}: {g['vram_used_mib']}/{g['vram_total_mib']} MiB, "
                     f"{g['util_pct']}%, {g['temp_c']}°C · {g['power_w']} W")
    if m.get("gpus") is None:
        parts.append("GPU: none detected (nvidia-smi not found)")
    if m.get("disk_free_gib") is not None:
        parts.append(f"disk free {m['disk_free_gib']} GiB")
    if proc:
        cpu = "measuring…" if proc["cpu_pct"] is None else f"{proc['cpu_pct']}%"
        parts.append(f"pipeline pid {proc['pid']}: CPU {cpu}, RSS {proc['rss_gib']} GiB, {proc['threads']} threads")
    return '<div class="gt-hw" style="font-size:0.9em">' + " · ".join(parts) + "</div>"


def _status_line(snap: dict[str, Any]) -> str:
    report = snap.get("report") or {}
    status = report.get("status", "–")
    text = f"**{html.escape(str(report.get('name', '')))}** · status **{status}**"
    if report.get("stage") and status == "running":
        text += f" · stage {report['stage']}"
    job = report.get("snapshot_job") or {}
    if job.get("status") == "running":
        text += f" · snapshot export: {job.get('phase', 'running')}"
    elif job.get("status") == "failed":
        text += f" · last snapshot export failed: {job.get('error')}"
    if report.get("error") and status == "failed":
        text += f"\n\nLast error: {report['error']} (see Logs)"
    return text


def _train_stage(snap: dict[str, Any]) -> dict[str, Any] | None:
    """The train stage's live entry while the trainer runs (None otherwise): state.json's, which the driver
    writes afresh when the stage starts, so all it holds is this stage's. A stage that is not "running" there is
    not live, even in a running pipeline's report (a new driver's, before it has written state.json)."""
    report = snap.get("report") or {}
    if report.get("status") != "running" or report.get("stage") != "train":
        return None
    stage = next((s for s in report.get("stages") or [] if s.get("name") == "train"), {})
    return stage if stage.get("status") == "running" else None


def _live_point(snap: dict[str, Any]) -> dict[str, Any]:
    """The trainer's last logged point when this train stage logged it; {} when no trainer runs or the point
    was logged before the stage started (an earlier run's: its step and count are not the live trainer's)."""
    stage, point = _train_stage(snap), snap.get("last_train") or {}
    if stage is None:
        return {}
    started, at = stage.get("started"), point.get("time")
    if isinstance(at, (int, float)) and isinstance(started, (int, float)) and at < started:
        return {}
    return point


def _counts(*values: Any) -> list[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def trainer_planned(snap: dict[str, Any]) -> int | None:
    """The step count the running trainer uses now: its latest status or metric event in this stage (which
    state.json keeps; the trainer reports a changed train.steps as soon as it reads it), else its last point
    logged in this stage. None when no trainer runs or it has not said yet."""
    found = _counts((_train_stage(snap) or {}).get("planned_steps"), _live_point(snap).get("planned_steps"))
    return found[0] if found else None


def trainer_step(snap: dict[str, Any]) -> int | None:
    """The running trainer's step as it has reported it in this stage (where it resumed, its progress, its last
    logged point); None when no trainer runs or it has not said yet."""
    stage = _train_stage(snap) or {}
    steps = _counts(stage.get("step"), stage.get("count"), stage.get("resumed_at"), _live_point(snap).get("step"))
    return max(steps) if steps else None


def steps_note(snap: dict[str, Any]) -> str:
    """The note beside Planned steps, from the live view on every tick. While the trainer runs it
    says only that a saved count is not in force yet, and goes once the trainer has it (a count at or
    below the trainer's step is in force once the trainer stops at its step)."""
    report = snap.get("report") or {}
    planned = report.get("planned_steps")
    live = trainer_planned(snap)
    if _train_stage(snap) is not None:
        step = trainer_step(snap)
        caught_up = live == planned or (None not in (live, step, planned) and planned <= step and live <= step)
        if live is None or caught_up:
            return ""
        at = f" at step {step}" if step is not None else ""
        return f"saved {planned}, trainer still on {live}{at} — it picks up the new count at its next log interval"
    last = (report.get("checkpoints") or {}).get("last") or {}
    step = last.get("step")
    if step is not None and planned is not None and step >= planned:
        return f"checkpoint at step {step} — raise the count and press Start / Resume to train further"
    if step is not None:
        return f"checkpoint at step {step} of {planned}"
    return ""


# ------------------------------------------------------------ handlers

def train_tick(ctx: Ctx, project_path: str | None, seen_chart: int, shown: str | None = "",
               axis: list[float] | None = None) -> tuple:
    """The tab's view of the project; then the banner: `shown` (the banner on the page) gives way to its action's
    outcome once that action has ended (ui/action_banner.py), else it is left alone; last the chart's step axis
    the page has (`axis`, see chart_update)."""
    view = ctx.supervisor.view(project_path)
    if view is None:          # nothing to start (Planned steps: load_steps)
        return ("No project open", "", gr.skip(), "", "", "", gr.skip(), seen_chart,
                gr.update(visible=True, interactive=False), gr.update(visible=False), gr.skip(), axis)
    snap = view.snapshot()
    chart, seen_chart, axis = chart_update(snap, seen_chart, axis)
    report = snap.get("report") or {}
    running = report.get("status") == "running"
    outcome = follow_up(shown, report)
    return (_status_line(snap), stage_strip_html(report, snap["progress"]), chart,
            metrics_html(snap), hardware_html(snap), steps_note(snap),
            gr.skip(), seen_chart, gr.update(visible=not running, interactive=True), gr.update(visible=running),
            gr.skip() if outcome is None else outcome, axis)


def apply_steps(ctx: Ctx, project_path: str | None, value: Any) -> tuple[str, Any]:
    """Set train.steps; the note says what happens next."""
    if not project_path:
        return banner("Open or create a project first."), gr.update()
    try:
        steps = parse_count(value)                 # 12000, 12k, 1.5k, 12,000: as the CLI's --steps reads them
    except ValueError:
        return banner(f"Planned steps must be a positive whole number such as 12000 or 12k, got “{value}”."), \
            gr.update()
    try:
        project = Project.open(project_path)
        before, after = project.update_settings([f"train.steps={steps}"])
    except TrainerError as e:
        return banner(str(e)), gr.update()
    ctx.supervisor.poke(project.root)
    last = checkpoints.read_sidecar(project, checkpoints.LAST)
    step = last.trained_steps if last else None
    running = runtime_status(project)["status"] == "running"
    if before.train.steps == after.train.steps:
        note = f"train.steps is already {steps}."
    elif running and step is not None and steps <= step:
        note = f"Saved {steps}: training finishes at the next log interval, then export and evaluation follow."
    elif running:
        note = f"Saved {steps}: the running trainer continues to step {steps}."
    elif step is not None and steps > step:
        note = f"Saved {steps}: press Start / Resume to continue from step {step}."
    elif step is not None:
        note = f"Saved {steps}: the checkpoint at step {step} already covers it."
    else:
        note = f"Saved {steps}."
    return banner(note, "ok"), gr.update(value=str(steps))


def stop_run(ctx: Ctx, project_path: str | None) -> str:
    if not project_path:
        return banner("Open or create a project first.")
    try:
        ctx.supervisor.stop_run(project_path)
    except TrainerError as e:
        return banner(str(e))
    return banner("Stop requested — the pipeline saves its checkpoint / finishes the current shard and exits.",
                  "notice", wait=RUN)


def request_snapshot(ctx: Ctx, project_path: str | None, checkpoint: str, evaluate: bool) -> str:
    if not project_path:
        return banner("Open or create a project first.")
    try:
        project = Project.open(project_path)
        running = runtime_status(project)["status"] == "running"
        if not running and not checkpoints.exists(project, checkpoints.LAST):
            return banner("There is no checkpoint to export yet; start training first.")
        checkpoint = checkpoint or "last"
        pid = start_job(project, checkpoint, bool(evaluate), fresh=running and checkpoint == "last")
    except TrainerError as e:
        return banner(str(e))
    ctx.supervisor.poke(project_path)
    return banner(f"Snapshot export started (pid {pid}); the GGUF appears on the Output tab.", "ok",
                  wait=SNAPSHOT, pid=pid)


def preview_reset(project_path: str | None, what: str) -> tuple[str, Any]:
    """(the list of what goes, the confirmation row: Delete these / Cancel)."""
    if not project_path or not what:
        return "", gr.update(visible=False)
    try:
        paths = planned_deletions(Project.open(project_path), what)
    except TrainerError as e:
        return banner(str(e)), gr.update(visible=False)
    if not paths:
        return banner(f"Reset {what}: nothing to delete.", "notice"), gr.update(visible=what == "state")
    items = "".join(f"<li><code>{html.escape(str(p))}</code></li>" for p in paths)
    return (f'<div class="gt-reset">Reset <b>{what}</b> deletes:<ul>{items}</ul></div>', gr.update(visible=True))


def confirm_reset(ctx: Ctx, project_path: str | None, what: str) -> tuple[str, Any]:
    if not project_path or not what:
        return "", gr.update(visible=False)
    try:
        removed = reset(Project.open(project_path), what)
    except TrainerError as e:
        return banner(str(e)), gr.update(visible=False)
    ctx.supervisor.poke(project_path)
    return banner(f"Reset {what}: deleted {len(removed)} item(s).", "ok"), gr.update(visible=False)


def cancel_reset() -> tuple[str, Any, Any]:
    """Cancel: nothing is deleted; the list and the confirmation go, the choice is cleared."""
    return "", gr.update(visible=False), gr.update(value=None)


# ------------------------------------------------------------ layout

def build(ctx: Ctx, project_state: gr.State, top_banner: gr.HTML, timer: gr.Timer) -> dict[str, Any]:
    status = gr.Markdown("No project open", elem_id="train-status")
    with gr.Row():
        # usable once a project is open (the tick, load_steps): with none there is nothing to start
        start_btn = gr.Button("Start / Resume", variant="primary", interactive=False, elem_id="train-start")
        anyway_btn = gr.Button("Start anyway", variant="secondary", visible=False, elem_id="train-start-anyway")
        stop_btn = gr.Button("Stop", variant="stop", visible=False, elem_id="train-stop")
        snap_ck = gr.Dropdown([("latest step", "last"), ("best validation", "best")], value="last",
                              label="Snapshot of", scale=1)
        snap_eval = gr.Checkbox(label="Also evaluate (on the CPU while training runs)", value=SNAPSHOT_EVAL_DEFAULT,
                                elem_id="train-snap-eval")
        snap_btn = gr.Button("Export snapshot", elem_id="snapshot-btn")
    strip = gr.HTML("", elem_id="stage-strip")
    chart = gr.LinePlot(EMPTY_CHART, x="step", y="value", color="series", title="loss / cos / val cos",
                        height=300, elem_id="train-chart")
    metrics = gr.HTML("", elem_id="train-metrics")
    # shown once a project is open (load_steps): Gradio draws an empty Number as a 0, below its minimum of 1
    with gr.Row(visible=False, elem_id="planned-steps-row") as steps_row:
        steps_box = gr.Textbox(None, label="Planned steps", placeholder="e.g. 20000 or 20k", max_lines=1, scale=2,
                               elem_id="planned-steps")
        apply_btn = gr.Button("Apply", scale=1, elem_id="apply-steps")
        steps_note = gr.Markdown("", elem_id="steps-note")
    with gr.Accordion("Reset…", open=False):
        with gr.Row():
            reset_what = gr.Dropdown(list(RESETS), label="What", value=None, elem_id="reset-what")
            with gr.Row(visible=False, elem_id="reset-confirm-row") as reset_row:
                reset_confirm = gr.Button("Delete these", variant="stop", elem_id="reset-confirm")
                reset_cancel = gr.Button("Cancel", elem_id="reset-cancel")
        reset_list = gr.HTML("")
    hardware = gr.HTML("", elem_id="live-hardware")
    seen_chart, axis = gr.State(-1), gr.State(None)      # the series version and the step axis the page has
    shown = watch(top_banner)        # the banner on the page, for the tick to follow its action

    timer.tick(lambda p, s, b, a: train_tick(ctx, p, s, b, a), [project_state, seen_chart, shown, axis],
               [status, strip, chart, metrics, hardware, steps_note, steps_box, seen_chart, start_btn, stop_btn,
                top_banner, axis], queue=False, show_progress="hidden", api_name="train_tick")
    start_btn.click(_start(ctx), [project_state], [top_banner, anyway_btn], api_name="start_resume")
    anyway_btn.click(_start(ctx, anyway=True), [project_state], [top_banner, anyway_btn], api_name="start_anyway")
    stop_btn.click(lambda p: stop_run(ctx, p), [project_state], [top_banner], api_name="stop")
    apply_btn.click(lambda p, v: apply_steps(ctx, p, v), [project_state, steps_box], [top_banner, steps_box],
                    api_name="apply_steps")
    steps_box.submit(lambda p, v: apply_steps(ctx, p, v), [project_state, steps_box], [top_banner, steps_box],
                     api_name=False)
    snap_btn.click(lambda p, c, e: request_snapshot(ctx, p, c, e), [project_state, snap_ck, snap_eval], [top_banner],
                   api_name="snapshot")
    reset_what.change(preview_reset, [project_state, reset_what], [reset_list, reset_row], api_name=False)
    reset_confirm.click(lambda p, w: confirm_reset(ctx, p, w), [project_state, reset_what], [reset_list, reset_row],
                        api_name="reset", api_visibility="private")
    reset_cancel.click(cancel_reset, [], [reset_list, reset_row, reset_what], api_name=False)
    return {"steps_box": steps_box, "steps_row": steps_row, "timer": timer}


def _start(ctx: Ctx, anyway: bool = False):
    """The Setup tab's Start, with its checks: missing materials and plan warnings are listed first and
    nothing launches until "Start anyway"."""
    def start(project_path: str | None) -> tuple[str, Any]:
        from ui.setup_tab import start_run
        return start_run(ctx, project_path, anyway=anyway)
    return start


def load_steps(project_path: str | None) -> tuple[Any, Any]:
    """(Planned steps, its row) for the project just opened: its train.steps, shown; with none open (or one that
    cannot be read) the row is hidden, never an empty field drawn as an invalid 0."""
    try:
        steps = Project.open(project_path).settings.train.steps if project_path else None
    except TrainerError:
        steps = None
    if steps is None:
        return gr.update(), gr.update(visible=False)
    return gr.update(value=str(steps)), gr.update(visible=True)
