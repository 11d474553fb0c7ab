"""Logs: the pipeline log, following. The Supervisor keeps the last 300 000 characters (the
first read of a big log takes only its last 256 KB), so a tick costs the same on a 100 MB log."""
from __future__ import annotations

from typing import Any

import gradio as gr

from ui.context import Ctx

__all__ = ["build", "log_tick"]


def log_tick(ctx: Ctx, project_path: str | None, follow: bool, seen: int, cleared: int) -> tuple:
    """(text, log path, seen version): the text only when it changed and following is on."""
    view = ctx.supervisor.view(project_path)
    if view is None:
        return "", "No project open", seen
    snap = view.snapshot()
    path = f"`{view.project.pipeline_log}`"
    if not follow or snap["log_version"] == seen:
        return gr.skip(), path, seen
    text = snap["log_text"]
    if cleared:                       # only what was appended after "Clear view"
        fresh = snap["log_total"] - cleared
        text = text[-fresh:] if 0 < fresh <= len(text) else ("" if fresh <= 0 else text)
    return text, path, snap["log_version"]


def build(ctx: Ctx, project_state: gr.State, timer: gr.Timer) -> dict[str, Any]:
    path = gr.Markdown("No project open", elem_id="log-path")
    with gr.Row():
        follow = gr.Checkbox(label="follow", value=True, elem_id="log-follow")
        clear = gr.Button("Clear view", elem_id="log-clear")
    text = gr.Textbox(lines=28, max_lines=28, autoscroll=True, show_label=False, elem_id="log-text")
    seen = gr.State(-1)
    cleared = gr.State(0)
    timer.tick(lambda p, f, s, c: log_tick(ctx, p, f, s, c), [project_state, follow, seen, cleared],
               [text, path, seen], queue=False, show_progress="hidden", api_name="log_tick")

    def clear_view(project_path: str | None) -> tuple:
        view = ctx.supervisor.view(project_path)
        return "", (view.snapshot()["log_total"] if view else 0)
    clear.click(clear_view, [project_state], [text, cleared], api_name=False)
    return {"text": text}
