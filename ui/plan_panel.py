"""The Setup tab's Plan panel: what a run will take (trainer_core/plan/), refreshed with the
settings, measured on this machine by its Calibrate button, and repeated in the Start confirmation."""
from __future__ import annotations

from typing import Any

from trainer_core.base.errors import TrainerError
from trainer_core.plan import calibrate, make_plan
from trainer_core.project import Project
from trainer_core.runner import runtime_status
from ui.common import banner, fmt_size

__all__ = ["plan_markdown", "plan_summary", "run_calibration"]


def _seconds(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v / 3600:.1f} h" if v >= 3600 else f"{v / 60:.1f} min" if v >= 120 else f"{v:.0f} s"


def plan_markdown(project: Project, plan: dict[str, Any] | None = None) -> str:
    """The plan as a table (stage, time, disk, peak RAM, peak VRAM), its placement, source and warnings."""
    try:
        plan = plan or make_plan(project)
    except TrainerError as e:
        return f"**Plan**: not available ({e})"
    rows = ["| stage | time | disk | peak RAM | peak VRAM |", "|---|---|---|---|---|"]
    for name, st in plan["stages"].items():
        rows.append(f"| {name} | {_seconds(st['seconds'])} | {fmt_size(st['disk_bytes'])} | "
                    f"{fmt_size(st['peak_ram_bytes']) if st['peak_ram_bytes'] else '—'} | "
                    f"{fmt_size(st['peak_vram_bytes']) if st['peak_vram_bytes'] else '—'} |")
    rows.append(f"| **total** | **{_seconds(plan['total_seconds'])}** | **{fmt_size(plan['total_disk_bytes'])}** | "
                f"{fmt_size(plan['peak_ram_bytes']) if plan['peak_ram_bytes'] else '—'} | "
                f"{fmt_size(plan['peak_vram_bytes']) if plan['peak_vram_bytes'] else '—'} |")
    source = next(iter(plan["stages"].values()))["source"]
    how = "" if plan["calibrated"] else " — press **Calibrate** to measure this machine (a few minutes)"
    # paragraphs apart and the warnings a list (consecutive lines are one Markdown paragraph)
    lines = ["**Plan**" + how, "", *rows, "", f"Placement: {plan['placement']}.", "", f"Source: {source}."]
    lines += ["", *(f"- ⚠ {w}" for w in plan["warnings"])] if plan["warnings"] else []
    return "\n".join(lines)


def plan_summary(project: Project) -> tuple[str, list[str]]:
    """One line for the Start confirmation, and the plan's warnings."""
    try:
        plan = make_plan(project)
    except TrainerError:
        return "", []
    time_part = f"~{_seconds(plan['total_seconds'])}, " if plan["total_seconds"] is not None else ""
    return f"plan: {time_part}{fmt_size(plan['total_disk_bytes'])} on disk", plan["warnings"]


def run_calibration(project_path: str | None) -> tuple[str, str]:
    """(banner, plan panel) after measuring this machine on a scratch copy of the project."""
    if not project_path:
        return banner("Open or create a project first."), ""
    try:
        project = Project.open(project_path)
        if runtime_status(project)["status"] == "running":
            return banner("The project is running; calibrate before a run (it runs every stage on a scratch "
                          "copy and would slow the run down)."), plan_markdown(project)
        calibrate(project)
    except TrainerError as e:
        return banner(str(e)), ""
    return banner("Calibrated on this machine: the plan's times and memory are measured.", "ok"), \
        plan_markdown(project)
