"""A project's status from its files (trainer_core/status.py, stages.stage_done): an export or evaluation of a
shorter training than the one planned is stale, with why; a train stage that is not running shows the
checkpoint's step of the saved count. The files are written by hand (no training): each test is cheap."""
from __future__ import annotations

import json
import os

from trainer_core.base.atomic import atomic_write_json
from trainer_core.contract import checkpoints
from trainer_core.project import Project
from trainer_core.stages import STAGE_NAMES, stage_done, stage_wanted
from trainer_core.status import status_report

PACK = "t5xxl_pixart"


def _touch(path, at: float, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (at, at))


def _checkpoint(project: Project, which: str, step: int, planned: int, at: float) -> None:
    weights = checkpoints.weights_path(project, which)
    _touch(weights, at)
    atomic_write_json(weights.with_suffix(".json"), {"step": step, "planned_steps": planned})


def _finished(tmp_path, steps: int = 300) -> Project:
    """A project whose run finished at `steps`: last and best at that step, the GGUF newer than best.pt, the
    evaluation newer than the GGUF, every stage recorded done in state.json (corpus and shards are absent: those
    stages are not what these tests look at)."""
    project = Project.create(tmp_path / "p", PACK)
    project.update_settings([f"train.steps={steps}"])
    _checkpoint(project, checkpoints.LAST, steps, steps, 1000.0)
    _checkpoint(project, checkpoints.BEST, steps, steps, 1000.0)
    _touch(project.gguf_path(), 1100.0)
    _touch(project.eval_json, 1200.0, json.dumps({"trained_steps": steps, "cos": 0.9}))
    state = project.read_state()
    state.update(status="done", stages={name: {"status": "done"} for name in STAGE_NAMES})
    project.write_state(state)
    return Project.open(project.root)


def _stages(project: Project) -> dict[str, dict]:
    return {s["name"]: s for s in status_report(Project.open(project.root))["stages"]}


def test_a_finished_run_extended_shows_its_export_and_evaluation_stale_with_why(tmp_path):
    project = _finished(tmp_path, 300)
    assert all(stage_done(project, name) for name in ("train", "export", "eval"))
    shown = _stages(project)
    assert [shown[n]["status"] for n in ("train", "export", "eval")] == ["done", "done", "done"]

    project.update_settings(["train.steps=500"])
    project = Project.open(project.root)
    # the GGUF is still best.pt's export, but of a training with 200 steps to go: not done, so a run redoes it
    assert not any(stage_done(project, name) for name in ("train", "export", "eval"))
    assert all(stage_wanted(project, name) for name in ("train", "export", "eval"))
    shown = _stages(project)
    assert shown["export"]["status"] == "stale" and shown["export"]["done"] is False
    assert shown["eval"]["status"] == "stale" and shown["eval"]["done"] is False
    assert shown["export"]["detail"] == "from step 300; training goes on to 500"
    assert shown["eval"]["detail"] == "from step 300; training goes on to 500"
    assert "count" not in shown["export"] and "total" not in shown["eval"]
    # state.json without a record of them (a reset state, a copied project): the files on disk say it all the same
    state = project.read_state()
    state["stages"] = {}
    project.write_state(state)
    shown = _stages(project)
    assert [(shown[n]["status"], shown[n]["detail"]) for n in ("export", "eval")] == \
        [("stale", "from step 300; training goes on to 500")] * 2
    assert shown["train"]["status"] == "-"

    # the count lowered back: the same files are current again
    project.update_settings(["train.steps=300"])
    shown = _stages(project)
    assert [shown[n]["status"] for n in ("train", "export", "eval")] == ["done", "done", "done"]


def test_an_export_of_a_partial_training_is_stale_and_a_run_exports_again(tmp_path):
    """`run --only export` of a stopped training (step 93 of 300) exports best.pt as it is; it is never "done"
    while training has steps to go, so asking again exports again, and status says which step it is of."""
    project = _finished(tmp_path, 300)
    _checkpoint(project, checkpoints.LAST, 93, 300, 1000.0)
    _checkpoint(project, checkpoints.BEST, 90, 300, 1000.0)
    project.eval_json.unlink()
    state = project.read_state()
    state["stages"] = {"train": {"status": "stopped"}, "export": {"status": "done"}}
    project.write_state(state)
    assert not stage_done(project, "export") and stage_wanted(project, "export")
    shown = _stages(project)
    # no eval.json to name its step: the GGUF, newer than best.pt, is best.pt's export (step 90)
    assert shown["export"]["status"] == "stale" and shown["export"]["detail"] == "from step 90; training goes on to 300"
    # best.pt rewritten after the export: older than it, its step not known without reading the GGUF
    _checkpoint(project, checkpoints.BEST, 92, 300, 1300.0)
    assert _stages(project)["export"]["detail"] == "from an earlier checkpoint; training goes on to 300"


def test_a_finished_training_whose_best_checkpoint_is_newer_than_the_export(tmp_path):
    project = _finished(tmp_path, 300)
    _checkpoint(project, checkpoints.BEST, 300, 300, 1150.0)       # re-saved after the export
    assert stage_done(project, "train") and not stage_done(project, "export")
    shown = _stages(project)
    assert shown["export"]["status"] == "stale"
    assert shown["export"]["detail"] == "older than the best checkpoint (step 300)"
    assert shown["eval"]["status"] == "stale"


def test_a_stopped_train_stage_shows_the_checkpoints_step_of_the_saved_count(tmp_path):
    """Stopped at 93 with 200 planned (its last log said 90 of 200), then 300 applied: the stage says 93 of 300,
    as the metrics and the steps note do (issue 56 item 4), with no time left to run."""
    project = _finished(tmp_path, 200)
    _checkpoint(project, checkpoints.LAST, 93, 200, 1000.0)
    state = project.read_state()
    state.update(status="stopped", stages={"train": {"status": "stopped", "count": 90, "total": 200, "unit": "steps",
                                                     "step": 90, "planned_steps": 200, "eta_s": 50.0}})
    project.write_state(state)
    project.update_settings(["train.steps=300"])
    train = _stages(project)["train"]
    assert (train["status"], train["count"], train["total"], train["step"], train["planned_steps"]) == \
        ("stopped", 93, 300, 93, 300)
    assert "eta_s" not in train
