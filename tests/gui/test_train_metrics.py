"""The Train tab's step and ETA agree with the checkpoints (issue 40 item 6): stopped, it shows the step a
resume starts from; for the seconds after Start before the trainer logs, it shows that step against the
new count and no ETA (not the earlier run's "200 / 200, ETA 0"); once the trainer logs, its own figures."""
from __future__ import annotations

import re

from ui.train_tab import hardware_html, metrics_html, steps_note


def cells(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-metric="([^"]+)">([^<]*)<', html))


def snap(status: str, *, point_time: float, started: float | None, stage: str | None = "train",
         ck_step: int = 213, planned: int = 400, point_step: int = 210, point_planned: int = 400,
         eta: float = 0.0) -> dict:
    stages = [{"name": "train", "status": "running" if status == "running" else status,
               **({"started": started} if started is not None else {})}]
    return {"last_train": {"step": point_step, "planned_steps": point_planned, "loss": 0.5, "eta_s": eta,
                           "time": point_time},
            "last_val": {"val_cos": 0.8},
            "report": {"status": status, "stage": stage, "planned_steps": planned, "stages": stages,
                       "checkpoints": {"last": {"step": ck_step}}}}


def test_a_stopped_run_shows_the_checkpoints_step_not_the_last_logged_one():
    shown = cells(metrics_html(snap("stopped", point_time=100.0, started=None, stage=None)))
    assert shown["step"] == "213 / 400" and "ETA" not in shown


def test_just_after_start_the_earlier_runs_point_is_not_shown_as_live():
    # the previous run ended at 200 / 200 with ETA 0; the count was raised to 400 and Start pressed at t=500
    before = snap("running", point_time=100.0, started=500.0, ck_step=200, point_step=200, point_planned=200)
    shown = cells(metrics_html(before))
    assert shown["step"] == "200 / 400" and shown["ETA"] == "–"


def test_once_the_trainer_logs_its_own_figures_are_shown():
    live = snap("running", point_time=600.0, started=500.0, ck_step=200, point_step=250, point_planned=400, eta=75.0)
    shown = cells(metrics_html(live))
    assert shown["step"] == "250 / 400" and shown["ETA"] != "–" and shown["ETA"] != "0 s"


def test_a_resumed_run_is_at_its_checkpoint_of_the_saved_count_in_the_note_and_the_metrics():
    """Issue 56 item 4: stopped at 93 with 200 planned (the last logged point: 90 of 200), 300 applied, resumed
    at t=500. The earlier run's point is not the live trainer's: no "trainer still on 200" note, and the metrics
    say 93 / 300 before the trainer reports and after."""
    resumed = snap("running", point_time=100.0, started=500.0, ck_step=93, planned=300, point_step=90,
                   point_planned=200)
    # the new driver runs but has not written state.json yet: the stage there is the stopped run's
    before = {**resumed, "report": {**resumed["report"], "stages": [
        {"name": "train", "status": "stopped", "started": 50.0, "step": 90, "count": 90, "planned_steps": 200}]}}
    assert steps_note(before) == "checkpoint at step 93 of 300" and cells(metrics_html(before))["step"] == "93 / 300"
    assert steps_note(resumed) == "" and cells(metrics_html(resumed))["step"] == "93 / 300"
    train = resumed["report"]["stages"][0]
    train.update(resumed_at=93, planned_steps=300)            # the trainer's first status event
    assert steps_note(resumed) == "" and cells(metrics_html(resumed))["step"] == "93 / 300"
    # 400 saved while this trainer, at step 95, is still on 300: that note is right
    train.update(step=95, count=95)
    resumed["report"]["planned_steps"] = 400
    assert steps_note(resumed) == "saved 400, trainer still on 300 at step 95 — it picks up the new count at its " \
                                  "next log interval"
    assert cells(metrics_html(resumed))["step"] == "95 / 300"


def test_the_pipeline_process_is_shown_only_while_the_run_goes_on():
    machine = {"cpu_threads": 2, "cpu_pct": 50.0, "ram_used_gib": 2.0, "ram_total_gib": 8.0, "gpus": []}
    process = {"pid": 4242, "cpu_pct": 65.5, "rss_gib": 0.35, "threads": 4}
    view = {**snap("running", point_time=100.0, started=90.0), "machine": machine, "process": process}
    assert "pipeline pid 4242" in hardware_html(view)
    view["report"] = {**view["report"], "status": "stopped"}        # its last reading, taken before the stop
    assert "pipeline pid" not in hardware_html(view) and "CPU 2 threads" in hardware_html(view)
