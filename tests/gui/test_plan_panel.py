"""Issue 20: the Plan panel on the Setup tab and the plan in the Start confirmation."""
from __future__ import annotations

from trainer_core.plan import advice, make_plan
from trainer_core.project import Project
from ui import plan_panel, setup_tab


def test_the_plan_panel_shows_every_stage_and_asks_for_a_calibration(ctx):
    out = setup_tab.create_project(ctx, "mine", "t5xxl_pixart", str(ctx.projects_root))
    panel = out[-3]
    assert "Shards on disk" in panel and "**Plan** — press **Calibrate**" in panel
    project = Project.open(out[0])
    plan = make_plan(project)
    for stage, st in plan["stages"].items():               # before a calibration: rough times, said so
        assert f"| {stage} | {plan_panel._seconds(st['seconds'])} |" in panel
    assert "Source: rough estimate" in panel
    assert f"**{plan_panel.fmt_size(plan['total_disk_bytes'])}**" in panel


def test_a_plan_warning_holds_the_start_until_start_anyway(ctx, monkeypatch):
    out = setup_tab.create_project(ctx, "mine", "t5xxl_pixart", str(ctx.projects_root))
    project = Project.open(out[0])
    project.update_settings(["precompute.mock_teacher=true"])
    monkeypatch.setattr(setup_tab, "launch_problems", lambda project: [])   # the materials are there: the plan speaks
    monkeypatch.setattr(advice, "free_bytes", lambda path: 1 << 20)
    message, anyway = setup_tab.start_run(ctx, out[0])
    assert "The plan warns:" in message and "• Not enough disk" in message and "Start anyway" in message
    assert anyway["visible"] is True
    # each warning an item of its own list, apart from the placement and the source (not one run-on paragraph)
    panel = plan_panel.plan_markdown(project)
    assert "\n\n- ⚠ Not enough disk" in panel
    items = [line for line in panel.splitlines() if line.startswith("- ⚠ ")]
    assert len(items) == len(make_plan(project)["warnings"])
    assert "\n\nSource: " in panel and "\n\nPlacement: " in panel


def test_calibration_is_refused_without_a_project(ctx):
    message, panel = plan_panel.run_calibration(None)
    assert "Open or create a project first" in message and panel == ""
