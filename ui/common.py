"""Formatting shared by the tabs: banners, durations, sizes, stage strip."""
from __future__ import annotations

import html
import math
import time
from typing import Any

__all__ = ["banner", "fmt_duration", "fmt_size", "fmt_num", "stage_strip_html", "STATUS_COLORS"]

STATUS_COLORS = {"running": "#2563eb", "done": "#16a34a", "failed": "#dc2626", "interrupted": "#d97706",
                 "stopped": "#6b7280", "idle": "#6b7280", "skipped": "#6b7280", "stale": "#d97706", "-": "#9ca3af"}


def banner(message: str | None, kind: str = "error", wait: str | None = None, pid: int | None = None) -> str:
    """An error (red) or notice (amber) line for a gr.HTML, escaped; "" hides it. `wait` marks the banner of an
    action that goes on after its answer ("run": a run started or asked to stop; "snapshot": the export job `pid`):
    the Train tab's tick replaces it by the outcome once that ends (ui/action_banner.py)."""
    if not message:
        return ""
    color = {"error": "#b91c1c", "notice": "#92400e", "ok": "#166534"}[kind]
    back = {"error": "#fee2e2", "notice": "#fef3c7", "ok": "#dcfce7"}[kind]
    at = math.floor(time.time() * 1000) / 1000   # rounded down: a report read after the action is never "before" it
    marks = (f' data-wait="{html.escape(wait)}" data-at="{at:.3f}"' if wait else "") + \
        (f' data-pid="{int(pid)}"' if pid else "")
    return (f'<div class="gt-banner gt-{kind}"{marks} style="padding:8px 12px;border-radius:6px;'
            f'background:{back};color:{color};white-space:pre-line">{html.escape(message)}</div>')


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "–"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def fmt_size(n: int | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def fmt_num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _stage_progress(stage: dict[str, Any], live: dict[str, Any] | None, status: str) -> str:
    """The card's progress line under its status (`status`: the one the card shows)."""
    if status == "done":                     # the card's status line says it: no second "done"
        return ""
    if live and live.get("ranks"):          # a stage run over several processes: each rank's count
        return " · ".join(f"rank {r} {p.get('count', 0)}/{p.get('total', '?')}"
                          for r, p in sorted(live["ranks"].items()))
    p = live or stage
    if p.get("total"):
        text = f"{p.get('count', 0)}/{p['total']} {p.get('unit', '')}".strip()
        if p.get("eta_s") is not None and status == "running":     # a stopped stage has no time left to run
            text += f" · ETA {fmt_duration(p['eta_s'])}"
        return text
    return str(p.get("detail") or "")


def stage_strip_html(report: dict[str, Any], progress: dict[str, dict[str, Any]]) -> str:
    """Six boxes, corpus → eval: title, status, progress and ETA. A running stage's progress is its own (the
    Supervisor drops a stage's progress when it starts again); a train stage that is not running shows the
    checkpoint's step of the saved count, and a stale export or evaluation why (status.status_report)."""
    boxes = []
    running = report.get("status") == "running"
    for stage in report.get("stages", []):
        status = stage["status"]
        if status == "running" and not running:
            status = "interrupted"
        color = STATUS_COLORS.get(status, "#6b7280")
        detail = _stage_progress(stage, progress.get(stage["name"]) if status == "running" else None, status)
        boxes.append(
            f'<div class="gt-stage" data-stage="{stage["name"]}" data-status="{status}" '
            f'style="flex:1;min-width:120px;border:2px solid {color};border-radius:8px;padding:6px 8px">'
            f'<div style="font-weight:600">{html.escape(stage["title"])}</div>'
            f'<div style="color:{color}">{html.escape(status)}</div>'
            f'<div style="font-size:0.85em">{html.escape(detail)}</div></div>')
    return f'<div class="gt-stages" style="display:flex;gap:6px;flex-wrap:wrap">{"".join(boxes)}</div>'
