"""Logs: the pipeline log, following. The Supervisor keeps the last 300 000 characters (the
first read of a big log takes only its last 256 KB), so a tick costs the same on a 100 MB log.

Progress bars (tqdm: `\\r` updates, "Loading weights:  45%|████▌ | 9/20 [00:01<00:02, ...]") show
only their last state (`collapse_progress`). "follow" keeps the newest line in view until the user
scrolls up (scrolling back to the bottom, or ticking follow again, resumes it): a small script,
run on each change of the text and when the tab mounts, scrolls the text area — Gradio's own
`autoscroll` did not follow updates that came from the timer."""
from __future__ import annotations

import re
from typing import Any

import gradio as gr

from ui.context import Ctx

__all__ = ["build", "log_tick", "collapse_progress", "bar_key"]

# the right part of a tqdm bar: "[00:01<00:02, 5.20it/s]", "[00:00, ?it/s, loss=0.5]", "[01:02, 1.5s/it]"
_ELAPSED = re.compile(r"\[\d+:\d\d(?::\d\d)?(?:<[^,\]]*)?, *(?:\?|[\d.]+) ?[A-Za-z]*/[A-Za-z]+[^\]]*\]\s*$")
_BAR = re.compile(r"(?P<prefix>.*?)\s*(?:\d{1,3}%\|[^|]*\|\s*\S+/\S+|(?<![^\s:])[\d.]+[kMGTPEZY]?[A-Za-z]*)\s*"
                  + _ELAPSED.pattern)


def bar_key(line: str) -> str | None:
    """The bar a tqdm-style progress line belongs to (its description, "" for an unnamed one), or
    None for any other line."""
    if "[" not in line or not _ELAPSED.search(line):
        return None
    m = _BAR.fullmatch(line.strip())
    return None if m is None else m["prefix"].rstrip(" :")


def collapse_progress(text: str) -> str:
    """The log as a terminal would leave it: of `\\r`-separated updates in one line only the last
    is kept, and a run of consecutive lines of the same progress bar collapses to its last line."""
    out: list[str] = []
    previous: str | None = None              # the bar on out[-1], if it is one
    for line in text.replace("\r\n", "\n").split("\n"):
        if "\r" in line:
            parts = [part for part in line.split("\r") if part.strip()]
            line = parts[-1] if parts else ""
        key = bar_key(line)
        if key is not None:
            line = line.rstrip()
            if key == previous:
                out[-1] = line
                continue
        out.append(line)
        previous = key
    return "\n".join(out)


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
    return collapse_progress(text), path, snap["log_version"]


# One controller per page (window.gtLogFollow). A text area is "pinned" while its user has not
# scrolled up from the bottom; a pinned one is scrolled to the bottom when its text changes, when
# it is shown again (ResizeObserver: a hidden tab has no size) and when follow is ticked.
_FOLLOW_JS = """
window.gtLogFollow = window.gtLogFollow || (() => {
  const area = () => document.querySelector('#log-text textarea');
  const following = () => { const c = document.querySelector('#log-follow input'); return !c || c.checked; };
  const atBottom = (t) => t.scrollTop + t.clientHeight >= t.scrollHeight - 8;
  const stick = (t) => { if (t.gtPinned && following()) t.scrollTop = t.scrollHeight; };
  function attach(t) {
    if (t.gtFollow) return;
    t.gtFollow = true;
    t.gtPinned = true;
    t.addEventListener('scroll', () => { if (t.clientHeight > 0) t.gtPinned = atBottom(t); });
    new ResizeObserver(() => stick(t)).observe(t);
  }
  function update(repin) {
    const t = area();
    if (!t) return;
    attach(t);
    if (repin) t.gtPinned = true;
    stick(t);
    requestAnimationFrame(() => stick(t));      // after Gradio has written and sized the new text
  }
  return {update};
})();
"""


def build(ctx: Ctx, project_state: gr.State, timer: gr.Timer) -> dict[str, Any]:
    path = gr.Markdown("No project open", elem_id="log-path")
    with gr.Row():
        follow = gr.Checkbox(label="follow", value=True, elem_id="log-follow")
        clear = gr.Button("Clear view", elem_id="log-clear")
    text = gr.Textbox(lines=28, max_lines=28, autoscroll=False, show_label=False, elem_id="log-text")
    # runs when the tab mounts: the text area starts at its newest line
    gr.HTML("", elem_id="log-follow-js", container=False, padding=False,
            js_on_load=_FOLLOW_JS + "setTimeout(() => window.gtLogFollow.update(true), 0);")
    seen = gr.State(-1)
    cleared = gr.State(0)
    timer.tick(lambda p, f, s, c: log_tick(ctx, p, f, s, c), [project_state, follow, seen, cleared],
               [text, path, seen], queue=False, show_progress="hidden", api_name="log_tick")
    text.change(None, None, None, js="() => {" + _FOLLOW_JS + "window.gtLogFollow.update(false); return []; }",
                api_name=False, queue=False, show_progress="hidden")
    follow.change(None, [follow], None, api_name=False, queue=False, show_progress="hidden",
                  js="(on) => {" + _FOLLOW_JS + "if (on) window.gtLogFollow.update(true); return []; }")

    def clear_view(project_path: str | None) -> tuple:
        view = ctx.supervisor.view(project_path)
        return "", (view.snapshot()["log_total"] if view else 0)
    clear.click(clear_view, [project_state], [text, cleared], api_name=False)
    return {"text": text}
