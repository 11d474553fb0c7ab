"""The plan's two files in a project, named here only: `calibration.json` (a calibration's measurements, cached
under calibration.settings_key) and `plan.json` (the calibrated plan a run started under), and the one reader that
sets the latter beside what the run took (the status report's "planned vs actual")."""
from __future__ import annotations

import time
from typing import Any

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.project import Project
from trainer_core.stages import STAGES

__all__ = ["CALIBRATION_FILE", "PLAN_FILE", "save_planned", "planned_vs_actual"]

CALIBRATION_FILE = "calibration.json"
PLAN_FILE = "plan.json"


def save_planned(project: Project, plan: dict[str, Any]) -> None:
    """Keep the plan a run starts with (planned vs actual)."""
    atomic_write_json(project.root / PLAN_FILE, {**plan, "saved": time.time()})


def planned_vs_actual(project: Project) -> list[dict[str, Any]]:
    """Per stage: the planned seconds, disk and peak RAM of plan.json beside the seconds the last run
    took (state.json); [] when no run started under a calibrated plan."""
    plan = read_json(project.root / PLAN_FILE, None)
    if not isinstance(plan, dict):
        return []
    state = project.read_state().get("stages", {})
    rows = []
    for spec in STAGES:
        planned, entry = plan.get("stages", {}).get(spec.name, {}), state.get(spec.name, {})
        started, finished = entry.get("started"), entry.get("finished")
        rows.append({"stage": spec.name, "planned_seconds": planned.get("seconds"),
                     "actual_seconds": round(finished - started, 1) if started and finished else None,
                     "planned_disk_bytes": planned.get("disk_bytes"),
                     "planned_peak_ram_bytes": planned.get("peak_ram_bytes"), "status": entry.get("status")})
    return rows
