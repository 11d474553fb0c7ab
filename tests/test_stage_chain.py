"""Stage chains (stages/base.py run_chain, the driver's _chain): corpus → precompute_val →
precompute_train run in one stage process with the models loaded once, train → export → eval in
another; every stage keeps its own entry, events and outcome, and a stage that is not to do (or a
stop) ends the chain where the driver carries on as before."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import demo_cache
from conftest import cli
from trainer_core.base.events import EventTailer, ListReport
from trainer_core.project import Project
from trainer_core.stages import base as stage_base

SHORT = ("train.steps=20", "train.val_every=10", "train.save_every=10", "train.log_every=5")


def _stage_events(root: Path, stage: str) -> list[dict]:
    return [e for e in EventTailer(root / "events.jsonl").read() if e["stage"] == stage]


def _running_pids(root: Path, stage: str) -> list[int]:
    """The pids of the driver's "running" events for `stage` (a stage's own status events carry none)."""
    return [e["payload"]["pid"] for e in _stage_events(root, stage)
            if e["type"] == "status" and e["payload"].get("status") == "running" and "pid" in e["payload"]]


def _demo(where: Path, settings: tuple[str, ...] = SHORT) -> Path:
    """A copy of the session's built PixArt demo (tests/demo_cache.py) under `where`, `settings` applied."""
    root = demo_cache.copy_built("t5xxl_pixart", where)
    if settings:
        Project.open(root).update_settings(list(settings))
    return root


def test_the_precompute_splits_run_in_the_corpus_process_and_load_the_models_once(tmp_path):
    root = _demo(tmp_path, ())
    r = cli("run", "--project", str(root), "--only", "corpus", "precompute_val", "precompute_train", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    state = json.loads((root / "state.json").read_text())
    corpus, val, train = (state["stages"][s] for s in ("corpus", "precompute_val", "precompute_train"))
    assert all(e["status"] == "done" and not e.get("skipped") for e in (corpus, val, train))
    assert corpus["finished"] <= val["started"] and val["finished"] <= train["started"]
    pids = [_running_pids(root, s) for s in ("corpus", "precompute_val", "precompute_train")]
    assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 1
    # the models were loaded once: one "student:" line, in the val stage
    loads = [e for stage in ("precompute_val", "precompute_train") for e in _stage_events(root, stage)
             if e["type"] == "log" and str(e["payload"].get("message", "")).startswith("student:")]
    assert len(loads) == 1 and loads[0]["stage"] == "precompute_val"
    train_shards = [e for e in _stage_events(root, "precompute_train") if e["type"] == "artifact"]
    assert len(train_shards) == 3 and all(e["payload"]["kind"] == "shard_train" for e in train_shards)
    assert "in the same process" in (root / "pipeline.log").read_text()


def test_only_the_val_split_runs_alone(tmp_path):
    root = _demo(tmp_path, ())
    r = cli("run", "--project", str(root), "--only", "corpus", "precompute_val", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    state = json.loads((root / "state.json").read_text())
    assert state["stages"]["precompute_val"]["status"] == "done" and "precompute_train" not in state["stages"]
    assert not list((root / "shards").glob("train/*.safetensors"))
    # then the train split in its own process, loading the models itself
    r = cli("run", "--project", str(root), "--only", "precompute_train", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    loads = [e for e in _stage_events(root, "precompute_train")
             if e["type"] == "log" and str(e["payload"].get("message", "")).startswith("student:")]
    assert len(loads) == 1


def test_train_export_and_eval_share_a_process_and_the_teacher_process_ends_first(tmp_path):
    root = _demo(tmp_path)
    r = cli("run", "--project", str(root), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    state = json.loads((root / "state.json").read_text())
    assert all(state["stages"][s]["status"] == "done" and not state["stages"][s].get("skipped")
               for s in ("train", "export", "eval")), state["stages"]
    pids = {s: _running_pids(root, s) for s in ("precompute_train", "train", "export", "eval")}
    assert pids["train"] == pids["export"] == pids["eval"] and len(pids["train"]) == 1
    assert pids["precompute_train"] != pids["train"]          # the teacher's process is gone before training
    assert json.loads((root / "eval.json").read_text())["roundtrip_cos"] >= 0.999
    # each stage's own events stay under its own name: the GGUF under export, eval.json under eval
    kinds = {s: {e["payload"].get("kind") for e in _stage_events(root, s) if e["type"] == "artifact"}
             for s in ("export", "eval")}
    assert "gguf" in kinds["export"] and "eval" in kinds["eval"], kinds

    # a forced re-export re-runs both in one process; nothing else runs
    r = cli("run", "--project", str(root), "--only", "export", "eval", "--force", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    pids = {s: _running_pids(root, s) for s in ("train", "export", "eval")}
    assert len(pids["export"]) == len(pids["eval"]) == 2 and pids["export"][1] == pids["eval"][1]
    assert len(pids["train"]) == 1

    # a stop that reaches the evaluation between two batches ends it "stopped", eval.json untouched
    from trainer_core.stages import evaluate
    before = (root / "eval.json").read_bytes()
    asked = []
    report = ListReport()
    assert evaluate.run(Project.open(root), report, should_stop=lambda: bool(asked.append(1)) or len(asked) > 1) \
        == "stopped"
    assert len(asked) == 2 and (root / "eval.json").read_bytes() == before
    assert any("evaluation stopped" in str(e) for e in report.events)


def test_eval_turned_off_ends_the_chain_at_export(tmp_path):
    root = _demo(tmp_path, SHORT + ("export.run_eval=false",))
    r = cli("run", "--project", str(root), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    state = json.loads((root / "state.json").read_text())
    assert state["stages"]["export"]["status"] == "done"
    assert state["stages"]["eval"]["status"] == "skipped" and not (root / "eval.json").exists()
    assert not _running_pids(root, "eval")


# ---------------------------------------------------------------- run_chain itself, on fake stages

class _Stages:
    """Fake run() functions for export and eval, and a stage_wanted that answers from a set."""

    def __init__(self, monkeypatch, wanted: set[str], outcomes: dict[str, str] | None = None):
        import trainer_core.stages as stages
        import trainer_core.stages.evaluate as evaluate
        import trainer_core.stages.export as export
        self.calls: list[tuple[str, dict | None]] = []
        self.outcomes = outcomes or {}
        monkeypatch.setattr(stages, "stage_wanted", lambda project, name, forced=False: name in wanted)
        monkeypatch.setattr(export, "run", self._fake("export", takes_shared=True))
        monkeypatch.setattr(evaluate, "run", self._fake("eval", takes_shared=False))

    def _fake(self, name: str, takes_shared: bool):
        if takes_shared:
            def run(project, report, should_stop, shared=None):
                self.calls.append((name, shared))
                return self.outcomes.get(name, "done")
        else:
            def run(project, report, should_stop):
                self.calls.append((name, None))
                return self.outcomes.get(name, "done")
        return run

    def first(self, name: str = "train"):
        def run(project, report, should_stop, shared=None):
            shared["mark"] = name
            self.calls.append((name, shared))
            return self.outcomes.get(name, "done")
        return run


def _chain(stages: _Stages, stop=lambda: False, then=("export", "eval")) -> tuple[str, ListReport]:
    report = ListReport()
    outcome = stage_base.run_chain("trainer_core.stages.train", stages.first(), object(), report, stop,
                                   {}, list(then))
    return outcome, report


def test_run_chain_hands_over_in_order_and_shares_one_dict(monkeypatch):
    stages = _Stages(monkeypatch, {"export", "eval"})
    outcome, report = _chain(stages)
    assert outcome == "done"
    assert [c[0] for c in stages.calls] == ["train", "export", "eval"]
    assert stages.calls[1][1] is stages.calls[0][1] and stages.calls[1][1]["mark"] == "train"
    assert [p.get("handoff") for p in report.of_type("status")] == ["export", "eval"]


@pytest.mark.parametrize("wanted, ran", [({"eval"}, ["train"]), ({"export"}, ["train", "export"]), (set(), ["train"])])
def test_run_chain_ends_at_the_first_stage_not_to_do(monkeypatch, wanted, ran):
    stages = _Stages(monkeypatch, wanted)
    outcome, report = _chain(stages)
    assert outcome == "done" and [c[0] for c in stages.calls] == ran
    assert len(report.of_type("status")) == len(ran) - 1


def test_run_chain_ends_at_a_stop_or_an_outcome_other_than_done(monkeypatch):
    stages = _Stages(monkeypatch, {"export", "eval"})
    outcome, report = _chain(stages, stop=lambda: True)
    assert outcome == "done" and [c[0] for c in stages.calls] == ["train"] and not report.of_type("status")

    stages = _Stages(monkeypatch, {"export", "eval"}, outcomes={"train": "stopped"})
    outcome, report = _chain(stages)
    assert outcome == "stopped" and [c[0] for c in stages.calls] == ["train"]


@pytest.mark.parametrize("outcome, code", [("done", stage_base.EXIT_DONE), ("stopped", stage_base.EXIT_STOPPED)])
def test_a_stage_process_says_its_work_is_done_before_it_exits(tmp_path, capsys, outcome, code):
    """The driver ends the last stage of a process at this event (pipeline._run_stage), not at the
    exit, so the kernel's teardown of the process is not counted in the stage's span; a stop sends none."""
    import signal
    root = tmp_path / "t5_adapter"
    assert cli("new", "--project", str(root), "--pack", "t5xxl_pixart").returncode == 0
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert stage_base.stage_main("corpus", lambda project, report, should_stop: outcome,
                                     ["--project", str(root)]) == code
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    marks = [e for e in events if e["type"] == "status" and e["payload"].get(stage_base.WORK_DONE)]
    if outcome == "done":
        assert marks == [events[-1]] and marks[0]["payload"]["status"] == "done"
    else:
        assert marks == []


_FAKE_STAGE = """
import json, os, sys, time
print(json.dumps({"time": time.time(), "type": "log", "payload": {"level": "info", "message": "working"}}), flush=True)
print(json.dumps({"time": 1000.0, "type": "status", "payload": {"status": "done", "work_done": True}}), flush=True)
os._exit(int(os.environ.get("FAKE_STAGE_EXIT", "0")))
"""


@pytest.mark.parametrize("exit_code, status", [(0, "done"), (1, "failed")])
def test_the_driver_ends_a_process_s_last_stage_at_its_work_done_event(tmp_path, monkeypatch, exit_code, status):
    """A stage process's work_done stamp (here a fixed 1000.0) is the stage's finished time when it
    exits with EXIT_DONE; the exit code still decides the outcome, and a failure ends at the exit."""
    import trainer_core.pipeline as pipeline
    from trainer_core.project import Project
    from trainer_core.stages import StageSpec
    root = tmp_path / "t5_adapter"
    assert cli("new", "--project", str(root), "--pack", "t5xxl_pixart").returncode == 0
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fake_stage_mod.py").write_text(_FAKE_STAGE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))
    monkeypatch.setenv("FAKE_STAGE_EXIT", str(exit_code))
    monkeypatch.setattr(pipeline, "STAGES", (StageSpec("corpus", "Corpus", "fake_stage_mod"),))
    project = Project.open(root)
    assert pipeline.run_pipeline(project, only=["corpus"]) == (0 if status == "done" else 1)
    entry = json.loads((root / "state.json").read_text())["stages"]["corpus"]
    assert entry["status"] == status
    if status == "done":
        assert entry["finished"] == 1000.0
    else:
        assert entry["finished"] > entry["started"] > 1000.0
    events = _stage_events(root, "corpus")
    assert not any(e["payload"].get(stage_base.WORK_DONE) for e in events)      # not passed on as an event
    assert any(e["payload"].get("message") == "working" for e in events)
