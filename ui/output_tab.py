"""Output: exported files, the evaluation, snapshots with a quality-vs-steps plot, kept steps
(Export / Delete), the ggk command with Copy, and Export GGUF (regenerate from best.pt).
Everything shown comes from the Supervisor's view (its status report), read on a tick.

Below, the Publish to the Hub panel (ui/publish_panel.py).

The quality plot is a matplotlib figure (lines with a marker on every snapshot, so one snapshot
is a visible point), drawn only when the snapshots changed. The ggk command names the pack's DiT
and VAE files (`TrainerPack.ggk_model_args`) as editable defaults: two fields, kept in the page,
change the command shown and nothing else."""
from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from trainer_core.base.errors import TrainerError
from trainer_core.contract import checkpoints
from trainer_core.packs.eval_guide import DEMO_NOTE, MOCK_NOTE, NO_FIGURE, EvalGuide
from trainer_core.project import Project
from trainer_core.runner import runtime_status
from trainer_core.snapshot import job_status

from ui import publish_panel
from ui.action_banner import RUN
from ui.common import banner, fmt_num, fmt_size
from ui.context import Ctx
from ui.train_tab import SNAPSHOT_EVAL_DEFAULT, request_snapshot

__all__ = ["build", "output_tick", "export_again", "delete_kept_step", "quality_frame", "quality_figure",
           "model_files", "ggk_command_text", "model_file_defaults", "eval_markdown", "stale_note"]

FILE_COLUMNS = ["file", "size", "modified"]
SNAP_COLUMNS = ["step", "of planned", "checkpoint", "val cos", "eval", "file"]
KEPT_COLUMNS = ["step", "% of planned", "val cos", "size", "kept"]
# the quality plot's data, typed even when empty
EMPTY_QUALITY = pd.DataFrame({"step": pd.Series([], dtype="int64"), "value": pd.Series([], dtype="float64"),
                       "series": pd.Series([], dtype="str")})


def _judged_names(report: dict[str, Any]) -> list[str]:
    """The pack's metric names, the one its guide judges by first."""
    headline = (report.get("eval_guide") or {}).get("headline")
    return [*([headline] if headline else []), *(report.get("metric_names") or [])]


def _eval_key(entry: dict[str, Any], names: list[str]) -> tuple[str, float] | None:
    ev = entry.get("eval") or {}
    for key in [*names, "cos_centered", "cos_slice", "cos"]:
        if isinstance(ev.get(key), (int, float)):
            return key, ev[key]
    return None


def eval_markdown(report: dict[str, Any], guide: EvalGuide | None) -> str:
    """The evaluation panel: a mock-teacher or demo run marked as a machinery check, then the metric to judge
    by with the published figure beside the run's value, the other metrics the pack's guide names
    (packs/eval_guide.py), what good looks like and where the figures come from, then the rest of the metrics."""
    ev = report.get("eval") or None
    if not ev:
        return "no evaluation yet"
    names = [k for k in report.get("metric_names") or [] if k in ev] or \
        [k for k, v in ev.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    parts = []
    if report.get("eval_mock"):
        parts.append(f"**⚠ {MOCK_NOTE[0].upper()}{MOCK_NOTE[1:]}.** Its targets are synthetic, so these numbers "
                     f"say nothing about the adapter's quality.")
    elif report.get("eval_demo"):
        parts.append(f"**⚠ {DEMO_NOTE[0].upper()}{DEMO_NOTE[1:]}.** Tiny random models stand in for the teacher and "
                     f"the student, so these numbers say nothing about quality; the figures are a real run's.")
    if guide:
        (key, value, figure), *others = guide.rows(ev)
        beside = f"reference **{figure}**" if figure else "no figure published for it" if guide.references else \
            NO_FIGURE
        parts += [f"**Judge by `{key}`: {fmt_num(value)}** · {beside}",
                  "\n".join(f"- `{k}`: {fmt_num(v)}" + (f" · reference {f}" if f else "") for k, v, f in others),
                  f"What good looks like: {guide.good}.  \n*Reference figures: {guide.source}.*"]
    rest = [k for k in names if not guide or k not in guide.keys()]
    if rest:
        listed = "\n".join(f"- **{k}**: {fmt_num(ev[k])}" for k in rest)
        parts.append(f"**Other metrics**\n\n{listed}" if guide else listed)
    return "\n\n".join(p for p in parts if p)


def stale_note(report: dict[str, Any], stage: str) -> str:
    """A line above the GGUF (`export`) or the evaluation (`eval`) when the one on disk no longer stands: it is
    of an earlier checkpoint than the run's (status.stale_reason says which); "" when it is current."""
    entry = next((s for s in report.get("stages") or [] if s.get("name") == stage), {})
    there = report.get("eval") if stage == "eval" else \
        any(f.get("path") == report.get("export") for f in report.get("outputs") or [])
    if entry.get("status") != "stale" or not there:
        return ""
    why = f" ({entry['detail']})" if entry.get("detail") else ""
    if stage == "export":
        return (f"**⚠ The exported GGUF ({Path(report.get('export') or '').name}) is from an earlier checkpoint**"
                f"{why}. The next run exports it again once training is done; Export GGUF exports best.pt now.")
    return f"**⚠ These figures are of an earlier export**{why}; the evaluation follows the next export."


def quality_frame(report: dict[str, Any]) -> pd.DataFrame:
    """Snapshots' val cos (and their first eval metric) against their step."""
    rows = []
    for e in report.get("snapshots") or []:
        if isinstance(e.get("val_cos"), (int, float)):
            rows.append({"step": e["step"], "value": e["val_cos"], "series": "val cos"})
        picked = _eval_key(e, _judged_names(report))
        if picked:
            rows.append({"step": e["step"], "value": picked[1], "series": f"eval {picked[0]}"})
    return pd.DataFrame(rows) if rows else EMPTY_QUALITY


def quality_figure(frame: pd.DataFrame) -> Any:
    """The quality-vs-steps figure: one line per series with a marker on every snapshot (a line
    through one point draws nothing); None without snapshots."""
    if frame.empty:
        return None
    from matplotlib.figure import Figure             # not pyplot: no global figure registry
    from matplotlib.ticker import MaxNLocator
    fig = Figure(figsize=(8, 2.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for series, rows in frame.groupby("series", sort=False):
        rows = rows.sort_values("step")
        ax.plot(rows["step"], rows["value"], marker="o", markersize=7, linewidth=1.5, label=str(series))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("value")
    ax.set_title("quality vs steps")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return fig


def model_files(pack: Any) -> tuple[str, str]:
    """The DiT and VAE file names the pack's engine command names (its ggk_model_args)."""
    words = shlex.split(pack.ggk_model_args)

    def after(flag: str) -> str:
        i = words.index(flag) if flag in words else -1
        return words[i + 1] if 0 <= i < len(words) - 1 else ""
    return after("--diffusion-model"), after("--vae")


def ggk_command_text(report: dict[str, Any], pack: Any, dit: str | None = "", vae: str | None = "") -> str:
    """The engine command of the report with the DiT / VAE files the user typed (blank: the pack's),
    and the editing addition on a comment line; "" before the export exists."""
    command = report.get("ggk_command") or ""
    if not command:
        return ""
    default_dit, default_vae = model_files(pack)
    chosen = (f"--diffusion-model {shlex.quote((dit or '').strip() or default_dit)} "
              f"--vae {shlex.quote((vae or '').strip() or default_vae)}")
    command = command.replace(pack.ggk_model_args, chosen, 1)
    if report.get("ggk_edit_args"):
        command += f"\n# to edit images, add: {report['ggk_edit_args']}"
    return command


def model_file_defaults(project_path: str | None) -> tuple[Any, Any]:
    """The DiT and VAE fields for the project just opened: its pack's file names."""
    try:
        pack = Project.open(project_path).pack if project_path else None
    except TrainerError:
        pack = None
    if pack is None:
        return gr.update(), gr.update()
    dit, vae = model_files(pack)
    return gr.update(value=dit), gr.update(value=vae)


def output_tick(ctx: Ctx, project_path: str | None, seen_quality: str | None = None, dit: str | None = "",
                vae: str | None = "") -> tuple:
    """(files, output note, evaluation, snapshots, quality plot (skipped when unchanged), kept steps,
    kept-step choices, ggk command, the quality plot's key, the kept steps' Export and Delete: usable only
    with a kept step to act on)."""
    view = ctx.supervisor.view(project_path)
    if view is None:
        plot = gr.skip() if seen_quality == "" else None
        return ([], "Nothing exported yet", "no evaluation yet", [], plot, [], gr.update(choices=[]), "", "",
                *_kept_buttons(False))
    report = view.snapshot()["report"] or {}
    files = [[f["name"], fmt_size(f["size"]), time.strftime("%Y-%m-%d %H:%M", time.localtime(f["mtime"]))]
             for f in report.get("outputs") or []]
    out_note = f"Output folder: `{Path(report.get('export', '')).parent}`" if report.get("export") else ""
    out_note = "\n\n".join(n for n in (stale_note(report, "export"), out_note) if n)
    eval_md = "\n\n".join(n for n in (stale_note(report, "eval"), eval_markdown(report, view.project.pack.judge)) if n)
    snaps = [[e["step"], e.get("planned_steps"), e.get("checkpoint"), fmt_num(e.get("val_cos")),
              (lambda k: f"{k[0]} {fmt_num(k[1])}" if k else "–")(_eval_key(e, _judged_names(report))),
              Path(e.get("path", "")).name] for e in report.get("snapshots") or []]
    planned = report.get("planned_steps") or 0
    kept = report.get("kept_steps") or []
    kept_rows = [[k["step"], f"{100 * k['step'] / planned:.0f}%" if planned else "–", fmt_num(k.get("val_cos")),
                  fmt_size(k.get("size")), time.strftime("%Y-%m-%d %H:%M", time.localtime(k.get("time", 0)))]
                 for k in kept]
    choices = [(f"step {k['step']}", f"step{k['step']}") for k in kept]
    frame = quality_frame(report)
    key = "" if frame.empty else json.dumps(frame.to_dict("records"), sort_keys=True, default=str)
    plot = gr.skip() if key == seen_quality else quality_figure(frame)
    return (files, out_note, eval_md, snaps, plot, kept_rows, gr.update(choices=choices),
            ggk_command_text(report, view.project.pack, dit, vae), key, *_kept_buttons(bool(kept)))


def _kept_buttons(usable: bool) -> tuple[Any, Any]:
    """The kept steps' Export and Delete: off while the table is empty."""
    return gr.update(interactive=usable), gr.update(interactive=usable)


def command_tick(ctx: Ctx, project_path: str | None, dit: str | None, vae: str | None) -> str:
    """The ggk command at once when a file name is edited (the tick follows it)."""
    view = ctx.supervisor.view(project_path)
    return ggk_command_text(view.snapshot()["report"] or {}, view.project.pack, dit, vae) if view else ""


def export_again(ctx: Ctx, project_path: str | None) -> str:
    """Regenerate the GGUF and its evaluation from best.pt (stages export + eval, forced)."""
    if not project_path:
        return banner("Open or create a project first.")
    try:
        project = Project.open(project_path)
        if not checkpoints.exists(project, checkpoints.BEST):
            return banner("There is no best.pt yet: train first.")
        if runtime_status(project)["status"] == "running":
            return banner("The pipeline is running; export follows training on its own.")
        pid = ctx.supervisor.start_run(project.root, only=["export", "eval"], force=True)
    except TrainerError as e:
        return banner(str(e))
    return banner(f"Export and evaluation started (pid {pid}).", "ok", wait=RUN)


def delete_kept_step(ctx: Ctx, project_path: str | None, which: str | None) -> str:
    if not project_path or not which:
        return banner("Pick a kept step first.")
    try:
        project = Project.open(project_path)
        if job_status(project).get("status") == "running":
            return banner("A snapshot export is running; delete kept steps after it finishes.")
        checkpoints.delete_kept_step(project, which)
    except TrainerError as e:
        return banner(str(e))
    ctx.supervisor.poke(project_path)
    return banner(f"Deleted kept step {which[4:]}; GGUFs already exported from it stay.", "ok")


def build(ctx: Ctx, project_state: gr.State, top_banner: gr.HTML, timer: gr.Timer) -> dict[str, Any]:
    gr.Markdown("### Exported files")
    files = gr.Dataframe(headers=FILE_COLUMNS, value=[], interactive=False, elem_id="output-files", wrap=True)
    out_note = gr.Markdown("", elem_id="output-note")
    export_btn = gr.Button("Export GGUF (regenerate from best.pt)", elem_id="export-again")
    gr.Markdown("### Evaluation")
    eval_md = gr.Markdown("no evaluation yet", elem_id="eval")
    gr.Markdown("### Snapshots")
    with gr.Row():
        snap_ck = gr.Dropdown([("latest step", "last"), ("best validation", "best")], value="last", label="Snapshot of")
        snap_eval = gr.Checkbox(label="Also evaluate the GGUF on the validation shards", value=SNAPSHOT_EVAL_DEFAULT,
                                elem_id="output-snap-eval")
        snap_btn = gr.Button("Export snapshot", elem_id="output-snapshot")
    snaps = gr.Dataframe(headers=SNAP_COLUMNS, value=[], interactive=False, elem_id="snapshots", wrap=True)
    quality = gr.Plot(None, label="quality vs steps", format="png", elem_id="quality-plot")
    gr.Markdown("### Kept steps")
    kept = gr.Dataframe(headers=KEPT_COLUMNS, value=[], interactive=False, elem_id="kept-steps")
    with gr.Row():
        kept_pick = gr.Dropdown([], label="Kept step", elem_id="kept-pick")
        kept_export = gr.Button("Export", interactive=False, elem_id="kept-export")
        kept_delete = gr.Button("Delete", variant="stop", interactive=False, elem_id="kept-delete")
    gr.Markdown("### Use it in ggk")
    with gr.Row():
        dit = gr.Textbox(label="DiT file (--diffusion-model)", info="blank: the pack's file",
                         max_lines=1, elem_id="ggk-dit")
        vae = gr.Textbox(label="VAE file (--vae)", info="blank: the pack's file", max_lines=1, elem_id="ggk-vae")
    command = gr.Textbox(label="ggk command", buttons=["copy"], interactive=False, elem_id="ggk-command")
    publish_panel.build(ctx, project_state)          # ui/publish_panel.py: the export, its card and plot to the Hub
    seen_quality = gr.State(None)
    chosen = gr.State(["", ""])        # the two file names, for the tick (States are no API parameters)

    outputs = [files, out_note, eval_md, snaps, quality, kept, kept_pick, command, seen_quality, kept_export,
               kept_delete]
    timer.tick(lambda p, s, m: output_tick(ctx, p, s, *(m or ["", ""])), [project_state, seen_quality, chosen],
               outputs, queue=False, show_progress="hidden", api_name="output_tick")
    project_state.change(model_file_defaults, [project_state], [dit, vae], api_name=False)
    for box in (dit, vae):
        box.change(lambda d, v: [d, v], [dit, vae], [chosen], queue=False, api_name=False)
        box.input(lambda p, d, v: command_tick(ctx, p, d, v), [project_state, dit, vae], [command], api_name=False)
    export_btn.click(lambda p: export_again(ctx, p), [project_state], [top_banner], api_name="export_again")
    snap_btn.click(lambda p, c, e: request_snapshot(ctx, p, c, e), [project_state, snap_ck, snap_eval], [top_banner],
                   api_name=False)
    kept_export.click(lambda p, w, e: request_snapshot(ctx, p, w, e), [project_state, kept_pick, snap_eval],
                      [top_banner], api_name=False)
    kept_delete.click(lambda p, w: delete_kept_step(ctx, p, w), [project_state, kept_pick], [top_banner],
                      api_name="delete_kept_step", api_visibility="private")
    return {"files": files}
